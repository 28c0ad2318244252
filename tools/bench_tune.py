"""Issue 22's figures: `mlgo tune` on real projects that no shipped policy trained on.

  .venv/bin/python -m tools.bench_tune cmark jq geographiclib yajl ninja serd tidy-html5 \
      flatbuffers units --minutes 60 --work data/bench-tune

(sord, discount, mandoc, tcc, libfyaml, nasm and byacc were screened with --minutes 2 only.)

  .venv/bin/python -m tools.bench_tune serd tidy-html5 ninja --problem regalloc-eviction \
      --minutes 12

With `--problem regalloc-eviction`, issue 39's figures: the eviction policy tuned at -O2
for speed into WORK/NAME/tune-regalloc-eviction, trained and its candidates judged on the
workload's block cost (`mlgo.programs.speed`); beside the CPU time, the kept policy's change
by that cost, how well the corpus's static cost ranked the candidates against it, and both
builds timed again with longer samples (RETIMED), beside the shipped policy untuned: built
into WORK/NAME/untuned (tests run) and timed against the tune's plain build. With
`--problem inlining-speed`, the same for the inliner at -O2, from clang's own decisions
cloned (it ships no policy, so none is timed untuned). With `--pgo` (issue 60's item 4),
the tune on top of the PGO build from the project's workload (`mlgo tune --pgo`): every
figure against the PGO build, and beside it PGO's own change against plain -O2.

  .venv/bin/python -m tools.bench_tune yajl serd tidy-html5 ninja --lto full --minutes 10

With `--lto full` (or `thin`), issue 38's figures: `mlgo tune --lto full` (the inliner of
the LTO link, against plain `-Oz -flto` (`-flto=thin`) linked by lld) into
WORK/NAME/tune-lto-full (-thin), and beside it what plain LTO gives over per-file `-Oz` (a
third build, WORK/NAME/per-file, without tests), over the same programs and shared
libraries, and how well the corpus's reward ranked the candidates as the link did.

Each project is a Debian source package (fetched with apt-get source, patches applied, its
build dependencies installed), tuned on its own code with the commands below, exactly what
a user types in its source tree. The projects run one after another, so each training has
the whole machine. A project tuned before in WORK resumes where it stopped (`mlgo tune`
resumes), so a finished one is only reported again. Reported per project, from its
report.json: the linked programs' and shared libraries' .text against clang -Oz, every ELF
file's, the search headroom on its corpus and the share the policy kept, which candidate
was kept, the workload's CPU time (median and IQR of paired rounds, and the A/A control's:
the baseline timed twice a round), instructions where
valgrind is installed, the tests on both builds, the training's minutes, and the wall time
of this run of the command (all of it when the project was not tuned before).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from rich.console import Console
from rich.table import Table

from mlgo.data import shipped_policy
from mlgo.errors import USER_ERRORS
from mlgo.llvm.sizes import compare_trees, linked_rows, tree_totals
from mlgo.llvm.toolchain import Toolchain, find_toolchain
from mlgo.packages.recipes import Recipe
from mlgo.problems import LTO_STAGES, Problem, at_link, get_problem, problems
from mlgo.programs.build import (
    Building,
    Variant,
    build_program,
    plain_compilers,
    policy_service,
    pristine_source,
    problem_flags,
)
from mlgo.programs.compare import variants
from mlgo.programs.measure import recipe_throughput
from mlgo.programs.report import throughput_change
from mlgo.programs.tune import tune
from mlgo.programs.tune_run import TuneOptions
from mlgo.runtime.files import atomic_write_text
from mlgo.runtime.messages import WHOLE_LINE, error_line
from tools.lab.projects import PROJECTS, RETIMED, project_recipe

console = Console()
SIZE = "inlining-size"  # the problem tuned unless --problem says another


def tune_project(
    name: str,
    work: Path,
    minutes: float,
    lto: str | None = None,
    problem: str = SIZE,
    pgo: bool = False,
    profile_inputs: bool = False,
) -> dict:
    """Fetches NAME's source once and tunes PROBLEM on it into WORK/NAME/tune (another
    problem than the inliner's: WORK/NAME/tune-PROBLEM; LTO: that link's inliner, into
    WORK/NAME/tune-lto-LTO, and plain LTO against per-file -Oz; PGO: on top of the PGO
    build, into WORK/NAME/tune-PROBLEM-pgo; with PROFILE_INPUTS, the search's policy reading
    the profile's counts too, into WORK/NAME/tune-PROBLEM-pgo-counts); its report and wall
    time."""
    recipe = project_recipe(name)
    source = pristine_source(recipe, work / name)
    started = time.monotonic()
    tc = find_toolchain()
    where = f"tune-lto-{lto}" if lto else "tune" if problem == SIZE else f"tune-{problem}"
    problem = at_link(problem, lto).name if lto else problem
    out = work / name / (f"{where}-pgo" if pgo else where)
    out = out.with_name(f"{out.name}-counts") if profile_inputs else out
    opts = TuneOptions(minutes=minutes, problem=problem, pgo=pgo, profile_inputs=profile_inputs)
    report = tune(source, recipe, out, tc, opts)
    result = {"language": recipe.language, "seconds": time.monotonic() - started, "report": report}
    if lto:
        result["lto_over_per_file_pct"] = lto_over_per_file(recipe, source, work / name, out, tc)
    tuned = get_problem(problem)
    if tuned.aim == "speed" and recipe.bench:
        result["retimed"] = retimed(recipe, source, work / name, out, tc, tuned)
    return result


def lto_over_per_file(
    recipe: Recipe, source: Path, work: Path, tuned: Path, tc: Toolchain
) -> float:
    """What plain LTO (the tune's baseline build) gives over per-file -Oz, in % of the
    programs' and shared libraries' .text: the same source built per file into WORK/per-file
    (once; no tests), against the tune's plain build."""
    per_file = work / "per-file"
    if not (per_file / ".complete").exists():
        build_program(
            recipe,
            source,
            per_file,
            tc,
            Variant("per-file", plain_compilers(tc), {}),
            None,
            Building(tests=False),
        )
        (per_file / ".complete").touch()
    linked = tree_totals(linked_rows(compare_trees(tuned / "programs" / "plain", per_file)))
    return linked["delta_pct"]


def retimed(
    recipe: Recipe, source: Path, work: Path, tuned: Path, tc: Toolchain, problem: Problem
) -> dict:
    """The tune TUNED's policy, and PROBLEM's shipped policy untuned where one is shipped
    (built by mlgo-cc from SOURCE into WORK/untuned, its tests run), each timed against the
    tune's plain build in RETIMED's paired rounds and CPU seconds (with the A/A control):
    longer samples than the tune's own, for less noise in each round."""
    plain = tuned / "programs" / "plain"
    builds = {"tuned": tuned / "programs" / "mlgo"}
    shipped = shipped_policy(problem.name)
    if shipped.is_dir():  # inlining-speed ships none: its start is cloned in each tune
        untuned = builds["untuned"] = work / "untuned"
        if not (work / "untuned.done").exists():
            with policy_service([shipped], work / "service") as env:
                served = variants(tc, env)[1]
                build_program(
                    recipe,
                    source,
                    untuned,
                    tc,
                    Variant("untuned", served.compilers, served.env),
                    problem_flags(problem),
                )
            (work / "untuned.done").touch()
    return {
        policy: recipe_throughput(recipe, {"plain": plain, policy: tree}, *RETIMED)
        for policy, tree in builds.items()
    }


def try_project(name: str, tuned: Callable[[], dict]) -> dict:
    """TUNED (`tune_project` on project NAME), or what stopped it (its rehearsal, a failing
    test...) as one line, so that the projects after it still run."""
    try:
        return tuned()
    except USER_ERRORS as e:
        console.print(f"[red]{name}: {error_line(e, WHOLE_LINE)}", highlight=False)
        return {"language": project_recipe(name).language, "error": error_line(e)}


def pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.2f}%"


