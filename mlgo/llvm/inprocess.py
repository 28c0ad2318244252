"""The in-process compiler path: llvmlite 0.50 bundles LLVM 22 with MLGO's interactive mode,
so a module can be optimized and code-generated inside this Python process while a thread
answers the channel. No clang install is needed, but llvmlite builds LLVM's O1-O3
pipeline (it has no -Oz), and LLVM options are process-wide: one channel per problem per
process, set once. A compile in progress cannot be killed, so a failing policy is not
allowed to leave LLVM waiting: its remaining decisions get the default answer and the
error is raised once the compile returns.
"""

from __future__ import annotations

import os
import tempfile
import threading
from dataclasses import dataclass

import numpy as np

from mlgo.llvm.channel import ChannelError, Decision, Policy, serve_in_thread
from mlgo.llvm.log_format import Header, Observation
from mlgo.problems import Problem

_lock = threading.Lock()
_bases: dict[str, str] = {}


@dataclass
class InProcessResult:
    header: Header | None
    decisions: list[Decision]
    object_code: bytes


def _llvm():
    import llvmlite.binding as llvm

    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    return llvm


def _channel_base(problem: Problem) -> str:
    """Creates this process's FIFO pair for `problem` and points LLVM at it, once."""
    if problem.name not in _bases:
        llvm = _llvm()
        d = tempfile.mkdtemp(prefix="mlgo-inproc-")
        base = os.path.join(d, "ch")
        os.mkfifo(base + ".in", 0o600)
        os.mkfifo(base + ".out", 0o600)
        flags = problem.channel_flags(base)
        for opt in flags[1::2]:  # the values after each -mllvm
            llvm.set_option("mlgo", opt)
        _bases[problem.name] = base
    return _bases[problem.name]


def compile_in_process(
    problem: Problem,
    bitcode: bytes,
    policy: Policy | None = None,
    speed_level: int = 2,
    timeout_s: float = 300.0,
) -> InProcessResult:
    """Optimizes and code-generates `bitcode` with llvmlite, answering decisions with `policy`."""
    llvm = _llvm()
    policy = policy or problem.default_advice
    failure: list[str] = []

    def guarded(obs: Observation) -> int | np.ndarray:
        if not failure:
            try:
                answer = np.asarray(policy(obs)).reshape(-1)
                problem.validate(obs, answer)
                return answer
            except Exception as e:  # reported after the compile, see module docstring
                failure.append(f"policy failed on decision {obs.index}: {type(e).__name__}: {e}")
        return problem.default_advice(obs)

    try:
        module = llvm.parse_bitcode(bitcode)
        module.verify()
    except RuntimeError as e:
        raise ChannelError(f"invalid bitcode: {str(e).strip().splitlines()[0]}") from e
    with _lock:  # one compile at a time per process: the channel is process-wide
        base = _channel_base(problem)
        target = llvm.Target.from_triple(module.triple or llvm.get_default_triple())
        tm = target.create_target_machine(opt=speed_level, reloc="pic", codemodel="default")
        pb = llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(speed_level))
        thread, box = serve_in_thread(base, guarded, timeout_s)
        try:
            pb.getModulePassManager().run(module, pb)
        finally:
            box["done"] = True
            thread.join(timeout_s)
        if "error" in box:
            raise ChannelError(f"in-process channel: {box['error']}")
        if failure:
            raise ChannelError(failure[0])
        return InProcessResult(box.get("header"), box.get("decisions", []), tm.emit_object(module))
