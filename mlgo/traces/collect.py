"""`mlgo collect`: compile every corpus module with the default heuristic through the
problem's channel and record each decision's features, the default answer, and the
module's measured cost. Re-running an interrupted collection continues where it stopped."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

from mlgo.corpus.compile import DEFAULT_TIMEOUT_S, compile_module
from mlgo.corpus.format import Corpus, Module
from mlgo.llvm.toolchain import Toolchain, probe
from mlgo.problems import Problem
from mlgo.problems.policy import MLPPolicy
from mlgo.records import ModuleRun
from mlgo.runtime.trust import output_dir_checked
from mlgo.runtime.workers import Failed, Workers
from mlgo.traces.format import Manifest, TraceError, trace_file, write_module_trace

console = Console(stderr=True, soft_wrap=True)


@dataclass(frozen=True)
class CollectTask:
    problem: Problem
    module: Module
    clang: str
    timeout_s: float = DEFAULT_TIMEOUT_S
    at_base: MLPPolicy | None = None  # a policy that never departs, at its base (`collect`)


def collect_one(task: CollectTask) -> ModuleRun:
    return compile_module(
        task.problem, task.module, task.clang, task.at_base, timeout_s=task.timeout_s
    )


def _open_manifest(out: Path, problem: Problem, tc: Toolchain, corpus: Corpus) -> Manifest:
    if (out / "manifest.json").exists():
        manifest = Manifest.load(out)
        if manifest.problem is not problem:
            raise TraceError(f"{out} holds {manifest.problem.name} traces; choose another --out")
        if manifest.toolchain != tc.describe():
            console.print(
                f"[yellow]{out}: collected with {manifest.toolchain}; "
                f"starting over with {tc.describe()}"
            )
            return Manifest(problem, tc.describe(), str(corpus.root))
        return manifest
    return Manifest(problem, tc.describe(), str(corpus.root))


def collect(
    problem: Problem,
    corpus: Corpus,
    out: Path,
    tc: Toolchain,
    workers: Workers,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    at_base: MLPPolicy | None = None,
) -> Manifest:
    """The compiler's own decisions on CORPUS into OUT; with the compiler's heuristic moved
    to AT_BASE's base (a policy that never departs: `MLPPolicy.base`), where a tune clones
    clang's own at another inline threshold."""
    probe(tc, problem)
    output_dir_checked(out, create=True)  # resumed from: this user's alone
    for stale in out.rglob(".*.tmp"):  # left by a collection that was killed mid-write
        stale.unlink()
    manifest = _open_manifest(out, problem, tc, corpus)
    done = {n for n, e in manifest.modules.items() if (out / e["file"]).is_file()}
    todo = [m for m in corpus.modules if m.name not in done]
    if done:
        console.print(f"resuming: {len(done)} modules already collected, {len(todo)} to go")
    tasks = [CollectTask(problem, m, tc.clang, timeout_s, at_base) for m in todo]
    last_save = time.monotonic()
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=False,
    ) as bar:
        job = bar.add_task(f"collect {problem.name}", total=len(tasks))
        for task, result in workers.imap(collect_one, tasks):
            name = task.module.name
            if isinstance(result, Failed):
                manifest.failed[name] = result.message
                console.print(f"[red]skipped[/red] {result.message}", markup=True, highlight=False)
            else:
                if result.specs and not manifest.specs:
                    manifest.specs = [s.to_json() for s in result.specs]
                write_module_trace(out / trace_file(name), result, problem.advice_name)
                manifest.modules[name] = {
                    "file": trace_file(name),
                    "decisions": result.num_decisions,
                    "metrics": result.metrics,
                    "seconds": round(result.seconds, 4),
                }
                manifest.failed.pop(name, None)
            bar.advance(job)
            if time.monotonic() - last_save > 1:
                manifest.save(out)
                last_save = time.monotonic()
    manifest.save(out)
    return manifest
