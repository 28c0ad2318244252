"""Real programs measured: the comparison `mlgo build` writes, and the paired timing and
CPU accounting that tools/bench_regalloc.py (and a later tuner) use."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from mlgo.packages.recipes import Recipe
from mlgo.programs.build import Building, ProgramBuild, Variant, build_program
from mlgo.programs.compare import Comparison, comparison_table, variants
from mlgo.programs.measure import (
    Workload,
    compare_workload,
    instructions,
    paired_change,
    round_order,
    run_workload,
    spread,
    timed_rounds,
)
from mlgo.runtime.commands import BuildError
from tests.conftest import DATA


# -- mlgo build's comparison and build.json ----------------------------------------------
def _built(package: str, variant: str, text: dict[str, int]) -> ProgramBuild:
    return ProgramBuild(package, variant, 1.0, 2.0, text, "passed")


@pytest.mark.unit
def test_comparison_totals_and_build_json(tmp_path):
    result = Comparison([Path("p")])
    result.pairs.append(
        (_built("lua", "plain", {"lua": 1000}), _built("lua", "mlgo", {"lua": 900}))
    )
    result.pairs.append(
        (_built("z", "plain", {"a": 500, "b": 500}), _built("z", "mlgo", {"a": 550, "b": 500}))
    )
    result.failed["x"] = "x (plain): build failed"
    assert result.totals() == (2000, 1950, pytest.approx(-2.5))
    result.save(tmp_path / "build.json")
    saved = json.loads((tmp_path / "build.json").read_text())
    assert saved["policies"] == ["p"] and saved["failed"] == {"x": "x (plain): build failed"}
    assert [b["variant"] for b in saved["builds"]] == ["plain", "mlgo", "plain", "mlgo"]
    assert saved["delta_pct"] == pytest.approx(-2.5)
    assert saved["throughput"] == {}
    assert Comparison([]).totals() == (0, 0, 0.0)


@pytest.mark.unit
def test_build_shows_each_packages_throughput_and_flags_smaller_but_slower(tmp_path):
    result = Comparison([Path("p")])
    for name, size_pct, iqr in (("lua", -1.0, [0.5, 1.5]), ("z", -1.0, [-0.5, 0.5])):
        result.pairs.append(
            (_built(name, "plain", {name: 1000}), _built(name, "mlgo", {name: 990}))
        )
        speed = {"change_pct": sum(iqr) / 2, "iqr_pct": iqr, "ratios_pct": iqr}
        size = {"change_pct": size_pct}
        result.reports[name] = {"package": name, "size": size, "throughput": speed}
    result.pairs.append((_built("x", "plain", {"x": 10}), _built("x", "mlgo", {"x": 10})))
    result.reports["x"] = {"package": "x", "size": {"change_pct": 0.0}}  # no workload
    result.save(tmp_path / "build.json")
    saved = json.loads((tmp_path / "build.json").read_text())["throughput"]
    assert set(saved) == {"lua", "z"} and saved["lua"]["iqr_pct"] == [0.5, 1.5]
    console = Console(width=200, record=True)
    console.print(comparison_table(result))
    rows = {line.split()[1]: line for line in console.export_text().splitlines() if ": " in line}
    assert "+1.00% (IQR +0.50..+1.50%) smaller but slower" in rows["lua:"]
    assert "+0.00% (IQR -0.50..+0.50%)" in rows["z:"] and "slower" not in rows["z:"]
    assert "IQR" not in rows["x:"]


# -- measurement: ABBA rounds, the workload's own CPU ------------------------------------
@pytest.mark.unit
def test_rounds_alternate_abba_and_spread_is_the_median_and_quartiles():
    assert [list(round_order(r, ("a", "b"))) for r in range(3)] == [
        ["a", "b"],
        ["b", "a"],
        ["a", "b"],
    ]
    # three (a policy between a build and its A/A control): every place alike in 6 rounds
    places = [list(round_order(r, "abc")).index(v) for v in "abc" for r in range(6)]
    assert [sorted(places[v * 6 : v * 6 + 6]) for v in range(3)] == [[0, 0, 1, 1, 2, 2]] * 3
    order = []
    times = timed_rounds(4, ("a", "b"), lambda v: (order.append(v), (1.0, 2.0))[1])
    assert order == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert times == {
        "wall": {"a": [1.0] * 4, "b": [1.0] * 4},
        "cpu": {"a": [2.0] * 4, "b": [2.0] * 4},
    }
    # rounds of three turns: the builds take turns run by run, a round sums its turns
    order.clear()
    times = timed_rounds(2, ("a", "b"), lambda v: (order.append(v), (1.0, 2.0))[1], turns=3)
    assert "".join(order) == "abbaab" + "baabba"
    assert times["cpu"] == {"a": [6.0, 6.0], "b": [6.0, 6.0]}
    s = spread([1.0, 2.0, 3.0, 4.0, 100.0])
    assert (s["median"], s["min"], s["max"]) == (3.0, 1.0, 100.0)
    assert paired_change([1.1, 2.2], [1.0, 2.0])["median"] == pytest.approx(0.1)
    assert spread([5.0])["q1"] == spread([5.0])["q3"] == 5.0


BUSY = (
    "python3",
    "-c",
    "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.2: pass",
)


@pytest.mark.unit
def test_workload_cpu_is_its_own_and_a_failure_is_one_error(tmp_path):
    busy = Workload("busy", (), (BUSY,), check="true")
    sleepy = Workload("sleepy", (), (("sleep", "0.3"),))
    run = run_workload(busy, tmp_path, loops=2)
    assert run.cpu >= 0.35 and run.wall >= run.cpu * 0.5 and 0 < run.user <= run.cpu
    run = run_workload(sleepy, tmp_path)
    assert run.wall >= 0.3 and run.cpu < 0.1  # waiting is not CPU
    with pytest.raises(BuildError, match="false failed in"):
        run_workload(Workload("f", (), (("false",),)), tmp_path)
    with pytest.raises(BuildError, match="the workload's result is wrong"):
        run_workload(Workload("c", (), (("true",),), check="exit 1"), tmp_path)


@pytest.mark.unit
def test_two_builds_that_print_different_results_are_refused(tmp_path):
    for tree, word in (("a", "one 1.5s"), ("b", "two 2.5s")):
        (tmp_path / tree).mkdir()
        (tmp_path / tree / "out.txt").write_text(word)
    trees = {"default": tmp_path / "a", "policy": tmp_path / "b"}
    prints = Workload("p", (), (("cat", "out.txt"),), volatile=r"\S+ \d\.\ds")
    measured = compare_workload(prints, trees, repeats=2, min_seconds=0.001, callgrind=False)
    assert measured["loops"] >= 1 and len(measured["cpu_delta_paired"]["runs"]) == 2
    assert len(measured["cpu_control_paired"]["runs"]) == 2  # the baseline against itself
    assert set(measured["default"]) == {"wall_seconds", "cpu_seconds"}
    with pytest.raises(BuildError, match="the two builds print different results") as e:
        compare_workload(Workload("p", (), (("cat", "out.txt"),)), trees, 0, callgrind=False)
    assert "line 1: 'one 1.5s' against 'two 2.5s'" in str(e.value)
    assert "\n" not in str(e.value)  # one line
    (tmp_path / "b" / "out.txt").write_text("one 1.5s\nmore")
    with pytest.raises(BuildError, match="line 2: '\\(end of output\\)' against 'more'"):
        compare_workload(Workload("p", (), (("cat", "out.txt"),)), trees, 0, callgrind=False)


@pytest.mark.toolchain
def test_instructions_count_a_program_whose_stderr_is_sent_away(tmp_path):
    loop = "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done"
    counted = {
        redirect: instructions(
            Workload("w", (), (("sh", "-c", f"sh -c '{loop}' {redirect}; echo done"),)), tmp_path
        )
        for redirect in ("", "2>/dev/null")
    }
    quiet, loud = counted["2>/dev/null"], counted[""]
    assert loud > 10_000_000  # the inner shell's loop is counted
    assert abs(quiet - loud) < 0.05 * loud  # and it still is with its stderr sent away


def test_both_variants_compile_with_the_same_clang(tc):
    # the benchmark's mlgo-cc builds used to leave MLGO_CC/MLGO_CXX unset, so its wrapper
    # could pick another clang than the plain build's
    plain, served = variants(tc, {"MLGO_SOCKET": "s"}, ("default", "policy"))
    assert (plain.name, plain.compilers, plain.env) == ("default", (tc.clang, tc.clangxx), {})
    assert served.env == {"MLGO_SOCKET": "s", "MLGO_CC": tc.clang, "MLGO_CXX": tc.clangxx}
    assert [Path(c).name for c in served.compilers] == ["mlgo-cc", "mlgo-c++"]
    _, guarded = variants(tc, {"MLGO_SOCKET": "s"}, guard=True)
    assert guarded.env == dict(served.env, MLGO_GUARD="size")


# the tests' word counter, configured (a file written, each run counted beside the tree)
WORDCOUNT = Recipe(
    "wordcount",
    "",
    ('"$CC" main.c hash.c strbuf.c -o wordcount',),
    configure=("echo ran >> ../configure-runs && echo '#define N 1' > config.h",),
    programs=("wordcount",),
    bench=("sh -c './wordcount < main.c'",),
)


def test_a_configured_tree_is_copied_while_what_configure_saw_is_the_same(tc, tmp_path):
    # a speed tune builds the project once a candidate, and only the policy differs
    recipe, kept, runs = WORDCOUNT, tmp_path / "configured", tmp_path / "configure-runs"

    def built(flags: list[str]) -> ProgramBuild:
        return build_program(
            recipe,
            DATA / "minipkg",
            tmp_path / "tree",
            tc,
            Variant("plain", (tc.clang, tc.clangxx), {}),
            flags,
            Building(tests=False, configured=kept),
        )

    first = built(["-O2"])
    made = (tmp_path / "tree" / "config.h").stat().st_mtime_ns
    again = built(["-O2"])
    assert runs.read_text().count("ran") == 1  # configured once, copied the second time
    assert (tmp_path / "tree" / "config.h").stat().st_mtime_ns == made  # times kept
    assert again.text == first.text
    built(["-Oz"])  # the compilers' flags are what configure saw: configured again
    assert runs.read_text().count("ran") == 2


@pytest.mark.slow  # two package builds at once
def test_a_workloads_judge_costs_two_builds_at_once_each_in_its_own_tree(tc, tmp_path):
    """A speed tune's candidates are built and costed SIDE_BY_SIDE, each slot in its own
    tree, service and configured copy; a cost is the same whichever slot built it, twins
    are built once, and no tree is left."""
    from mlgo.data import shipped_policy
    from mlgo.problems import get_problem
    from mlgo.problems.policy_files import load_policy
    from mlgo.programs.speed import SIDE_BY_SIDE, WorkloadReward
    from mlgo.train.calibrate import NEVER

    policy = load_policy(shipped_policy("inlining-size"))
    clangs = replace(policy, departure_threshold=NEVER)
    size = get_problem("inlining-size")
    judged = tmp_path / "judged"
    reward = WorkloadReward(WORDCOUNT, DATA / "minipkg", judged, tc, size)
    changes = reward.changes({"policy": policy, "twin": replace(policy), "clang's": clangs})
    assert SIDE_BY_SIDE == 2 and reward.take_compiles() == 3  # plain, and two policies
    assert changes["policy"] == changes["twin"]
    made = {p.name for p in judged.iterdir() if p.is_dir()}
    assert {"configured", "service-0", "service-1"} <= made
    assert not made & {"plain", "served-0", "served-1"}  # each tree removed once costed
    assert sorted(p.name for p in (judged / "configured").iterdir()) == [
        "plain", "served-0", "served-1"
    ]  # fmt: skip
    alone = WorkloadReward(WORDCOUNT, DATA / "minipkg", tmp_path / "alone", tc, size)
    assert alone.change(clangs) == changes["clang's"]  # slot 0 alone, whichever built it
    assert alone.change(policy) == changes["policy"]
