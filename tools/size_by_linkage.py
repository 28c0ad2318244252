"""Where a policy's .text change sits, by the linkage of the functions that change.

Compiles each module of a corpus with clang's default inliner and with a policy, reads
every function symbol's size from both objects (pyelftools) and sums the change per
binding: weak (C++ linkonce_odr: templates and inline functions, in a COMDAT group, one
copy kept at link time), global (strong) and local (static, anonymous namespace). Also
counts the policy's departures from the default, towards inlining and away from it.

    .venv/bin/python -m tools.size_by_linkage --corpus data/heldout --packages jsoncpp
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections import Counter
from pathlib import Path

from elftools.elf.elffile import ELFFile

from mlgo.corpus.compile import compile_module
from mlgo.corpus.format import load_corpus
from mlgo.llvm.toolchain import find_toolchain
from mlgo.problems.policy_files import load_policy

BINDINGS = {"STB_WEAK": "weak", "STB_GLOBAL": "global", "STB_LOCAL": "local"}


def function_sizes(obj: Path) -> dict[str, tuple[str, int]]:
    """Each defined function of OBJ: (binding, bytes)."""
    with open(obj, "rb") as f:
        symtab = ELFFile(f).get_section_by_name(".symtab")
        return {
            s.name: (BINDINGS[s["st_info"]["bind"]], s["st_size"])
            for s in symtab.iter_symbols()
            if s["st_info"]["type"] == "STT_FUNC" and s["st_shndx"] != "SHN_UNDEF"
        }


def linkage_change(
    before: dict[str, tuple[str, int]], after: dict[str, tuple[str, int]]
) -> Counter[str]:
    """From one object's functions (BEFORE, `function_sizes`) to another's (AFTER): the
    bytes gained per binding, how many functions of each binding changed, and the bytes of
    BEFORE's functions (`default_functions`). A function's binding is AFTER's, if it is there."""
    row: Counter[str] = Counter()
    for name in before.keys() | after.keys():
        bind = (after.get(name) or before[name])[0]
        delta = after.get(name, ("", 0))[1] - before.get(name, ("", 0))[1]
        row[bind] += delta
        row[f"{bind}_functions_changed"] += delta != 0
    row["default_functions"] = sum(s for _, s in before.values())
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, required=True)
    ap.add_argument("--policy", type=Path, default=Path("policies/inlining-size"))
    ap.add_argument("--packages", default="", help="comma-separated (default: all)")
    ap.add_argument("--json", type=Path, help="write the per-module figures here")
    args = ap.parse_args()
    policy = load_policy(args.policy)
    corpus = load_corpus(args.corpus).select([p for p in args.packages.split(",") if p])
    clang = find_toolchain().clang
    totals: Counter[str] = Counter()
    rows = []
    for module in corpus.modules:
        with tempfile.TemporaryDirectory() as d:
            plain, served = Path(d) / "default.o", Path(d) / "policy.o"
            compile_module(policy.problem, module, clang, keep_object=plain)
            run = compile_module(policy.problem, module, clang, policy, keep_object=served)
            row = linkage_change(function_sizes(plain), function_sizes(served))
        row["to_inline"] = int(((run.advice == 1) & (run.default == 0)).sum())
        row["to_not_inline"] = int(((run.advice == 0) & (run.default == 1)).sum())
        row["decisions"] = run.num_decisions
        totals.update(row)
        rows.append({"module": module.name, **row})
        print(module.name, dict(row), flush=True)
    print("total", dict(totals))
    if args.json:
        args.json.write_text(json.dumps({"modules": rows, "total": totals}, indent=1))


if __name__ == "__main__":
    main()
