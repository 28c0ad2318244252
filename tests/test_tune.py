"""`mlgo tune` on small real projects: record, train for a budget, build twice, test,
measure, report; killed and rerun, it resumes; a failing test stops it with its log."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from mlgo.corpus.format import load_corpus
from mlgo.llvm.sizes import elf_texts, text_size
from mlgo.problems.inlining_speed import THRESHOLDS
from mlgo.runtime.commands import BuildError
from mlgo.ship import decisions
from tests.conftest import DATA, MLGO, run_mlgo
from tools.lab.decisions_figure import (
    A_A,
    DECIDED,
    SERVED_COLD,
    SERVED_REMEMBERED,
    build_instructions,
    cpu_rounds,
    identity_build,
    kept_identity,
    tuned_project,
)

pytestmark = pytest.mark.toolchain

SUMMARIZE = "build/summarize 1 2 3 4 5 6"


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory):
    """Recording work directories and stats caches stay in the tests' own directory."""
    old = os.environ.get("MLGO_CACHE")
    os.environ["MLGO_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    yield
    if old is None:
        del os.environ["MLGO_CACHE"]
    else:
        os.environ["MLGO_CACHE"] = old


def cmake_args(src: Path, out: Path, test: str, minutes: str = "0.05") -> list[str]:
    """`mlgo tune` on the CMake project: configure and build out of tree, a test that
    checks the program's answer, and a workload that runs it."""
    return [
        "tune",
        "--source", str(src),
        "--configure", "cmake -B build",
        "--build", "cmake --build build",
        "--test", test,
        "--bench", SUMMARIZE,
        "--bench-rounds", "2",
        "--minutes", minutes,
        "--out", str(out),
    ]  # fmt: skip


GOOD_TEST = "build/summarize 1 3 | grep -qx 'mean 2 var 1'"


def stages(out: Path) -> list[str]:
    record = out / "stages.json"
    return json.loads(record.read_text())["finished"] if record.exists() else []


@pytest.fixture(scope="module")
def tuned(cache, tmp_path_factory: pytest.TempPathFactory):
    """The CMake project tuned into an OUT inside its own source: first killed in
    training, then rerun with a failing test (allowed: no build finished yet), then
    rerun as at first, to the end."""
    src = shutil.copytree(DATA / "record" / "cmake", tmp_path_factory.mktemp("p") / "cmake")
    out = src / "tuned"
    args = cmake_args(src, out, GOOD_TEST)
    err = tmp_path_factory.mktemp("log") / "stderr"  # a file: an unread pipe could fill, block it
    with err.open("w") as f:
        proc = subprocess.Popen(
            [*MLGO, *args], stdout=subprocess.DEVNULL, stderr=f, start_new_session=True
        )
    deadline = time.monotonic() + 300
    state = out / "train" / "state.json"
    while proc.poll() is None and time.monotonic() < deadline:
        if state.exists() and json.loads(state.read_text())["step"] >= 1:
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the run and its compile workers
    proc.wait()
    stderr = err.read_text()
    killed = {"stages": stages(out), "step": json.loads(state.read_text())["step"]}
    assert killed["stages"] == ["snapshot", "profile", "record", "rehearse", "collect"], stderr
    failing = run_mlgo(*cmake_args(src, out, "build/summarize 1 3 | grep -q nope"), timeout=600)
    after_failing = stages(out)
    done = run_mlgo(*args, timeout=600)
    assert done.returncode == 0, done.stderr + done.stdout
    return src, out, args, killed, failing, after_failing, done


def elf_text(tree: Path) -> dict[str, int]:
    return {
        str(p.relative_to(tree)): text_size(p)
        for p in tree.rglob("*")
        if p.is_file() and not p.is_symlink() and p.read_bytes()[:4] == b"\x7fELF"
    }


@pytest.mark.slow
def test_tune_reports_size_over_every_elf_file_tests_and_throughput(tuned):
    src, out, _, _, _, _, done = tuned
    report = json.loads((out / "report.json").read_text())
    assert report["tests"] == {"baseline": "passed", "policy": "passed"}
    assert report["problem"] == "inlining-size" and report["level"] == "-Oz"
    assert (Path(report["policy"]) / "policy.npz").is_file()
    size = report["size"]
    plain, ml = (elf_text(out / "programs" / v) for v in ("plain", "mlgo"))
    assert "build/summarize" in plain and set(plain) == set(ml)
    assert size["baseline"] == sum(plain.values()) and size["policy"] == sum(ml.values())
    assert size["change_pct"] == pytest.approx(100 * (size["policy"] / size["baseline"] - 1))
    every = json.loads((out / "per_file.json").read_text())  # apart from report.json
    assert {f["path"]: f["policy"] for f in every} == ml and "per_file" not in size
    speed = report["throughput"]
    q1, q3 = speed["iqr_pct"]
    assert q1 <= speed["change_pct"] <= q3 and len(speed["ratios_pct"]) == 2
    assert "instructions_change_pct" in speed  # valgrind is installed here
    training = report["training"]
    assert training["algorithm"] == "bcmax"
    # the default, the start, the trained policy and its gated forms, measured; the least kept
    changes = training["candidates_change_pct"]
    assert {"default", "shipped", "trained", "trained, gated at 0.8"} <= set(changes)
    assert changes["default"] == 0.0 and changes[training["chosen"]] == min(changes.values())
    assert training["headroom_pct"] <= 0.0  # the search keeps the default's trajectory at worst
    assert "ELF files" in done.stdout and "CPU time" in done.stdout and "passed" in done.stdout
    # training starts from the shipped policy: the default's decisions are not collected
    assert not (out / "traces").exists()
    # the snapshot left out the OUT inside the source
    assert (out / "pristine" / "CMakeLists.txt").is_file() and not (
        out / "pristine" / "tuned"
    ).exists()


@pytest.mark.slow
def test_a_tune_keeps_its_decisions_and_its_report_is_the_build_from_them(tuned):
    """OUT/decisions: a file only where the policy departs from clang and builds smaller;
    the user's own build of the source through its `cc` and `c++` gives every object and
    program the report measured."""
    src, out, _, _, _, _, done = tuned
    report = json.loads((out / "report.json").read_text())
    assert report["built_from"] == "decisions" and "from " + str(out / "decisions") in done.stdout
    artifact = decisions.read(out / "decisions")
    summary = report["decisions"]
    assert (summary["files"], summary["links"], summary["stale"]) == (len(artifact.files), 0, 0)
    saved = f"{summary['text_saved']} bytes of .text saved against clang's own"
    assert saved in done.stdout and "changed since decided" not in done.stdout
    inl = out / "decisions" / "files"
    assert {str(p.relative_to(inl))[: -len(".inl")] for p in inl.rglob("*.inl")} == set(
        artifact.files
    )
    for unit in artifact.files.values():
        assert unit["departures"] > 0 and unit["text"]["saved"] > 0
    judged = set(artifact.files) | {n.removeprefix("files/") for n in artifact.clangs_own}
    assert judged == {"lib/stats.c", "app/summarize.cpp"}
    flags = "-Oz -g0"
    env = dict(os.environ, CC=str(out / "decisions" / "cc"), CXX=str(out / "decisions" / "c++"))
    env |= {"CFLAGS": flags, "CXXFLAGS": flags}
    for command in (["cmake", "-B", "build"], ["cmake", "--build", "build"]):
        subprocess.run(command, cwd=src, env=env, check=True, capture_output=True)
    assert elf_text(src / "build") == elf_text(out / "programs" / "mlgo" / "build")
    shown = run_mlgo("decisions", "show", "--functions", str(out / "decisions"), timeout=60)
    assert shown.returncode == 0 and len(shown.stdout.splitlines()) >= len(judged)


@pytest.mark.slow
def test_the_figure_builds_a_tune_from_its_decisions_with_the_kept_builds_machine_code(
    tuned, tc, tmp_path
):
    """Issue 59's figure (tools/bench_decisions.py --tune): the project built again from
    OUT/decisions and tested has every object's and program's machine code of the tune's
    kept build; a changed object is named."""
    _, out, _, _, _, _, _ = tuned
    recipe, problem = tuned_project(out)
    same = identity_build(recipe, out, tmp_path, tc, problem)
    assert same.differing == [] and same.same == same.compared >= 3
    built = tmp_path / "decisions"
    program = next(p for p in built.rglob("summarize") if p.is_file())
    shutil.copy(next(built.rglob("stats.c.o")), program)
    changed = kept_identity(built, out)
    assert changed.differing == [str(program.relative_to(built))]
    with pytest.raises(BuildError, match="tune.json"):
        tuned_project(tmp_path)


@pytest.mark.slow
def test_the_figure_times_the_decisions_beside_the_policy_served_as_builds_get_it_today(
    tuned, tc, tmp_path
):
    """Issue 59's cost rows: each way built once; the build from decisions links the kept
    build's programs, and the service's builds are mlgo-cc's, guarded, its CPU counted."""
    _, out, _, _, _, _, _ = tuned
    recipe, problem = tuned_project(out)
    rows = cpu_rounds(recipe, out, tmp_path, tc, problem, 1)
    assert list(rows) == ["plain", A_A, DECIDED, SERVED_COLD, SERVED_REMEMBERED]
    kept = sum(t for t, linked in elf_texts(out / "programs" / "mlgo").values() if linked)
    assert rows[DECIDED].programs_text == kept < rows["plain"].programs_text
    for name in (SERVED_COLD, SERVED_REMEMBERED):
        assert rows[name].programs_text <= rows["plain"].programs_text
        assert rows[name].service_cpu_s >= 0 and len(rows[name].change["runs"]) == 1
    assert rows["plain"].service_cpu_s == rows[DECIDED].service_cpu_s == 0
    assert (tmp_path / "served-0" / "build").is_dir() and (tmp_path / "served").is_dir()


@pytest.mark.slow
def test_the_figure_counts_a_rebuilds_instructions_plain_and_from_decisions(tuned, tc, tmp_path):
    """Each compile and link is counted with the processes the wrapper runs: the build from
    decisions runs more (its grep and cksum, and locations in a -g0 compile)."""
    _, out, _, _, _, _, _ = tuned
    recipe, problem = tuned_project(out)
    counts = build_instructions(recipe, out, tmp_path, tc, problem)
    assert counts["decisions"] > counts["plain"] > 10_000_000


@pytest.mark.slow
def test_a_killed_tune_resumes_training_where_it_stopped(tuned):
    _, out, _, killed, _, _, _ = tuned
    curve = json.loads((out / "report.json").read_text())["training"]["curve"]
    assert len(curve) >= killed["step"] >= 1
    assert [c["step"] for c in curve] == list(range(1, len(curve) + 1))
    assert stages(out) == [
        *["snapshot", "profile", "record", "rehearse", "collect"],
        *["train", "decisions", "build", "pgo", "bench", "report"],
    ]


@pytest.mark.slow
def test_a_refresh_judges_only_the_changed_source_with_the_policy_trained_before(
    tuned, tmp_path: Path
):
    """The tuned project copied elsewhere and one source it judged edited: --refresh copies
    the new source, judges that file's decisions again and keeps every other verdict, with
    no training; the build from the decisions passes its tests."""

    def no_build_tree(directory: str, names: list[str]) -> list[str]:
        return ["build"] if Path(directory) == tuned[0] else []  # another test built there

    src = shutil.copytree(tuned[0], tmp_path / "cmake", symlinks=True, ignore=no_build_tree)
    out = src / "tuned"
    summary = json.loads((out / "decisions" / "summary.json").read_text())
    judged = [f"files/{name}" for name in summary["files"]]
    judged += [name for name in summary["clangs_own"] if name.startswith("files/")]
    edited = sorted(judged)[0]
    source = src / edited.removeprefix("files/")
    source.write_text(source.read_text() + "\nint mlgo_refresh_added(void) { return 1; }\n")
    trained = (out / "policy" / "policy.npz").read_bytes()
    done = run_mlgo(*cmake_args(src, out, GOOD_TEST), "--refresh", timeout=600)
    assert done.returncode == 0, done.stderr + done.stdout
    report = json.loads((out / "report.json").read_text())
    refreshed = {"judged_again": [edited], "as_before": len(judged) - 1}
    assert report["decisions"]["refreshed"] == refreshed
    assert report["tests"] == {"baseline": "passed", "policy": "passed"}
    assert (out / "policy" / "policy.npz").read_bytes() == trained
    assert "training inlining-size from" not in done.stdout
    assert (out / "pristine" / edited.removeprefix("files/")).read_text() == source.read_text()
    assert stages(out) == [
        *["snapshot", "profile", "record", "rehearse", "collect"],
        *["train", "decisions", "build", "pgo", "bench", "report"],
    ]


@pytest.mark.slow
def test_a_failing_test_stops_with_one_line_naming_its_log(tuned):
    _, out, _, _, failing, after_failing, _ = tuned
    assert failing.returncode == 2, failing.stderr
    assert "Traceback" not in failing.stderr
    (line,) = [x for x in failing.stderr.splitlines() if x.startswith("error:")]
    assert "its own tests failed" in line and f"log: {out / 'programs' / 'plain.log'}" in line
    assert after_failing == [
        *["snapshot", "profile", "record", "rehearse", "collect", "train", "decisions"]
    ]


@pytest.mark.slow
def test_a_rerun_redoes_nothing_and_other_arguments_are_refused(tuned):
    _, out, args, _, _, _, _ = tuned
    finished, report = stages(out), (out / "report.json").read_text()
    again = run_mlgo(*args, timeout=120)
    assert again.returncode == 0 and "ELF files" in again.stdout
    assert "training inlining-size from" not in again.stdout and "building" not in again.stdout
    assert "keeping the search's and the policy's" not in again.stdout  # the stage is done
    assert stages(out) == finished and (out / "report.json").read_text() == report
    changed = [*args[:-3], "0.01", *args[-2:]]  # --minutes 0.01, not 0.05: less is refused
    r = run_mlgo(*changed, timeout=120)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "tuned before with minutes 0.05, not 0.01" in r.stderr


@pytest.mark.slow
def test_a_wrong_test_or_a_bench_printing_timings_or_unfixed_stops_before_training(cache, tmp_path):
    src = shutil.copytree(DATA / "minipkg", tmp_path / "wordcount")
    out = tmp_path / "out"
    build = 'for f in *.c; do "$CC" -c "$f" || exit 1; done && "$CC" -o wordcount *.o'
    good_test = "echo 'a b a' | ./wordcount | grep -qx 'words: 3 distinct: 2'"

    def tune(test: str, bench: str) -> subprocess.CompletedProcess:
        return run_mlgo("tune", "--source", str(src), "--build", build, "--test", test,
                        "--bench", bench, "--out", str(out), timeout=300)  # fmt: skip

    failing = tune("./wordcount < /dev/null | grep -q nope", "./wordcount < main.c")
    assert failing.returncode == 2 and "Traceback" not in failing.stderr
    (line,) = failing.stderr.strip().splitlines()
    assert "its own tests, on the recorded build before training failed" in line
    assert f"log: {out / 'rehearsal.log'}" in line
    timings = tune(good_test, "./wordcount < main.c; date +%N")
    assert timings.returncode == 2 and "Traceback" not in timings.stderr
    (line,) = timings.stderr.strip().splitlines()
    assert "--bench: two runs of the same build print different results (line 2:" in line
    unstarted = tune(good_test, "./wordcount-typo < main.c | md5sum")  # prints a checksum
    assert unstarted.returncode == 2 and "Traceback" not in unstarted.stderr
    (line,) = unstarted.stderr.strip().splitlines()
    assert "--bench: a command of './wordcount-typo < main.c | md5sum' exited 127" in line
    # work that grows from run to run, as a benchmark that runs for a fixed time's does
    growing = "echo x >> runs; for i in $(seq $(wc -l < runs)); do ./wordcount < main.c; done"
    unfixed = tune(good_test, f"{growing} > /dev/null")
    assert unfixed.returncode == 2 and "Traceback" not in unfixed.stderr
    (line,) = unfixed.stderr.strip().splitlines()
    assert "--bench: two runs of the same build executed" in line and "same work" in line
    assert stages(out) == ["snapshot", "profile", "record"]  # recorded once, rehearsed four times
    assert not (out / "train").exists() and (out / "record").is_dir()


def test_a_source_that_is_not_a_directory_is_refused(tmp_path):
    (tmp_path / "file").write_text("")
    r = run_mlgo("tune", "--source", str(tmp_path / "file"), "--build", "make",
                 "--out", str(tmp_path / "out"), timeout=60)  # fmt: skip
    assert r.returncode == 2 and "not a directory" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def test_the_snapshot_leaves_out_a_cmake_build_tree_made_in_the_source(tmp_path):
    """A user who built in their source tree (`cmake -B build`) tunes it as it is: the copy
    leaves that tree out, saying so (cmake refuses a cache made in another directory), and
    keeps everything else, a build directory without a cache too."""
    from mlgo.programs.tune import snapshot

    src = shutil.copytree(DATA / "record" / "cmake", tmp_path / "cmake")
    subprocess.run(["cmake", "-B", "build"], cwd=src, check=True, capture_output=True)
    (src / "other").mkdir()
    (src / "other" / "notes.txt").write_text("kept")
    said: list[str] = []
    pristine = snapshot(src, tmp_path / "out" / "pristine", said.append)
    assert not (pristine / "build").exists() and (pristine / "other" / "notes.txt").is_file()
    assert said == [f"leaving {src / 'build'} out of the copy: a CMake build tree"]
    kept = {p.relative_to(src) for p in src.rglob("*") if "build" not in p.parts}
    assert kept == {p.relative_to(pristine) for p in pristine.rglob("*")}
    configured = subprocess.run(["cmake", "-B", "build"], cwd=pristine, capture_output=True)
    assert configured.returncode == 0, configured.stderr


def test_a_refresh_of_an_out_with_no_finished_training_is_one_line(tmp_path):
    out = tmp_path / "out"
    r = run_mlgo("tune", "--source", str(DATA / "minipkg"), "--build", "make",
                 "--out", str(out), "--refresh", timeout=60)  # fmt: skip
    assert r.returncode == 2
    assert r.stderr == f"error: --refresh: {out} holds no finished training; tune without it\n"


def test_a_start_policy_of_another_problem_is_refused(tmp_path):
    r = run_mlgo("tune", "--source", str(DATA / "minipkg"), "--build", "make",
                 "--problem", "regalloc-eviction", "--policy", "policies/inlining-size",
                 "--out", str(tmp_path / "out"), timeout=60)  # fmt: skip
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "policies/inlining-size is a inlining-size policy, not regalloc-eviction" in r.stderr
    assert not (tmp_path / "out").exists()


def wordcount_args(tmp_path: Path, *options: str) -> tuple[Path, list[str]]:
    """`mlgo tune` with OPTIONS on a copy of the minipkg program (built by a shell line, with
    a test of its answer), into TMP_PATH/out."""
    src = shutil.copytree(DATA / "minipkg", tmp_path / "wordcount")
    out = tmp_path / "out"
    args = [
        "tune",
        "--source", str(src),
        "--build", 'for f in *.c; do "$CC" -c "$f" || exit 1; done && "$CC" -o wordcount *.o',
        "--test", "echo 'a b a' | ./wordcount | grep -qx 'words: 3 distinct: 2'",
        *options,
        "--out", str(out),
    ]  # fmt: skip
    return out, args


@pytest.mark.slow
def test_with_a_workload_eviction_trains_and_is_judged_on_its_block_cost(cache, tmp_path):
    """A speed problem with --bench: evolution strategies score each policy by its build's
    blocks costed on the workload's callgrind counts, the candidates are judged so, the
    cheapest kept; the table leads with CPU time."""
    bench = "./wordcount < main.c"
    out, args = wordcount_args(tmp_path, "--problem", "regalloc-eviction", "--bench", bench)
    r = run_mlgo(
        *args, "--minutes", "0.02", "--train-steps", "1", "--bench-rounds", "2", timeout=900
    )
    assert r.returncode == 0, r.stderr + r.stdout
    training = json.loads((out / "report.json").read_text())["training"]
    assert training["algorithm"] == "es" and training["steps"] >= 1
    first = training["curve"][0]  # a step: 4 directions, each way, a build each
    assert first["compiles"] >= 8 and "es/batch_reward_mean" in first
    assert "callgrind" in training["judged_by"]
    changes = training["judged_change_pct"]
    assert set(changes) == {"shipped", "trained"} and training["chosen"] in changes
    assert all(math.isfinite(c) for c in changes.values())
    kept_by_the_clock(training, out)
    assert "chosen by the workload's block cost" in r.stdout
    table = r.stdout[r.stdout.index("mlgo-cc") :]
    assert table.index("CPU time") < table.index("ELF files")


def kept_by_the_clock(training: dict, out: Path) -> None:
    """A speed tune's choice: the cheapest few by the workload's block cost (distinct
    costs, each cheaper than clang's own), timed against the plain build with an A/A
    control; kept, the fastest whose IQR is below zero, or else clang's own (where the
    problem cannot gate, the cheapest by the cost). Every build costed is kept in
    OUT/judged/costs.json, and its tree removed."""
    judged, timed = training["judged_change_pct"], training.get("clock_change_pct", {})
    cheaper = sorted({c for c in judged.values() if c < 0})[:3]
    assert sorted(judged[n] for n in timed) == cheaper
    if timed:  # over the layouts of each (`--layouts`, 4 by default)
        control = training["clock_control_pct"]
        assert control["iqr_pct"][0] <= control["change_pct"] <= control["iqr_pct"][1]
        assert control["layouts"] == 4 and all(t["layouts"] == 4 for t in timed.values())
    faster = {n: t["change_pct"] for n, t in timed.items() if t["iqr_pct"][1] < 0}
    fallback = "default" if "default" in judged else min(judged, key=judged.__getitem__)
    assert training["chosen"] == (min(faster, key=faster.__getitem__) if faster else fallback)
    costs = json.loads((out / "judged" / "costs.json").read_text())
    assert "plain" in costs and len(costs) >= len(set(judged.values()))
    trees = {p.name for p in (out / "judged").iterdir() if p.is_dir()}
    assert not trees & {"plain", "served-0", "served-1", "clock"}


@pytest.mark.slow
def test_inlining_for_speed_starts_from_clangs_own_decisions_and_trains_on_the_workload(
    cache, tmp_path, monkeypatch
):
    """inlining-speed has no shipped policy: clang's own -O2 decisions on the project are
    cloned for a start, gated to depart from none of them; evolution strategies (not
    BC-Max: no module's search sees a workload) train on the workload's block cost, which
    judges every candidate, clang's own decisions at each inline threshold of the grid too;
    where one is faster, the search departs from it."""
    bench = "./wordcount < main.c"
    out, args = wordcount_args(tmp_path, "--problem", "inlining-speed", "--bench", bench)
    monkeypatch.setenv("COLUMNS", "160")  # the table's rows each on one line, to be read
    r = run_mlgo(
        *args, "--minutes", "0.02", "--train-steps", "1", "--bench-rounds", "2", timeout=900
    )
    assert r.returncode == 0, r.stderr + r.stdout
    assert "training inlining-speed from clang's own, cloned (-O2)" in r.stdout
    report = json.loads((out / "report.json").read_text())
    assert (report["problem"], report["level"]) == ("inlining-speed", "-O2")
    assert report["tests"] == {"baseline": "passed", "policy": "passed"}
    start = json.loads((out / "start" / "policy" / "policy.json").read_text())
    assert start["problem"] == "inlining-speed" and "departure_threshold" in start
    training = report["training"]
    assert training["algorithm"] == "es" and training["curve"][0]["compiles"] >= 8
    # the minutes are training's and judging's: judging's share, as builds so far took, kept
    # (the step asked for is taken: without --train-steps, none would fit in 0.02 minutes)
    assert training["budget_s"] == 1.2 and training["judging_kept_s"] > 0
    assert training["training_s"] == 1.0 and "kept for judging its candidates" in r.stdout
    changes = training["judged_change_pct"]
    bases = [f"clang's own, -inline-threshold={t}" for t in THRESHOLDS]  # the earliest wins
    assert {"default", "clang's own, cloned", "trained", *bases} <= set(changes)
    kept_by_the_clock(training, out)
    over = report["throughput"]["layouts"]  # both builds timed over 4 shuffled layouts too
    assert over["layouts"] == 4 and len(over["per_layout_pct"]) == 4
    assert over["iqr_pct"][0] <= over["change_pct"] <= over["iqr_pct"][1]
    assert "CPU time over 4 layouts" in r.stdout
    assert "PGO from your workload, over 4 layouts" in r.stdout
    assert all(math.isfinite(changes[b]) for b in bases)
    # more inlining makes this workload cheaper: the search starts from clang's own at the
    # fastest threshold, traced and cloned there, which builds what that threshold builds
    fastest = min(bases, key=changes.__getitem__)
    threshold = int(fastest.rpartition("=")[2])
    assert changes[fastest] < 0 and changes["default"] == 0.0
    based = json.loads((out / f"start-{threshold}" / "policy" / "policy.json").read_text())
    assert based["base"] == threshold and "departure_threshold" in based
    assert changes[f"clang's own, cloned, -inline-threshold={threshold}"] == changes[fastest]
    # the PGO row: the build with the workload's profile, tested and timed beside
    pgo = report["throughput"]["pgo"]
    assert pgo["tests"] == "passed" and len(pgo["ratios_pct"]) == 2
    assert pgo["profile"] == str((out / "programs" / "profile" / "default.profdata").resolve())
    assert "PGO from your workload" in r.stdout and "measuring the workload on 3 builds" in r.stdout
    over = pgo["layouts"]  # and over the same 4 layouts, in the same rounds
    assert over["layouts"] == 4 and over["iqr_pct"][0] <= over["change_pct"] <= over["iqr_pct"][1]


@pytest.mark.slow
def test_a_tune_on_top_of_pgo_departs_from_clang_with_the_profile_and_is_judged_against_it(
    cache, tmp_path, monkeypatch
):
    """--pgo: the workload's profile is made once, before recording, and every build uses it
    (the corpus carries its counts); the baseline is the PGO build, so the policy's change
    is against PGO, and the build without the profile is timed beside it, PGO's own gain
    said round by round."""
    bench = "./wordcount < main.c"
    out, args = wordcount_args(tmp_path, "--problem", "inlining-speed", "--bench", bench, "--pgo")
    monkeypatch.setenv("COLUMNS", "160")  # the table's rows each on one line, to be read
    r = run_mlgo(*args, "--minutes", "0.02", "--bench-rounds", "2", "--layouts", "2", timeout=900)
    assert r.returncode == 0, r.stderr + r.stdout
    assert stages(out)[:3] == ["snapshot", "profile", "record"]
    profile = (out / "profile" / "default.profdata").resolve()
    assert all(m.profiled for m in load_corpus(out / "corpus").modules)
    report = json.loads((out / "report.json").read_text())
    assert report["flags"] == "-O2 -fprofile-instr-use"
    assert "clang -O2 -fprofile-instr-use" in r.stdout
    speed = report["throughput"]
    assert "pgo" not in speed and "pgo_left_out" not in speed  # the baseline is the PGO build
    unprofiled = speed["unprofiled"]
    assert (unprofiled["tests"], unprofiled["profile"]) == ("passed", str(profile))
    assert len(unprofiled["ratios_pct"]) == 2 and unprofiled["layouts"]["layouts"] == 2
    inverse = [100 * (100 / (100 + x) - 1) for x in unprofiled["ratios_pct"]]
    assert speed["pgo_iqr_pct"][0] <= speed["pgo_change_pct"] <= speed["pgo_iqr_pct"][1]
    assert speed["pgo_change_pct"] == pytest.approx(sum(inverse) / 2)
    assert speed["pgo_layouts"]["layouts"] == 2
    assert "PGO (the baseline) against no profile" in r.stdout
    # 0.02 minutes hold no search step (8 builds): clang's own candidates alone are judged
    training = report["training"]
    assert (training["algorithm"], training["training_s"]) == ("none", 0.0)
    assert "no search step fits in the 0.02 minutes" in r.stdout
    # the plain build is clang's own with the profile: the hot loop in hot text, the
    # build without it has none; ours replays decisions made on the profiled code
    assert ".text.hot." in _sections(out / "programs" / "plain" / "main.o")
    assert ".text.hot." not in _sections(out / "programs" / "unprofiled" / "main.o")
    assert report["tests"] == {"baseline": "passed", "policy": "passed"}
    # the decisions carry the profile they were made with: the directory is the build's
    assert (out / "decisions" / "default.profdata").read_bytes() == profile.read_bytes()
    # and the report says what the profile made hot, and what the policy changed there
    assert report["hot"]["hot_count"] > 0 and "main.c:is_word" in report["hot"]["hot_functions"]
    assert "hot code, by the profile" in r.stdout


@pytest.mark.slow
def test_on_top_of_pgo_the_search_may_read_the_profiles_counts_served_by_the_plugin(
    cache, tmp_path
):
    """--use-feature profile-inputs: the search's policy reads the profile's counts at each
    call site (at zero weight to begin with), its candidates built by mlgo-cc with the clang
    plugin, the only backend that computes them."""
    bench = "./wordcount < main.c"
    out, args = wordcount_args(
        tmp_path,
        "--problem",
        "inlining-speed",
        "--bench",
        bench,
        "--pgo",
        "--use-feature",
        "profile-inputs",
    )
    r = run_mlgo(
        *args, "--minutes", "0.02", "--train-steps", "1", "--bench-rounds", "2",
        "--layouts", "0", timeout=900,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr + r.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["training"]["algorithm"] == "es"
    assert report["tests"] == {"baseline": "passed", "policy": "passed"}
    trained = json.loads((out / "train" / "policy" / "normalization.json").read_text())
    assert trained["features"][-3:] == ["callsite_count", "callee_entry_count", "callsite_hotness"]
    start = json.loads((out / "start" / "policy" / "normalization.json").read_text())
    assert "callsite_count" not in start["features"]  # the clone reads LLVM's alone


def test_profile_inputs_without_pgo_are_refused_before_anything_is_written(tmp_path):
    out, args = wordcount_args(
        tmp_path,
        "--problem",
        "inlining-speed",
        "--bench",
        "true",
        "--use-feature",
        "profile-inputs",
    )
    r = run_mlgo(*args, timeout=60)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert (
        "--use-feature profile-inputs reads the profile's counts" in r.stderr and not out.exists()
    )


def _sections(obj: Path) -> str:
    from mlgo.llvm.toolchain import find_toolchain

    readelf = find_toolchain(None).tool("llvm-readelf")
    return subprocess.run([readelf, "-S", "-W", obj], capture_output=True, text=True).stdout


@pytest.mark.slow
def test_a_full_lto_tune_on_top_of_pgo_links_with_the_profile_and_ships_it(cache, tmp_path):
    """--lto full --pgo: the objects compiled with the profile are bitcode whose counts
    the link's inliner reads; the baseline is the PGO build linked so, the decisions
    carry the profile, and the build without it is timed beside."""
    bench = "./wordcount < main.c"
    out, args = wordcount_args(tmp_path, "--lto", "full", "--bench", bench, "--pgo")
    r = run_mlgo(*args, "--minutes", "0.02", "--bench-rounds", "2", "--layouts", "0", timeout=900)
    assert r.returncode == 0, r.stderr + r.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["flags"] == "-Oz -flto=full -fuse-ld=lld -fprofile-instr-use"
    assert report["tests"] == {"baseline": "passed", "policy": "passed"}
    assert report["throughput"]["unprofiled"]["tests"] == "passed"
    assert "pgo_change_pct" in report["throughput"] and report["hot"]["hot_count"] > 0
    profile = out / "profile" / "default.profdata"
    assert (out / "decisions" / "default.profdata").read_bytes() == profile.read_bytes()
    assert "ConstantInputWarning" not in r.stderr


def test_a_pgo_tune_whose_workload_runs_none_of_the_code_stops_in_one_line(cache, tmp_path):
    out, args = wordcount_args(tmp_path, "--problem", "inlining-speed", "--bench", "true", "--pgo")
    r = run_mlgo(*args, timeout=300)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "the workload ran none of its code (no raw profile)" in r.stderr
    assert stages(out) == ["snapshot"] and not (out / "profile" / "default.profdata").exists()


@pytest.mark.parametrize(
    ("option", "says"),
    [
        (("--problem", "inlining-speed"), "--problem inlining-speed is trained on a workload"),
        (("--pgo",), "--pgo tunes on top of a build with the workload's profile: give --bench"),
    ],
)
def test_speed_or_pgo_without_a_workload_is_refused_before_anything_is_written(
    tmp_path, option, says
):
    out, args = wordcount_args(tmp_path, *option)
    r = run_mlgo(*args, timeout=60)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert says in r.stderr and "give --bench" in r.stderr and not out.exists()


@pytest.mark.slow
def test_regalloc_eviction_tunes_at_o2(cache, tmp_path):
    out, args = wordcount_args(tmp_path, "--problem", "regalloc-eviction", "--minutes", "0.02")
    r = run_mlgo(*args, timeout=600)
    assert r.returncode == 0, r.stderr + r.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["problem"] == "regalloc-eviction" and report["level"] == "-O2"
    assert report["tests"] == {"baseline": "passed", "policy": "passed"}
    assert "throughput" not in report  # no --bench
    assert {m.opt_level for m in load_corpus(out / "corpus").modules} == {"-O2"}
    plain = elf_text(out / "programs" / "plain")
    assert "wordcount" in plain and report["size"]["baseline"] == sum(plain.values())
    assert "clang -O2" in r.stdout
    # finished without a workload, it cannot gain one on a rerun
    again = run_mlgo(*args, "--bench", "./wordcount < main.c", timeout=120)
    assert again.returncode == 2 and "tuned before with bench [], not" in again.stderr


@pytest.mark.slow
def test_lto_full_tunes_the_link_against_plain_full_lto(cache, tmp_path):
    """`--lto full`: a corpus of the link's merged module, a policy started from the
    per-file one, both builds linked by lld with full LTO, the policy's in lld's LTO."""
    out, args = wordcount_args(tmp_path, "--lto", "full", "--minutes", "0.05")
    r = run_mlgo(*args, timeout=600)
    assert r.returncode == 0, r.stderr + r.stdout
    report = json.loads((out / "report.json").read_text())
    assert (report["problem"], report["stage"]) == ("inlining-size-link", "link")
    assert report["tests"] == {"baseline": "passed", "policy": "passed"}
    assert "clang -Oz -flto=full -fuse-ld=lld" in r.stdout
    corpus = load_corpus(out / "corpus")
    assert corpus.stage == "link" and [m.name for m in corpus.modules] == ["wordcount/wordcount"]
    for variant in ("plain", "mlgo"):  # both linked by lld
        comment = subprocess.run(
            ["readelf", "-p", ".comment", str(out / "programs" / variant / "wordcount")],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        assert "LLD" in comment, (variant, comment)
    linked = report["training"]["judged_change_pct"]  # judged by lld's own LTO
    assert linked["default"] == 0.0 and report["training"]["chosen"] in linked
    chosen = linked[report["training"]["chosen"]]
    assert chosen is not None and chosen <= 0.0
    # built from its decisions: the program's where they are smaller, no file's
    assert report["built_from"] == "decisions" and report["decisions"]["files"] == 0
    artifact = decisions.read(out / "decisions")
    assert set(artifact.links) | set(artifact.clangs_own) <= {"wordcount", "links/wordcount"}
    assert len(artifact.links) + len(artifact.clangs_own) == 1


@pytest.mark.slow
def test_lto_thin_tunes_the_backends_against_plain_thinlto(cache, tmp_path):
    """`--lto thin`: a corpus of the link's backend modules, candidates judged on the
    programs as lld's ThinLTO backends make them, both builds linked by lld with ThinLTO,
    the policy's in each backend; never larger than plain ThinLTO."""
    out, args = wordcount_args(tmp_path, "--lto", "thin", "--minutes", "0.05")
    r = run_mlgo(*args, timeout=600)
    assert r.returncode == 0, r.stderr + r.stdout
    report = json.loads((out / "report.json").read_text())
    assert (report["problem"], report["stage"]) == ("inlining-size-thin", "thin-link")
    assert report["tests"] == {"baseline": "passed", "policy": "passed"}
    assert "clang -Oz -flto=thin -fuse-ld=lld" in r.stdout
    corpus = load_corpus(out / "corpus")
    assert corpus.stage == "thin-link" and corpus.modules
    assert all(m.name.startswith("wordcount/wordcount/") for m in corpus.modules)
    training = report["training"]
    assert training["judged_change_pct"]["default"] == 0.0
    assert training["judged_change_pct"][training["chosen"]] <= 0.0
    assert training["rank_correlation"]["candidates"] >= 2
    assert report["size"]["policy"] <= report["size"]["baseline"]
    # the backends' decisions, all of them, recorded at the link as the program's
    assert report["built_from"] == "decisions" and report["decisions"]["files"] == 0
    artifact = decisions.read(out / "decisions")
    assert len(artifact.links) + len(artifact.clangs_own) == 1


def test_a_larger_budget_alone_reopens_training_and_what_follows(tmp_path):
    """A stage declares the argument a larger value of which alone runs it again (training's
    budget): the record reopens there, and any other change a finished stage used is refused."""
    from mlgo.programs.tune import STAGES
    from mlgo.runtime.commands import BuildError
    from mlgo.train.stages import StageRecord, check_arguments

    args = {"minutes": 8.0, "policy": "p", "source": "s"}
    (tmp_path / "tune.json").write_text(json.dumps(args))
    names, path = [s.name for s in STAGES], tmp_path / "stages.json"
    done = StageRecord(path, names)
    done.finished = list(names)
    done.save()
    said: list[str] = []
    longer = StageRecord.load(path, names)
    check_arguments(tmp_path / "tune.json", {**args, "minutes": 60.0}, STAGES, longer, said.append)
    first = ["snapshot", "profile", "record", "rehearse", "collect"]
    assert longer.finished == first and StageRecord.load(path, names).finished == first
    assert said == ["training on from 8 to 60 minutes"]
    with pytest.raises(BuildError, match="tuned before with source 's', not 't'"):
        more = {**args, "minutes": 90.0, "source": "t"}  # more than the budget
        check_arguments(tmp_path / "tune.json", more, STAGES, StageRecord.load(path, names))


@pytest.mark.slow
def test_a_tune_decides_as_it_did_before_its_stages_were_declared(cache, tmp_path):
    """GNU units (the demo's Debian package) tuned one training step: the sizes, tests,
    candidates, choice and every kept decisions file are those the tune made before its
    stages, run object and chain were declared (tests/data/tune-before/units.json, made by
    the tune at that revision with the same command)."""
    from mlgo.packages.recipes import load_recipe
    from mlgo.programs.build import pristine_source
    from tests.tune_fingerprint import fingerprint

    recipe = load_recipe("units")
    source = pristine_source(recipe, tmp_path / "units")
    out = tmp_path / "out"
    r = run_mlgo(
        "tune", "--source", str(source), "--configure", *recipe.configure,
        "--build", *recipe.build, "--test", *recipe.test, "--minutes", "100",
        "--train-steps", "1", "--out", str(out), timeout=1800,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr + r.stdout
    before = json.loads((DATA / "tune-before" / "units.json").read_text())
    assert fingerprint(out) == before