def rank(result: dict) -> str:
    """Spearman's rho of the corpus's reward against the judge of the candidates (the
    link's, or the workload's), over those it gave a figure."""
    training = result.get("report", {}).get("training", {})
    corr = training.get("rank_correlation") or {}
    rho = corr.get("spearman")
    return "n/a" if rho is None else f"{rho:+.2f} ({corr['candidates']})"


def cpu_time(speed: dict) -> str:
    """A throughput's CPU time change and its A/A control's, medians and IQRs."""
    cpu = throughput_change(speed)
    if "control_change_pct" in speed:
        cpu += f"; A/A {throughput_change(speed, 'control_')}"
    return cpu


def judged(result: dict) -> float | None:
    """The kept policy's change by the judge of its candidates (a speed problem's: the
    workload's block cost), in percent."""
    training = result.get("report", {}).get("training", {})
    return training.get("judged_change_pct", {}).get(training.get("chosen"))


def row(name: str, result: dict) -> list[str]:
    """One project's table row from its RESULT (`try_project`'s)."""
    if "error" in result:
        return [f"{name} ({result['language']})", f"[red]stopped: {result['error']}", *[""] * 8]
    r = result["report"]
    size, training, speed = r["size"], r["training"], r.get("throughput")
    linked = size.get("linked", {})
    captured = training.get("headroom_captured")
    headroom = pct(training.get("headroom_pct"))
    cpu = cpu_time(speed) if speed else "not measured"
    # a report written before it named the files that grew does not say how many did
    grew = f", {len(linked['larger'])} larger" if "larger" in linked else ""
    return [
        f"{name} ({result['language']})",
        f"{pct(linked.get('change_pct'))} ({linked.get('files', 0)} files{grew})",
        f"{pct(size['change_pct'])} ({size['files']})",
        headroom if captured is None else f"{headroom} ({captured:.0%})",
        training["chosen"],
        cpu,
        pct((speed or {}).get("instructions_change_pct")),
        f"{r['tests']['baseline']} / {r['tests']['policy']}",
        f"{training['seconds'] / 60:.0f} min",
        f"{result['seconds'] / 60:.0f} min",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("projects", nargs="+", choices=sorted(PROJECTS))
    parser.add_argument("--minutes", type=float, default=60.0, help="training budget each")
    parser.add_argument("--work", type=Path, default=Path("data/bench-tune"))
    parser.add_argument("--lto", choices=sorted(LTO_STAGES), help="tune that LTO link's inliner")
    speed_problems = [p.name for p in problems() if p.aim == "speed"]
    parser.add_argument("--problem", choices=[SIZE, *speed_problems], default=SIZE)
    parser.add_argument("--pgo", action="store_true", help="tune on top of the PGO build")
    parser.add_argument(
        "--profile-inputs", action="store_true", help="with --pgo: the policy reads the counts"
    )
    args = parser.parse_args()
    work, lto, problem, pgo = args.work.resolve(), args.lto, args.problem, args.pgo
    counts = args.profile_inputs
    results = {
        n: try_project(n, partial(tune_project, n, work, args.minutes, lto, problem, pgo, counts))
        for n in args.projects
    }
    flag = {"full": "-flto", "thin": "-flto=thin"}.get(lto or "")
    level = get_problem(problem).opt_level + (" -fprofile-instr-use" if pgo else "")
    baseline = f"clang {level} {flag} (lld)" if lto else f"clang {level}"
    speed = problem != SIZE
    table = Table(
        "project", "programs + shared libs .text (files)", "all ELF files",
        "search headroom (kept)", "kept", "CPU time (IQR)", "instructions",
        f"tests ({baseline} / policy)", "training", "wall, this run",
        *([f"plain {flag} vs per-file -Oz", "corpus vs link rank (rho)"] if lto else []),
        *(["kept, by the workload's block cost", "corpus vs workload rank (rho)",
           f"retimed ({RETIMED[0]} rounds of {RETIMED[1]:g} s): tuned; shipped untuned"]
          if speed else []),
        *(["PGO against no profile (IQR)"] if pgo else []),
        title=f"mlgo tune{f' --lto {lto}' if lto else ''} --problem {problem} "
        f"--minutes {args.minutes:g}, each project against {baseline}",
    )  # fmt: skip
    for name, result in results.items():
        extra = [pct(result.get("lto_over_per_file_pct")), rank(result)] if lto else []
        if speed:
            again = result.get("retimed", {})
            cpu = "; ".join(f"{k} {cpu_time(v)}" for k, v in again.items()) or "n/a"
            extra = [pct(judged(result)), rank(result), cpu]
        if pgo:
            timed = result.get("report", {}).get("throughput") or {}
            extra.append(throughput_change(timed, "pgo_") if "pgo_iqr_pct" in timed else "n/a")
        table.add_row(*row(name, result), *extra)
    console.print(table)
    named = f"-lto-{lto}" if lto else "" if problem == SIZE else f"-{problem}"
    named += "-pgo" if pgo else ""
    named += "-counts" if counts else ""
    out = work / f"bench_tune{named}.json"
    atomic_write_text(out, json.dumps(results, indent=1))
    console.print(f"wrote {out}")


if __name__ == "__main__":
    main()
