"""Compiling one corpus module, through a problem's channel or plainly, and measuring it."""

from __future__ import annotations

import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

import numpy as np

from mlgo.corpus.format import Module
from mlgo.errors import MlgoError
from mlgo.llvm.channel import ChannelError, Policy, compile_interactive, last_line
from mlgo.llvm.log_format import Header, Observation, stack_features
from mlgo.problems import Problem
from mlgo.problems.policy import MLPPolicy
from mlgo.records import ModuleRun

DEFAULT_TIMEOUT_S = 600.0
T = TypeVar("T")


class CompileError(MlgoError):
    """A module failed to compile; the message starts with the module's name."""


def measure_object(
    measure: Callable[[Path, Path, Mapping[str, int]], T], module: Module, obj: Path, workdir: Path
) -> T:
    """MEASURE of MODULE's object OBJ, a failure as a CompileError naming the module."""
    try:
        return measure(obj, workdir, module.copies)
    except (OSError, ValueError) as e:
        raise CompileError(f"{module.name}: cannot measure the object ({e})") from e


def compile_module(
    problem: Problem,
    module: Module,
    clang: str,
    policy: Policy | None = None,
    keep_object: Path | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> ModuleRun:
    """Compiles `module` answering every decision with `policy` (default: the compiler's own;
    a policy with a base, with its base).

    Records each decision's features, the answer given and the default answer.
    """
    base = policy.base_flags if isinstance(policy, MLPPolicy) else []
    policy = policy or problem.default_advice
    with tempfile.TemporaryDirectory(prefix="mlgo-c-") as d:
        work = Path(d)
        obj = keep_object or work / "out.o"
        extra = [*problem.measure_flags(work), *base]
        cmd = module.compile_command(clang, obj, problem.opt_level, extra)
        try:
            session = compile_interactive(
                cmd, policy, problem.channel_flags, timeout_s, problem.validate
            )
        except ChannelError as e:
            raise CompileError(f"{module.name}: {e}") from e
        metrics = measure_object(problem.measure, module, obj, work)
    return module_run(
        problem,
        module.name,
        session.seconds,
        metrics,
        session.header,
        [dec.observation for dec in session.decisions],
        [int(dec.advice[0]) for dec in session.decisions],
    )


def module_run(
    problem: Problem,
    name: str,
    seconds: float,
    metrics: dict[str, float],
    header: Header | None,
    observations: Sequence[Observation],
    advice: Sequence[int],
) -> ModuleRun:
    """One compile's record: each decision's features, the answer given (ADVICE) and the
    compiler's own, however the answers reached the compiler."""
    run = ModuleRun(name, seconds=seconds, metrics=metrics)
    if header is None or not observations:
        return run
    run.specs = header.features
    run.contexts = [obs.context for obs in observations]
    run.features = stack_features(run.specs, [obs.features for obs in observations])
    run.advice = np.array(advice, np.int64)
    run.default = np.array([problem.default_advice(obs) for obs in observations], np.int64)
    return run


def compile_object(
    module: Module,
    clang: str,
    obj: Path,
    opt_level: str,
    flags: list[str] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> None:
    """Compiles `module` at `opt_level` with clang's built-in heuristics, no channel."""
    run_compiler(module, module.compile_command(clang, obj, opt_level, flags or []), timeout_s)


def run_compiler(
    module: Module,
    argv: list[str],
    timeout_s: float,
    env: Mapping[str, str] | None = None,
    preexec: Callable[[], None] | None = None,
) -> str:
    """Runs the compiler ARGV on MODULE: its stderr, or a CompileError naming the module
    that says why it timed out or failed."""
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
            env=env,
            preexec_fn=preexec,
        )
    except subprocess.TimeoutExpired as e:
        raise CompileError(f"{module.name}: compiler timed out after {timeout_s:g} s") from e
    if proc.returncode != 0:
        raise CompileError(
            f"{module.name}: compiler exited with {proc.returncode}: {last_line(proc.stderr)}"
        )
    return proc.stderr


def compile_plain(
    problem: Problem, module: Module, clang: str, obj: Path, timeout_s: float = DEFAULT_TIMEOUT_S
) -> dict[str, float]:
    """The baseline: the same compile with the compiler's built-in heuristic, no channel."""
    with tempfile.TemporaryDirectory(prefix="mlgo-p-") as d:
        work = Path(d)
        start = time.monotonic()
        compile_object(
            module, clang, obj, problem.opt_level, problem.measure_flags(work), timeout_s
        )
        metrics = measure_object(problem.measure, module, obj, work)
        metrics["seconds"] = time.monotonic() - start
        return metrics


def replay_matches_default(problem: Problem, module: Module, clang: str) -> bool:
    """Does answering every decision with the compiler's own default through the channel
    give the same object, byte for byte, as the plain compile? It should: this is the
    check that the channel observes and replays faithfully."""
    with tempfile.TemporaryDirectory(prefix="mlgo-r-") as d:
        replayed, plain = Path(d) / "replayed.o", Path(d) / "plain.o"
        compile_module(problem, module, clang, keep_object=replayed)
        compile_plain(problem, module, clang, plain)
        return replayed.read_bytes() == plain.read_bytes()
