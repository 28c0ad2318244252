"""`mlgo build`'s comparison: each package built with the plain compiler and with `mlgo-cc`
and the policy service, from one pristine source; the linked programs' .text side by side,
and the throughput of the package's workload where its recipe has one. `build.json` is
rewritten after every package, so a package that fails loses no other's; each package's
report (report.json, report.html) goes beside its two trees."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from rich.table import Table

from mlgo.llvm.toolchain import Toolchain
from mlgo.packages.recipes import Recipe
from mlgo.problems import Problem, get_problem
from mlgo.programs.build import (
    Building,
    ProgramBuild,
    Variant,
    baseline_label,
    build_program,
    mlgo_compilers,
    plain_compilers,
    policy_service,
    pristine_source,
    problem_flags,
)
from mlgo.programs.measure import Timing
from mlgo.programs.pgo import PGO, PGORow, pgo_row, timed_beside_row
from mlgo.programs.report import (
    PGO_ROW,
    baseline_flags,
    left_out,
    program_report,
    slower_but_smaller,
    throughput_change,
    write_report,
)
from mlgo.runtime.commands import BuildError
from mlgo.runtime.files import atomic_write_text

INLINING = get_problem("inlining-size")


def variants(
    tc: Toolchain,
    service_env: dict[str, str],
    names: tuple[str, str] = ("plain", "mlgo"),
    guard: bool = False,
) -> tuple[Variant, Variant]:
    """The plain compiler, and mlgo-cc over the same clang answered by the service at
    SERVICE_ENV (GUARD: MLGO_GUARD=size, the smaller of the policy's and the default's
    object per file)."""
    served = dict(service_env, MLGO_CC=tc.clang, MLGO_CXX=tc.clangxx)
    if guard:
        served["MLGO_GUARD"] = "size"
    return Variant(names[0], plain_compilers(tc), {}), Variant(names[1], mlgo_compilers(), served)


def build_pair(
    recipe: Recipe,
    work: Path,
    tc: Toolchain,
    pair: tuple[Variant, Variant],
    tests: bool = True,
    flags: list[str] | None = None,
    pristine: Path | None = None,
) -> tuple[ProgramBuild, ProgramBuild]:
    """Both variants of RECIPE built (and tested, if TESTS) in WORK/<variant> from one
    pristine source: PRISTINE, or the recipe's Debian source fetched into WORK."""
    pristine = pristine or pristine_source(recipe, work)
    a, b = (
        build_program(recipe, pristine, work / v.name, tc, v, flags, Building(tests=tests))
        for v in pair
    )
    return a, b


@dataclass
class Comparison:
    """The finished pairs and their reports, the packages that failed and why, and the
    policies used."""

    policies: list[Path]
    pairs: list[tuple[ProgramBuild, ProgramBuild]] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    reports: dict[str, dict] = field(default_factory=dict)  # package -> its report.json

    def totals(self) -> tuple[int, int, float]:
        """Plain .text, mlgo .text over every program, and the change in percent."""
        base = sum(sum(plain.text.values()) for plain, _ in self.pairs)
        ml = sum(sum(ml.text.values()) for _, ml in self.pairs)
        return base, ml, 100 * (ml / base - 1) if base else 0.0

    def save(self, path: Path) -> None:
        payload = {
            "policies": [str(p) for p in self.policies],
            "builds": [b.to_json() for pair in self.pairs for b in pair],
            "failed": self.failed,
            "delta_pct": self.totals()[2],
            "throughput": {
                name: r["throughput"] for name, r in self.reports.items() if "throughput" in r
            },
        }
        atomic_write_text(path, json.dumps(payload, indent=1))


@dataclass(frozen=True)
class Serving:
    """How `compare_programs` serves its policies and what it runs: the package's own
    TESTS on both builds, the service's BACKEND, GUARD (mlgo-cc keeps the smaller of the
    policy's and the default's object per file), and WITH_PGO the build with the
    workload's profile timed beside them, as built (`pgo.pgo_row`) and over layouts."""

    tests: bool = True
    backend: str = "auto"
    guard: bool = False
    with_pgo: bool = True


def compare_programs(
    recipes: list[Recipe],
    policies: list[Path],
    out: Path,
    tc: Toolchain,
    problem: Problem = INLINING,
    timing: Timing | None = None,
    serving: Serving = Serving(),
) -> Comparison:
    """Builds every recipe plain and with the POLICIES served (`Serving`; PROBLEM's flags on
    both: -Oz, or for a link-time problem -Oz with full LTO by lld) under OUT, saving
    OUT/build.json after each and OUT/<package>/report.json and .html; a failed package is
    recorded and skipped. With TIMING, the workload of each recipe that has one is timed in
    its rounds, also over its layouts of both builds (`layouts.policy_over_layouts`)."""
    result = Comparison(policies)
    flags, label = problem_flags(problem), baseline_label(problem)
    with policy_service(policies, out / "service", serving.backend) as service_env:
        pair = variants(tc, service_env, guard=serving.guard)
        for recipe in recipes:
            trees = {v.name: out / recipe.name / v.name for v in pair}
            try:
                built = build_pair(recipe, out / recipe.name, tc, pair, serving.tests, flags)
                speed = None
                if timing and timing.rounds and recipe.bench:
                    source, row = pristine_source(recipe, out / recipe.name), PGORow()
                    if serving.with_pgo:
                        row = pgo_row(recipe, source, trees["plain"], tc, flags, serving.tests)
                    builds = [(v, flags) for v in pair]
                    speed = timed_beside_row(recipe, source, trees, row, builds, tc, timing)
                report = program_report(built, trees, policies, speed)
                report["flags"] = label
                write_report(report, out / recipe.name)
                result.pairs.append(built)
                result.reports[recipe.name] = report
            except BuildError as e:
                result.failed[recipe.name] = str(e)
            result.save(out / "build.json")
    return result


def comparison_table(result: Comparison) -> Table:
    """`mlgo build`'s table: each linked program's .text, and each package's workload CPU
    time (flagged when the package got smaller but measurably slower), build time, tests;
    the PGO build's CPU time beside, or why it was left out (in the caption)."""
    flags = next((baseline_flags(r) for r in result.reports.values()), "-Oz")
    columns = ("program", f"clang {flags} .text", "mlgo .text", "delta", "CPU time", "build s")
    table = Table(*columns, "tests")
    for plain, ml in result.pairs:
        report = result.reports[plain.package]
        speed = throughput_change(report["throughput"]) if "throughput" in report else ""
        if slower_but_smaller(report):
            speed += " [red]smaller but slower"
        for prog, base in plain.text.items():
            table.add_row(
                f"{plain.package}: {prog}",
                f"{base:,}",
                f"{ml.text[prog]:,}",
                f"{100 * (ml.text[prog] / base - 1):+.2f}%",
                speed,
                f"{plain.build_seconds:.0f} / {ml.build_seconds:.0f}",
                f"{plain.tests} / {ml.tests}",
            )
            speed = ""  # once per package
        if pgo := report.get("throughput", {}).get(PGO):
            change = throughput_change(pgo)
            if over := pgo.get("layouts"):
                change += f", over {over['layouts']} layouts {throughput_change(over)}"
            table.add_row(f"{plain.package}: {PGO_ROW}", "", "", "", change, "", pgo["tests"])
    base_total, ml_total, delta = result.totals()
    table.add_row("total", f"{base_total:,}", f"{ml_total:,}", f"{delta:+.2f}%", style="bold")
    lines = [f"{name}: {left_out(r)}" for name, r in result.reports.items() if left_out(r)]
    table.caption = "\n".join(lines) or None
    return table
