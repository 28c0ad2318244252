"""How much does inlining have left to give at the full-LTO link, beside what it has per file?
The ceiling to read link-time figures against, on real Debian programs.

  .venv/bin/python -m tools.headroom_lto lua zstd --work data/lto --budget 24

For each recipe: its programs built plain with `-Oz` per file and with `-Oz -flto` linked by
lld (both with the recipe's own tests), the `.text` of each linked program; the merged
module lld's LTO optimizes (its `--save-temps` file after internalization, one module a
program) made into a corpus, recompiled with `clang -Oz` (which lands near the real link's
`.text`: the table shows both) and searched by BC-Max's search (`tools.headroom_inlining`)
with as many compiles as the same search takes on the recipe's per-file corpus (`mlgo corpus
build`), whose figure is beside it (over the objects, each counted once however many
programs link it). Every size is
measured; a search that sees sizes is a ceiling for a policy, not a policy.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from mlgo.corpus.extract import combine
from mlgo.corpus.format import write_description
from mlgo.corpus.lto import MERGED_SUFFIX, cc1_args
from mlgo.llvm.sizes import text_size
from mlgo.llvm.toolchain import Toolchain, find_toolchain
from mlgo.packages.build import extract_package
from mlgo.packages.recipes import Recipe, load_recipe
from mlgo.programs.build import SIZE_FLAGS, Variant, build_program, plain_compilers, pristine_source
from mlgo.runtime.files import atomic_write_text

LTO_FLAGS = [*SIZE_FLAGS, "-flto=full", "-fuse-ld=lld", "-Wl,--save-temps"]


def merged_corpus(recipe: Recipe, tree: Path, tc: Toolchain, out: Path) -> list[str]:
    """OUT as a corpus of the merged module of each of RECIPE's programs linked in TREE."""
    package = out / recipe.name
    package.mkdir(parents=True, exist_ok=True)
    names = []
    for program in recipe.programs:
        merged = tree / f"{program}{MERGED_SUFFIX}"
        name = program.replace("/", "_")
        (package / f"{name}.bc").write_bytes(merged.read_bytes())
        args = cc1_args(tc, merged, "-Oz")
        (package / f"{name}.cmd").write_bytes(b"\0".join(a.encode() for a in args))
        names.append(name)
    write_description(package, names)
    return combine(out)


def search(corpus: Path, budget: int, report: Path) -> dict:
    """tools.headroom_inlining on CORPUS; its JSON report."""
    cmd = [sys.executable, "-m", "tools.headroom_inlining", "--corpus", str(corpus)]
    cmd += ["--budget", str(budget), "--json", str(report)]
    subprocess.run(cmd, check=True)
    return json.loads(report.read_text())


def change(after: float, before: float) -> str:
    return f"{100 * (after / before - 1):+.2f}%"


def measure(
    recipe: Recipe, tc: Toolchain, work: Path, budget: int, link_budget: int = 0
) -> dict[str, object]:
    """Every figure of RECIPE's row (see the module doc); LINK_BUDGET compiles per merged
    module, if given, instead of as many in all as the per-file search took."""
    pristine = pristine_source(recipe, work / "source")
    compilers = plain_compilers(tc)
    per_file = build_program(
        recipe, pristine, work / "per-file", tc, Variant("per-file", compilers, {})
    )
    lto = build_program(
        recipe, pristine, work / "lto", tc, Variant("lto", compilers, {}), LTO_FLAGS
    )
    merged = work / "merged-corpus"
    merged_corpus(recipe, (work / "lto").resolve(), tc, merged)
    files = work / "per-file-corpus"
    extract_package(recipe, tc, files, work / "corpus-build", "-Oz")
    combine(files)
    in_files = search(files, budget, work / "headroom-files.json")
    # The same number of compiles at the link as per file: a merged module has the
    # decisions of every file in it, so a per-module budget alone would starve it.
    link_budget = link_budget or max(budget, in_files["compiles"] // len(recipe.programs))
    at_link = search(merged, link_budget, work / "headroom-link.json")
    return {
        "recipe": recipe.name,
        "per_file_text": sum(per_file.text.values()),
        "lto_text": sum(lto.text.values()),
        "lto_objects_text": sum(text_size(work / "lto" / f"{p}.lto.o") for p in recipe.programs),
        "link_search": {**at_link["total"], "compiles": at_link["compiles"]},
        "file_search": {**in_files["total"], "compiles": in_files["compiles"]},
        "tests": {"per-file": per_file.tests, "lto": lto.tests},
    }


def table(rows: list[dict]) -> Table:
    t = Table(title="inlining headroom at the full-LTO link and per file (-Oz, clang/lld 22)")
    for column in (
        "recipe",
        "per-file .text",
        "full LTO",
        "merged recompiled",
        "link-time search",
        "per-file search",
    ):
        t.add_column(column)
    for r in rows:
        link, files = r["link_search"], r["file_search"]
        t.add_row(
            r["recipe"],
            f"{r['per_file_text']:,}",
            f"{r['lto_text']:,} ({change(r['lto_text'], r['per_file_text'])})",
            f"{link['default']:,.0f} (lto.o {r['lto_objects_text']:,})",
            f"{change(link['search'], link['default'])} ({link['compiles']:,} compiles)",
            f"{change(files['search'], files['default'])} ({files['compiles']:,} compiles)",
        )
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("recipes", nargs="+")
    ap.add_argument("--work", type=Path, default=Path("data/lto"))
    ap.add_argument("--budget", type=int, default=24, help="compiles per module per search")
    ap.add_argument(
        "--link-budget",
        type=int,
        default=0,
        help="compiles per merged module (default: as many in all as the per-file search took)",
    )
    ap.add_argument("--json", type=Path, help="write the rows here")
    args = ap.parse_args()
    tc = find_toolchain()
    rows = [
        measure(load_recipe(r), tc, args.work / r, args.budget, args.link_budget)
        for r in args.recipes
    ]
    Console().print(table(rows))
    if args.json:
        atomic_write_text(args.json, json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
