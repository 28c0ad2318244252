"""A search's compile answered inside clang: BC-Max's trajectories given by the plugin
(mlgo/ship/native/inline_plugin.cc, `TrajectoryRunner`) instead of through the channel.

Through the channel every decision is a round trip: clang writes its observation and waits
while this process reads it, evaluates the policy in numpy and answers. On C++ modules,
which ask hundreds of questions a compile, that made a search compile cost 1.35x (the
default's answers) to 1.7x (the policy's) a plain `clang -Oz -c` of the same module. The
plugin answers the same trajectory in clang (the policy compiled in, its group moves and
flips from a spec file) and writes the observations the channel would have sent to a file,
read once the compile is done: the same questions, answers and object as the channel's
compile (tests/test_plugin_compile.py compares the two), at the cost of clang's ML mode.

A trajectory the plugin cannot give (a sampled policy: its draws are numpy's; a policy
that reads the profile's inputs, which the plugin computes and the channel does not; a
problem without a plugin; no LLVM headers to build one) goes through the channel.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Protocol

from mlgo.corpus.compile import (
    DEFAULT_TIMEOUT_S,
    CompileError,
    measure_object,
    module_run,
    run_compiler,
)
from mlgo.corpus.format import Module
from mlgo.data import shipped_policy
from mlgo.errors import MlgoError
from mlgo.llvm.channel import last_line
from mlgo.llvm.log_format import LogFormatError, LogReader
from mlgo.llvm.replay import TRAJECTORY_ANSWERS, TRAJECTORY_ENV, TRAJECTORY_LOG
from mlgo.llvm.toolchain import ToolchainError, find_toolchain
from mlgo.problems import Problem
from mlgo.problems.policy import MLPPolicy
from mlgo.problems.policy_files import load_policy
from mlgo.problems.profile_inputs import reads_profile
from mlgo.records import ModuleRun
from mlgo.runtime.lifetime import dying_with_parent
from mlgo.runtime.trust import private_temp_dir
from mlgo.ship.aot import AotError
from mlgo.ship.plugin import inliner_plugin


class Answerer(Protocol):
    """What of a trajectory (BC-Max's `Answerer`) the plugin is told: the base's answers
    (the compiler's own, or POLICY's greedy ones), set per group, then flipped at indices."""

    problem: Problem
    policy: MLPPolicy | None
    flips: frozenset[int]
    groups: frozenset[tuple[tuple[int, ...], int]]


_plugins: dict[tuple[str, str], Path | None] = {}  # (clang, the policy's fingerprint): built


def answers_in_plugin(problem: Problem, policy: MLPPolicy | None) -> bool:
    """Whether the plugin can give the answers of a trajectory over POLICY's (None: the
    compiler's own): its greedy argmax, read from LLVM's features alone."""
    if not problem.plugin:
        return False
    if policy is None:
        return True
    return (
        policy.temperature <= 0
        and not reads_profile(policy.normalizer.features)
        and policy.weights[-1].shape == (2,)
    )


def search_plugin(problem: Problem, policy: MLPPolicy | None, clang: str) -> Path | None:
    """The plugin that answers a search over POLICY (its network without the departure
    gate: the Answerer takes the argmax; with none, the shipped policy's, whose network a
    trajectory of the compiler's own answers does not use); built once a process, None
    where it cannot be (then the search compiles through the channel)."""
    if not answers_in_plugin(problem, policy):
        return None
    network = policy if policy is not None else _shipped_network(problem.name)
    if network is None:
        return None
    network = replace(network, departure_threshold=None, temperature=0.0)
    key = (clang, network.fingerprint())
    if key not in _plugins:
        try:
            _plugins[key] = inliner_plugin(network, find_toolchain(clang))
        except (AotError, ToolchainError):
            _plugins[key] = None
    return _plugins[key]


@cache
def _shipped_network(problem: str) -> MLPPolicy | None:
    """PROBLEM's shipped policy, read once a process; None where it ships none."""
    try:
        return load_policy(shipped_policy(problem))
    except MlgoError:
        return None


def spec_text(answerer: Answerer) -> str:
    """ANSWERER as the plugin's trajectory spec (`TrajectoryRunner::parse`)."""
    problem = answerer.problem
    lines = [f"base {'default' if answerer.policy is None else 'policy'}"]
    lines += [f"group-feature {f}" for f in problem.group_features if answerer.groups]
    lines += [f"group {' '.join(map(str, g))} {a}" for g, a in sorted(answerer.groups)]
    lines += [f"flip {i}" for i in sorted(answerer.flips)]
    return "\n".join(lines) + "\n"


def compile_in_plugin(
    module: Module,
    clang: str,
    answerer: Answerer,
    plugin: Path,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> ModuleRun:
    """MODULE compiled with ANSWERER's trajectory given inside clang by PLUGIN: the
    ModuleRun `compile_module` would record through the channel."""
    problem = answerer.problem
    base = answerer.policy.base_flags if answerer.policy is not None else []
    with tempfile.TemporaryDirectory(prefix="mlgo-t-", dir=private_temp_dir()) as d:
        work = Path(d)
        spec = work / "trajectory"
        spec.write_text(spec_text(answerer))
        extra = [*problem.measure_flags(work), *base, f"-fpass-plugin={plugin}"]
        cmd = module.compile_command(clang, work / "out.o", problem.opt_level, extra)
        argv, preexec = dying_with_parent([*cmd, *problem.advisor_flags])
        start = time.monotonic()
        env = {**os.environ, TRAJECTORY_ENV: str(spec)}
        stderr = run_compiler(module, argv, timeout_s, env, preexec)
        seconds = time.monotonic() - start
        log, given = work / TRAJECTORY_LOG, work / TRAJECTORY_ANSWERS
        if not given.is_file():
            raise CompileError(
                f"{module.name}: the plugin did not answer the trajectory ({last_line(stderr)})"
            )
        metrics = measure_object(problem.measure, module, work / "out.o", work)
        try:
            with log.open("rb") as f:
                reader = LogReader(f)
                observations = list(reader.observations())
        except (OSError, LogFormatError) as e:
            raise CompileError(f"{module.name}: the plugin's observations: {e}") from e
        answers = given.read_bytes()
        if len(answers) != len(observations):
            raise CompileError(
                f"{module.name}: the plugin answered {len(answers)} of "
                f"{len(observations)} decisions"
            )
    advice = [a - ord("0") for a in answers]
    return module_run(problem, module.name, seconds, metrics, reader.header, observations, advice)
