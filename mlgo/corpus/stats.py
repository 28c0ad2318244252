"""`mlgo corpus stats`: how big a corpus is, per package.

Call sites are counted from the bitcode (direct calls to functions defined in the same
module: the inliner's candidates before any inlining); .text bytes come from compiling
each module with plain clang at the level it was recorded at. Results are cached in the
corpus next to the description, keyed by compiler and bitcode size, since a corpus does not
change.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from mlgo.corpus.compile import compile_plain
from mlgo.corpus.format import Corpus, Module
from mlgo.problems import get_problem
from mlgo.runtime.files import atomic_write_text
from mlgo.runtime.workers import Failed, Workers

CACHE = "stats.json"


def count_call_sites(bitcode: bytes) -> int:
    import llvmlite.binding as llvm

    mod = llvm.parse_bitcode(bitcode)
    defined = {f.name for f in mod.functions if not f.is_declaration}
    sites = 0
    for fn in mod.functions:
        for block in fn.blocks:
            for inst in block.instructions:
                if inst.opcode in ("call", "invoke"):
                    callee = list(inst.operands)[-1]
                    sites += callee.name in defined
    return sites


@dataclass(frozen=True)
class StatsTask:
    module: Module
    clang: str


def module_stats(task: StatsTask) -> dict[str, float]:
    data = task.module.bitcode.read_bytes()
    with tempfile.TemporaryDirectory() as d:
        # inlining-size measures .text; at the module's own level, whichever it is
        sized = replace(get_problem("inlining-size"), opt_level=task.module.opt_level)
        metrics = compile_plain(sized, task.module, task.clang, Path(d) / "out.o")
    return {
        "bitcode_bytes": len(data),
        "call_sites": count_call_sites(data),
        "text_size": int(metrics["text_size"]),
        "seconds": round(metrics["seconds"], 3),
    }


def corpus_stats(
    corpus: Corpus, clang_desc: str, clang: str, workers: Workers
) -> tuple[dict[str, dict[str, int]], dict[str, str]]:
    """Per-module stats (cached) and per-module failures."""
    path = corpus.root / CACHE
    cache: dict = {}
    if path.exists():
        try:
            cache = json.loads(path.read_text())
        except ValueError:
            cache = {}
    if cache.get("toolchain") != clang_desc:
        cache = {"toolchain": clang_desc, "modules": {}}
    known = cache["modules"]
    todo = [
        m
        for m in corpus.modules
        if known.get(m.name, {}).get("bitcode_bytes") != m.bitcode.stat().st_size
        or "seconds" not in known[m.name]
    ]
    failures: dict[str, str] = {}
    for task, result in workers.imap(module_stats, [StatsTask(m, clang) for m in todo]):
        if isinstance(result, Failed):
            failures[task.module.name] = result.message
        else:
            known[task.module.name] = result
    if todo:
        atomic_write_text(path, json.dumps(cache, indent=1))
    return {m.name: known[m.name] for m in corpus.modules if m.name in known}, failures


def per_package(stats: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for name, s in stats.items():
        row = out.setdefault(
            name.split("/", 1)[0],
            {"modules": 0, "call_sites": 0, "text_size": 0, "bitcode_bytes": 0},
        )
        row["modules"] += 1
        for k in ("call_sites", "text_size", "bitcode_bytes"):
            row[k] += s[k]
    return out
