"""The autotuner's ground truth: every config of one program, compiled and timed.

Each program runs in its own worker process (`python -m mlgo.xla.measure`), pinned to one
core and under a memory limit, so a compiler abort or blow-up costs one program, not the
run. Inside the worker every config is a separate compilation of the same lowered program
(see config.py), checked against the default's output, then timed in interleaved rounds
(config order reshuffled every round) so that background load hits all configs alike. Per
round a config's time is the median of a few calls after a warm-up call; rounds slower
than 1.25x the config's fastest round are dropped as disturbed; the median of the rest is
the figure, with its spread ((max - min) / median) and the number of rounds kept.
"""

from __future__ import annotations

import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

MEMORY_LIMIT = 12 << 30  # address space of a worker: a runaway compilation fails, not the box
NOISE_FACTOR = 1.25
MAX_CALLS = 200  # timed calls per round and config, at most
MAX_REL_ERROR = 1e-2  # vs the default's output; bf16 programs differ by rounding only


@dataclass(frozen=True)
class MeasureSpec:
    rounds: int = 20
    round_seconds: float = 0.004  # timed calls per round and config add up to about this
    cpu: int = -1  # the core to pin to; -1: the last one


def pin(cpu: int) -> None:
    """Runs this process (and the threads it starts later) on one core, memory-limited."""
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[cpu] if -len(cpus) <= cpu < len(cpus) else cpus[-1]})
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def _timed(fn, args, calls: int) -> float:
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        fn(*args).block_until_ready()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def summarize(rounds: list[float]) -> dict:
    """Median, spread and count of the rounds within NOISE_FACTOR of the fastest one, and
    the medians of the kept even and odd rounds: two independent measurements whose
    agreement bounds how well any model can rank the configs."""
    best = min(rounds)
    kept = [r for r in rounds if r <= NOISE_FACTOR * best]
    median = statistics.median(kept)
    halves = [[r for r in rounds[i::2] if r <= NOISE_FACTOR * best] for i in (0, 1)]
    return {
        "median_us": median * 1e6,
        "spread": (max(kept) - min(kept)) / median,
        "rounds_kept": len(kept),
        "rounds": len(rounds),
        "halves_us": [statistics.median(h) * 1e6 if h else median * 1e6 for h in halves],
    }


def measure_program(target: str, configs: list[str], spec: MeasureSpec) -> dict:
    """Graph and per-config timings of one program (see `load_target`); runs in the worker."""
    import jax
    import numpy as np

    from mlgo.xla.config import compiler_options
    from mlgo.xla.extract import extract_graph, fingerprint, lower
    from mlgo.xla.programs import example_inputs, load_target

    program = load_target(target)
    name = program.name
    lowered = lower(program)
    args = example_inputs(program)
    runs: dict[str, dict] = {}
    compiled = {}
    reference = None
    for config in configs:
        start = time.perf_counter()
        try:
            fn = lowered.compile(compiler_options=compiler_options(config))
            out = np.asarray(jax.tree.leaves(fn(*args))[0], dtype=np.float32)
        except Exception as e:  # a config XLA rejects is data, not a crash of the run
            runs[config] = {"status": "failed", "error": str(e).splitlines()[0][:300]}
            continue
        compile_s = time.perf_counter() - start
        if reference is None:
            reference = out
        err = float(np.max(np.abs(out - reference)) / (np.max(np.abs(reference)) + 1e-6))
        if err > MAX_REL_ERROR:  # a miscompile is never a candidate, however fast
            runs[config] = {"status": "wrong", "error": f"relative error {err:.3g}"}
            continue
        runs[config] = {"status": "ok", "compile_s": compile_s, "rel_error": err}
        compiled[config] = fn
    ok = list(compiled)
    first = {c: _timed(compiled[c], args, 3) for c in ok}
    calls = {c: max(3, min(MAX_CALLS, int(spec.round_seconds / max(first[c], 1e-7)))) for c in ok}
    rounds: dict[str, list[float]] = {c: [] for c in ok}
    spent = dict.fromkeys(ok, 0.0)
    order = list(ok)
    rng = random.Random(name)
    for _ in range(spec.rounds):
        rng.shuffle(order)
        for c in order:
            start = time.perf_counter()
            compiled[c](*args).block_until_ready()  # warm-up: caches, branch predictors
            rounds[c].append(_timed(compiled[c], args, calls[c]))
            spent[c] += time.perf_counter() - start
    for c in ok:
        runs[c].update(summarize(rounds[c]), measure_s=spent[c])
    graph = extract_graph(lowered)
    return {
        "name": name,
        "family": program.family,
        "held_out": program.held_out,
        "fingerprint": fingerprint(lowered),
        "graph": graph.to_json(),
        "runs": runs,
    }


def run_worker(target: str, configs: list[str], spec: MeasureSpec, timeout: float) -> dict:
    """measure_program in a fresh, pinned process; a crash or timeout is a RuntimeError."""
    request = {"target": target, "configs": configs, **asdict(spec)}
    cmd = [sys.executable, "-m", "mlgo.xla.measure", json.dumps(request)]
    name = target
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(f"{name}: measurement took longer than {timeout:.0f} s") from e
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        why = lines[-1] if lines else f"exit status {proc.returncode}"
        raise RuntimeError(f"{name}: worker failed: {why[:300]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure_isolated(target: str, configs: list[str], spec: MeasureSpec, timeout: float) -> dict:
    """run_worker; if the worker dies (XLA aborts in some configs), each config is probed
    alone, the ones that kill their process are recorded as crashed and the rest measured."""
    try:
        return run_worker(target, configs, spec, timeout)
    except RuntimeError as e:
        first_error = str(e)
    probe = MeasureSpec(rounds=1, round_seconds=0.0, cpu=spec.cpu)
    crashed = {}
    for config in configs:
        try:
            run_worker(target, [config], probe, timeout)
        except RuntimeError as e:
            crashed[config] = {"status": "crashed", "error": str(e)}
    survivors = [c for c in configs if c not in crashed]
    if not survivors or len(crashed) == 0:
        raise RuntimeError(first_error)
    result = run_worker(target, survivors, spec, timeout)
    result["runs"].update(crashed)
    return result


def _main() -> None:
    req = json.loads(sys.argv[1])
    spec = MeasureSpec(req["rounds"], req["round_seconds"], req["cpu"])
    pin(spec.cpu)
    print(json.dumps(measure_program(req["target"], req["configs"], spec)))


if __name__ == "__main__":
    _main()
