"""A tune's `decisions` stage: the chosen policy's inlining decisions on the project's own
build, recorded, and for each file the tune's search measured, the cheapest trajectory it
found there, recorded by its call sites; each judged once (`ship.decisions_kept`: the
smaller of the two where smaller than clang's own) and written to OUT/decisions, a
directory plain clang builds the project from; the tune's "mlgo" build is that build
(`decisions_variant`), so its report measures exactly what ships.

Register-allocation eviction has no replay in clang: a tune of it writes no decisions and
builds with the policy service, as its report says (`built_from`).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from mlgo.corpus.record import module_name
from mlgo.llvm.driver import link_output
from mlgo.llvm.toolchain import Toolchain
from mlgo.problems.policy_files import load_policy
from mlgo.programs.build import Variant, plain_compilers, problem_flags, scratch_copy
from mlgo.ship.decisions import ROOT_ENV, file_states, read, write
from mlgo.ship.decisions_kept import keep, unchanged
from mlgo.ship.decisions_record import Recorded, answered_links, answered_units, record_units

if TYPE_CHECKING:
    from mlgo.programs.tune_run import TuneRun


def decide(run: TuneRun) -> Path:
    """The project configured and built from a copy of the tune's snapshot with its kept
    policy served by our plugin at the problem's stage and recorded; its kept decisions
    written to OUT/decisions for the project at its source (where `CC=OUT/decisions/cc`
    builds it), the copy removed. A refresh keeps the verdicts of the sources unchanged
    since OUT/decisions was written and judges only the others. With a profile, every
    compile uses its counts, and OUT/decisions carries it."""
    out, recipe, problem, refresh = run.out, run.recipe, run.problem, run.opts.refresh
    earlier = out.decisions / "summary.json"
    before = read(out.decisions).verdicts() if refresh and earlier.is_file() else {}
    scratch = out.deciding / recipe.name
    scratch_copy(run.pristine, scratch)
    script = " && ".join([*recipe.configure, *recipe.build])
    flags = problem_flags(problem, run.profile)
    log = scratch.parent / "build.log"
    clangs = scratch.parent / "clangs"  # what clang's own builds, beside the copy
    clangs.mkdir()
    policy = load_policy(out.policy)  # where the search did not reach, or found less
    found = record_units(  # the copy is ours: a source the build deletes is put back
        policy, scratch, ["sh", "-c", script], run.tc, log, clangs, flags, problem.stage, True
    )
    as_before = unchanged(found, before)
    answers = {n: a for n, a in searched_units(run, found, scratch).items() if n not in as_before}
    files_answered = {n[len("files/") :]: a for n, a in answers.items() if n.startswith("files/")}
    links_answered = {n[len("links/") :]: a for n, a in answers.items() if n.startswith("links/")}
    searched = answered_units(found, files_answered) | answered_links(
        found, links_answered, run.tc, problem.opt_level
    )
    files, links, left = keep(found, problem.aim, as_before, searched)
    again = sorted(f"files/{n}" for n in found.files if f"files/{n}" not in as_before)
    refreshed = {"judged_again": again, "as_before": len(as_before)} if refresh else None
    write(out.decisions, run.source, files, links, found.flags, run.tc.major, left, refreshed,
          run.profile)  # fmt: skip
    shutil.rmtree(scratch.parent)
    return out.decisions


def searched_units(run: TuneRun, found: Recorded, root: Path) -> dict[str, str]:
    """Per unit of FOUND's build at ROOT (`files/NAME`, and `links/PROGRAM` at a full-LTO
    link, its module named by its output's path as the corpus names it), the
    answers of the cheapest trajectory the tune's search measured for its module
    (`bcmax.searched_answers`), where it beat clang's own there."""
    from mlgo.train.bcmax import searched_answers

    answers = searched_answers(run.out.train)
    by_unit = {f"files/{n}": module_name(Path(n), run.recipe.name) for n in found.compiles}
    for program, call in found.link_calls.items():
        output = (call.cwd / link_output(call.argv[1:])).resolve()
        rel = Path(os.path.relpath(output, root.resolve()))
        by_unit[f"links/{program}"] = module_name(rel, run.recipe.name)
    return {n: answers[m] for n, m in by_unit.items() if m in answers}


def decisions_stage(run: TuneRun) -> None:
    """A tune's decisions stage, for a problem clang replays from a file (`decide`)."""
    if run.decisions is not None:
        run.say(f"keeping the search's and the policy's decisions that pay, in {run.decisions}")
        decide(run)


def from_decisions(tc: Toolchain, directory: Path, root: Path) -> tuple[Variant, Variant]:
    """The two builds of a tune: plain clang, and the build of the project's copy at ROOT
    from DIRECTORY's decisions by its `cc` and `c++` over plain clang, told where this
    copy's root is."""
    directory = directory.resolve()
    compilers = (str(directory / "cc"), str(directory / "c++"))
    env = {ROOT_ENV: str(root.resolve())}
    return Variant("plain", plain_compilers(tc), {}), Variant("mlgo", compilers, env)


def built_from(directory: Path | None, tree: Path, say: Callable[[str], None]) -> dict:
    """What a tune's report says its "mlgo" build at TREE was built from: the decisions
    in DIRECTORY (`decisions_summary`, also said in a line), or (None) the policy service,
    for eviction."""
    if directory is None:  # clang cannot read eviction decisions from a file
        return {"built_from": "service"}
    summary = decisions_summary(directory, tree)
    say(summary_line(summary))
    return {"built_from": "decisions", "decisions": summary}


def decisions_summary(directory: Path, tree: Path) -> dict:
    """What a report says of the decisions a build at TREE was built from: units kept
    (files and programs), their decisions and departures from clang's own, the units
    judged, the .text they save where measured, and the files whose source is no longer
    the one decided (stale: clang's own decide at the sites that moved)."""
    artifact = read(directory)
    units = [*artifact.files.values(), *artifact.links.values()]
    judged = [u for u in artifact.clangs_own.values() if u.get("departures")]
    states = file_states(artifact, tree)
    return {
        "directory": str(directory.resolve()),
        "files": len(artifact.files),
        "links": len(artifact.links),
        "decisions": sum(u["decisions"] for u in units),
        "departures": sum(u["departures"] or 0 for u in units),
        "kept": len(units),
        "departing_units": len(units) + len(judged),
        "text_saved": sum(u["text"]["saved"] for u in units if "text" in u),
        "from_search": sum(u.get("found_by") == "search" for u in units),
        "search_gain": sum(
            u["text"]["saved"] - u.get("policy_saved", 0)
            for u in units
            if u.get("found_by") == "search" and "text" in u
        ),
        "stale": sum(state != "unchanged" for state in states.values()),
        **({"refreshed": artifact.refreshed} if artifact.refreshed else {}),
    }


def summary_line(summary: dict) -> str:
    """A `decisions_summary` in the line a build's notes say once."""
    line = (
        f"{summary['directory']}: {summary['kept']} of {summary['departing_units']} units "
        f"where the policy departs kept ({summary['files']} files, {summary['links']} "
        f"programs), {summary['decisions']} decisions, {summary['text_saved']} bytes of "
        ".text saved against clang's own"
    )
    if summary["from_search"]:
        line += (
            f"; {summary['from_search']} files from the search's trajectories, "
            f"{summary['search_gain']} bytes more than the policy's decisions there"
        )
    if summary["stale"]:
        line += (
            f"; {summary['stale']} files changed since decided: clang's own decide where their "
            "sites moved (`mlgo decisions check DIR -- FLAGS` counts what still matches)"
        )
    return line
