"""`mlgo corpus stats`: how big a corpus is, per package.

Call sites are counted from the bitcode (direct calls to functions defined in the same
module: the inliner's candidates before any inlining); .text bytes come from compiling
each module with plain clang at the level it was recorded at, with the bytes of each COMDAT
group (a C++ inline or template function's copy) apart: from those, how many objects of a
package define each group, which inlining's reward shares their bytes out by (`text_once`,
`mlgo.llvm.sizes`). Results are cached in the
user's cache directory (never in the corpus, which may be read-only), one file per corpus,
each module's entry keyed by a hash of its bitcode and command line: a module that changed
in any byte is measured again.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import time
from collections import Counter, defaultdict
from contextlib import suppress
from dataclasses import dataclass, replace
from pathlib import Path

from mlgo.corpus.compile import compile_object, measure_object
from mlgo.corpus.format import Corpus, Module
from mlgo.llvm.sizes import TextParts, text_once, text_parts
from mlgo.runtime.files import atomic_write_text, cache_dir
from mlgo.runtime.inputs import read_json
from mlgo.runtime.workers import Failed, Workers

# What a cached entry holds; a cache of another version is measured again.
VERSION = 2  # 2: each module's COMDAT groups
SIZES = ("text_size", "text_once")  # what the stats hold of a module's default object
SUMMED = ("call_sites", *SIZES, "bitcode_bytes")  # per package


def cache_file(corpus: Corpus) -> Path:
    """Where CORPUS's stats are cached: the user cache, by the corpus's resolved path."""
    key = hashlib.sha256(str(corpus.root.resolve()).encode()).hexdigest()[:24]
    return cache_dir() / "stats" / f"{key}.json"


def module_key(module: Module) -> str:
    """What a module's stats depend on: its bitcode and its command line, byte for byte."""
    h = hashlib.sha256(module.bitcode.read_bytes())
    h.update("\0".join(module.args).encode())
    return h.hexdigest()


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


def module_stats(task: StatsTask) -> dict:
    data = task.module.bitcode.read_bytes()
    with tempfile.TemporaryDirectory() as d:
        obj = Path(d) / "out.o"
        start = time.monotonic()
        compile_object(task.module, task.clang, obj, task.module.opt_level)
        parts = measure_object(lambda o, _w, _c: text_parts(o), task.module, obj, Path(d))
        seconds = time.monotonic() - start
    return {
        "bitcode_bytes": len(data),
        "call_sites": count_call_sites(data),
        "text_size": parts.own + sum(parts.shared.values()),
        "comdat": parts.shared,  # bytes per group
        "seconds": round(seconds, 3),
    }


def package_copies(stats: dict[str, dict]) -> dict[str, dict[str, int]]:
    """Per package, how many of its modules' default objects define each COMDAT group."""
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for name, s in stats.items():
        counts[name.split("/", 1)[0]].update(s["comdat"].keys())
    return {package: dict(c) for package, c in counts.items()}


def shared_out(corpus: Corpus, stats: dict[str, dict]) -> Corpus:
    """CORPUS, each module carrying its package's `package_copies` (`Module.copies`), so
    that a compile of it measures text_once as its default's stats do."""
    copies = package_copies(stats)
    return replace(
        corpus,
        modules=tuple(replace(m, copies=copies.get(m.package, {})) for m in corpus.modules),
    )


def corpus_stats(
    corpus: Corpus, clang_desc: str, clang: str, workers: Workers
) -> tuple[dict[str, dict[str, int]], dict[str, str]]:
    """Per-module stats (cached) and per-module failures."""
    path = cache_file(corpus)
    cache: dict = {}
    with suppress(OSError, ValueError):  # no cache yet, or an unreadable one: measure again
        cache = read_json(path)
    if (
        not isinstance(cache, dict)
        or cache.get("toolchain") != clang_desc
        or cache.get("version") != VERSION
    ):
        cache = {
            "version": VERSION,
            "toolchain": clang_desc,
            "corpus": str(corpus.root.resolve()),
            "modules": {},
        }
    known = cache["modules"]
    keys = {m.name: module_key(m) for m in corpus.modules}
    todo = [m for m in corpus.modules if known.get(m.name, {}).get("key") != keys[m.name]]
    failures: dict[str, str] = {}
    for task, result in workers.imap(module_stats, [StatsTask(m, clang) for m in todo]):
        name = task.module.name
        if isinstance(result, Failed):
            failures[name] = result.message
            known.pop(name, None)  # what was measured before no longer describes it
        else:
            known[name] = {**result, "key": keys[name]}
    if todo:
        atomic_write_text(path, json.dumps(cache, indent=1))
    stats = {m.name: known[m.name] for m in corpus.modules if m.name in known}
    copies = package_copies(stats)
    return {
        name: {**s, "text_once": text_once(_parts(s), copies[name.split("/", 1)[0]])}
        for name, s in stats.items()
    }, failures


def _parts(stats: dict) -> TextParts:
    """A module's default .text as its stats record it."""
    return TextParts(stats["text_size"] - sum(stats["comdat"].values()), stats["comdat"])


def per_package(stats: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for name, s in stats.items():
        row = out.setdefault(
            name.split("/", 1)[0],
            {"modules": 0, **dict.fromkeys(SUMMED, 0)},
        )
        row["modules"] += 1
        for k in SUMMED:
            row[k] += s[k]
    return out


def totals(rows: dict[str, dict[str, int]]) -> dict[str, int]:
    """The per-package ROWS summed: the corpus's line of `mlgo corpus stats`."""
    return {k: sum(r[k] for r in rows.values()) for k in ("modules", *SUMMED)}
