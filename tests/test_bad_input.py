"""Bad options, failed modules, full disks and failed commands: one line, exit non-zero,
nothing half-written and nothing lost (issue 19, items 8, 9, 13, 17)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mlgo.corpus.format import load_corpus
from mlgo.corpus.splits import load_splits
from mlgo.errors import UsageError
from mlgo.packages.recipes import load_recipe
from mlgo.programs.measure import Workload, run_workload
from mlgo.runtime.commands import BuildError
from mlgo.runtime.files import output_dir
from mlgo.runtime.inputs import MAX_JSON_DEPTH, json_depth, read_json
from tests.cli_helpers import POLICIES, mlgo, one_line_error, user_cache
from tests.conftest import DATA, MLGO, copy_corpus

# -- item 9: numeric options are range-checked when parsed ----------------------------
TUNE = ["tune", "--source", "s", "--build", "true", "--bench", "true", "--out", "o"]
BAD_OPTIONS = [
    (["collect", "--problem", "inlining-size", "--corpus", "c", "--out", "o"], "--timeout", "0"),
    (["collect", "--problem", "inlining-size", "--corpus", "c", "--out", "o"], "--timeout", "-5"),
    (["collect", "--problem", "inlining-size", "--corpus", "c", "--out", "o"], "--workers", "0"),
    (["corpus", "stats", "c"], "--workers", "zero"),
    (["train", "--corpus", "c", "--out", "o"], "--steps", "-1"),
    (["train", "--corpus", "c", "--out", "o"], "--batch", "0"),
    (["train", "--corpus", "c", "--out", "o"], "--directions", "0"),
    (["train", "--corpus", "c", "--out", "o"], "--sigma", "0"),
    (["train", "--corpus", "c", "--out", "o"], "--lr", "-0.1"),
    (["train", "--corpus", "c", "--out", "o"], "--lr", "nan"),
    (["train", "--corpus", "c", "--out", "o"], "--regression-penalty", "-1"),
    (["train", "--corpus", "c", "--out", "o"], "--max-module-seconds", "0"),
    (["train", "--corpus", "c", "--out", "o"], "--minutes", "-1"),
    (["train", "--corpus", "c", "--out", "o"], "--minutes", "nan"),
    (["train", "--corpus", "c", "--out", "o"], "--clone-epochs", "0"),
    (["train", "--corpus", "c", "--out", "o"], "--clone-lr", "0"),
    (["train", "--corpus", "c", "--out", "o"], "--clone-lr", "nan"),
    (["eval", "--policy", "p", "--corpus", "c"], "--workers", "-2"),
    (["serve"], "--idle-exit", "-1"),
    (["channel"], "--ttl", "0"),
    (["xla", "collect"], "--rounds", "0"),
    (["xla", "collect"], "--timeout", "0"),
    (["xla", "train", "--data", "d", "--out", "o"], "--steps", "0"),
    (["xla", "train", "--data", "d", "--out", "o"], "--hidden", "0"),
    (["xla", "train", "--data", "d", "--out", "o"], "--ensemble", "0"),
    (["xla", "train", "--data", "d", "--out", "o"], "--lr", "0"),
    (["xla", "train", "--data", "d", "--out", "o"], "--folds", "1"),
    (["xla", "tune", "f.py:g"], "--top-k", "0"),
    (TUNE, "--bench-seconds", "nan"),  # issue 61: it ran every stage, then a traceback
    (TUNE, "--bench-seconds", "inf"),
    (TUNE, "--bench-seconds", "1e300"),  # it hung in the workload stage
    (TUNE, "--bench-timeout", "nan"),
    (TUNE, "--bench-timeout", "0"),
]


@pytest.mark.parametrize(("command", "option", "value"), BAD_OPTIONS)
def test_a_bad_number_is_refused_when_parsed(tmp_path, command, option, value):
    r = subprocess.run(
        [*MLGO, *command, option, value], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    one_line_error(r, f"Invalid value for '{option}'")
    assert not list(tmp_path.iterdir())  # nothing ran: nothing written


def test_flags_for_a_level_clang_refuses_is_one_line_before_any_service(tmp_path):
    """The level is read first: no service is asked (or started) for flags clang refuses."""
    r = mlgo("flags", "--socket", str(tmp_path / "mlgo.sock"), "--", "-Ofoo", timeout=120)
    one_line_error(r, "clang accepts no such -O level: -Ofoo")
    assert r.stdout == "" and not list(tmp_path.iterdir())


# -- item 13: eval says how many modules failed, and exits 1 --------------------------
def test_eval_exits_1_when_modules_failed_unless_allowed(mini_corpus, tmp_path):
    cache_env = user_cache(tmp_path)
    corpus = copy_corpus(mini_corpus, tmp_path / "c")
    broken = load_corpus(corpus).modules[0]
    broken.bitcode.write_bytes(b"not bitcode")
    args = ["eval", "--policy", str(POLICIES / "inlining-size"), "--corpus", str(corpus),
            "--out", str(tmp_path / "ev")]  # fmt: skip
    r = mlgo(*args, env=cache_env)
    assert r.returncode == 1 and "1 of 3 modules failed" in r.stderr, r.stderr
    ev = json.loads((tmp_path / "ev" / "eval.json").read_text())
    assert list(ev["failed"]) == [broken.name] and ev["totals"]["modules"] == 2
    r = mlgo(*args, "--allow-failures", env=cache_env)
    assert r.returncode == 0 and "1 of 3 modules failed" in r.stderr, r.stderr


# -- item 8: a full disk is one line, and what was collected stays ----------------------
@pytest.fixture
def full_disk(tmp_path):
    """A 64 KiB tmpfs, filled up by the file `filler`."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)]
    if subprocess.run(mount, capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root with CAP_SYS_ADMIN)")
    try:
        fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT)
        with pytest.raises(OSError, match="No space"):
            while True:
                os.write(fd, bytes(1024))
        os.close(fd)
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=True)


@pytest.mark.slow
def test_a_full_disk_during_collect_is_one_line_and_resumes(mini_corpus, full_disk):
    args = ["collect", "--problem", "inlining-size", "--corpus", str(mini_corpus.root),
            "--out", str(full_disk / "t"), "--workers", "1"]  # fmt: skip
    r = mlgo(*args)
    progress, error = r.stderr.strip().splitlines()  # the bar as it stood, then why
    assert r.returncode == 2 and "0/3" in progress and "Traceback" not in r.stderr
    assert error.startswith(f"error: {full_disk / 't' / 'modules'}")
    assert error.endswith("cannot write (No space left on device)")
    assert not list(full_disk.rglob("*.tmp"))  # no half-written file
    (full_disk / "filler").unlink()
    r = mlgo(*args)
    assert r.returncode == 0 and "3 modules" in r.stdout, r.stderr


# -- item 17: a failed command writes nothing -----------------------------------------
def test_a_failed_corpus_build_or_train_leaves_no_output(tmp_path):
    r = mlgo("corpus", "build", "nosuch", "--out", str(tmp_path / "new"), "--work",
             str(tmp_path / "work"))  # fmt: skip
    assert r.returncode == 1 and r.stderr.startswith("failed nosuch: no recipe nosuch.toml")
    assert len(r.stderr.strip().splitlines()) == 1
    r = mlgo("train", "--corpus", str(tmp_path / "nowhere"), "--out", str(tmp_path / "run"))
    one_line_error(r, "corpus_description.json")
    r = mlgo("train", "--corpus", str(tmp_path / "nowhere"), "--out", str(tmp_path / "run"),
             "--algo", "es")  # fmt: skip
    one_line_error(r)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_output_dir_removes_only_what_a_failed_run_left_empty(tmp_path):
    with pytest.raises(RuntimeError), output_dir(tmp_path / "new") as out:
        (out / "a" / "b").mkdir(parents=True)
        raise RuntimeError
    assert not (tmp_path / "new").exists()
    with pytest.raises(RuntimeError), output_dir(tmp_path / "progress") as out:
        (out / "a" / "empty").mkdir(parents=True)
        (out / "a" / "state.json").write_text("{}")
        raise RuntimeError
    assert sorted(p.name for p in (tmp_path / "progress").rglob("*")) == ["a", "state.json"]
    (tmp_path / "old").mkdir()
    with pytest.raises(RuntimeError), output_dir(tmp_path / "old"):
        raise RuntimeError
    assert (tmp_path / "old").is_dir()  # not this run's to remove


# -- issue 61: inputs bounded before they are read; a workload that never ends is killed --
def test_json_nesting_is_counted_without_parsing_and_bounded(tmp_path):
    assert json_depth(b'{"a": [1, {"b": "]]]}}[[["}], "c": "\\"["}') == 3
    (tmp_path / "deep.json").write_text("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH)
    deep = read_json(tmp_path / "deep.json")  # as deep as allowed: read
    assert json_depth(json.dumps(deep).encode()) == MAX_JSON_DEPTH
    (tmp_path / "deeper.json").write_text("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1))
    with pytest.raises(UsageError, match=f"deeper.json: nested more than {MAX_JSON_DEPTH} levels"):
        read_json(tmp_path / "deeper.json")
    (tmp_path / "big.json").write_text(json.dumps(["x" * 2000]))
    with pytest.raises(UsageError, match="big.json: larger than 1 KiB"):
        read_json(tmp_path / "big.json", limit=1 << 10)
    os.mkfifo(tmp_path / "fifo.json")  # no writer: an open that waited would hang here
    with pytest.raises(UsageError, match="fifo.json: not a regular file"):
        read_json(tmp_path / "fifo.json")


def test_a_nested_corpus_description_is_one_line(mini_corpus, tmp_path):
    corpus = copy_corpus(mini_corpus, tmp_path / "c")
    (corpus / "corpus_description.json").write_text("[" * 100_000 + "]" * 100_000)
    r = mlgo("train", "--corpus", str(corpus), "--out", str(tmp_path / "run"))
    one_line_error(r, f"{corpus / 'corpus_description.json'}: nested more than")
    assert not (tmp_path / "run").exists()


def test_a_workload_past_its_timeout_is_killed_with_its_children(tmp_path):
    sleeper = tmp_path / "sleeper"
    never = Workload(
        "never", (), (("sh", "-c", f"sleep 1000 & echo $! > {sleeper}; wait"),), timeout_s=1
    )
    start = time.monotonic()
    with pytest.raises(BuildError, match="the workload `sh -c .*` did not finish in 1 s in"):
        run_workload(never, tmp_path)
    assert time.monotonic() - start < 30
    assert_killed(int(sleeper.read_text()))


def assert_killed(pid: int) -> None:
    """PID is gone, or dead and not yet reaped by init."""
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        stat = Path(f"/proc/{pid}/stat").read_text() if Path(f"/proc/{pid}").exists() else ""
        if stat.rsplit(")", 1)[-1].split()[:1] == ["Z"]:
            return
        time.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists(), f"process {pid} still runs"


def test_a_refused_option_is_not_kept_and_a_bench_that_never_ends_is_killed(tmp_path):
    """--bench-seconds nan is refused before OUT is made, so a rerun with a sane value runs;
    a --bench that never ends is killed past --bench-timeout, in one line (it was waited on
    for ever)."""
    src = shutil.copytree(DATA / "minipkg", tmp_path / "wordcount")
    out = tmp_path / "out"
    build = 'for f in *.c; do "$CC" -c "$f" || exit 1; done && "$CC" -o wordcount *.o'
    args = ["tune", "--source", str(src), "--build", build, "--out", str(out)]
    env = user_cache(tmp_path)
    r = mlgo(*args, "--bench", "./wordcount < main.c", "--bench-seconds", "nan", env=env)
    one_line_error(r, "Invalid value for '--bench-seconds': nan is not a number in (0, 600]")
    assert not out.exists()
    sleeper = tmp_path / "sleeper"
    never = f"./wordcount < main.c; sleep 1000 & echo $! > {sleeper}; wait"
    r = mlgo(*args, "--bench", never, "--bench-seconds", "0.5", "--bench-timeout", "2", env=env)
    one_line_error(r, "did not finish in 2 s in", "its processes were killed")
    assert json.loads((out / "tune.json").read_text())["bench_seconds"] == 0.5
    assert_killed(int(sleeper.read_text()))
    (out / "tune.json").write_text("[" * 100_000 + "]" * 100_000)
    r = mlgo(*args, "--bench", never, env=env)
    one_line_error(r, f"{out / 'tune.json'}: nested more than")


def test_a_recipe_or_splits_file_nested_without_end_is_one_line(tmp_path):
    (tmp_path / "deep.toml").write_text("a = " + "[" * 5000 + "]" * 5000)  # tomllib recurses
    with pytest.raises(BuildError, match=r"deep.toml: bad recipe \(maximum recursion"):
        load_recipe("deep", tmp_path)
    with pytest.raises(BuildError, match=r"deep.toml: bad splits file \(maximum recursion"):
        load_splits(tmp_path / "deep.toml")


GOOD_RECIPE = """problem = "inlining-size"
out = "data/x"
release = "policies/x"
[corpora.train]
out = "data/corpus-train"
split = "train"
[[stages]]
name = "bc"
train = "bc"
corpus = "train"
[[stages]]
name = "calibrate"
calibrate = "train"
guard = "size"
"""


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (("out = ", 'outs = "y"\nout = '), "recipe.toml: outs: not a key of a recipe here"),
        (("problem = ", "problems = "), "recipe.toml: problem: missing"),
        (('split = "train"', "split = 3"), "recipe.toml: corpora.train.split: a str, not 3"),
        (('split = "train"', ""), "recipe.toml: corpora.train: give split or packages"),
        (('corpus = "train"', 'corpus = "nosuch"'), "stages[0].corpus: no corpus 'nosuch'"),
        (('guard = "size"', 'guard = "always"'), "stages[1].guard: one of size, not 'always'"),
        (
            ('corpus = "train"\n', "corpus = 'train'\nminutes = nan\n"),
            "stages[0].minutes: a number",
        ),
        (
            ('corpus = "train"\n', "corpus = 'train'\noptions = { sigma = 'x' }\n"),
            "stages[0].options.sigma: a float, not 'x'",
        ),
        (
            ('corpus = "train"\n', "corpus = 'train'\noptions = { nosuch = 1 }\n"),
            "stages[0].options.nosuch: no trainer takes this option",
        ),
        (('name = "calibrate"', 'name = "bc"'), "stages[1].name: 'bc' names another stage"),
        (
            ('[[stages]]\nname = "bc"', "[[stages]]\nname = \"bc\"\nstart = 'x'\nchoose = 'train'"),
            "stages[0]: give one of train, calibrate or choose",
        ),
        (("", "a = " + "[" * 5000 + "]" * 5000 + "\n"), "recipe.toml: not TOML ("),
        (("\n", "\n\0"), "recipe.toml: not TOML ("),
    ],
)
def test_a_bad_policy_recipe_is_one_line_naming_the_file_and_key(tmp_path, change, says):
    """A recipe another user could have placed or a colleague committed is checked whole:
    a wrong key, type, number or reference is one line naming the file and the key."""
    from tools.lab.recipe import RecipeError, load_policy_recipe

    (tmp_path / "recipe.toml").write_text(GOOD_RECIPE)
    assert [s.name for s in load_policy_recipe(tmp_path).stages] == ["bc", "calibrate"]
    old, new = change
    (tmp_path / "recipe.toml").write_text(GOOD_RECIPE.replace(old, new, 1) if old else new)
    with pytest.raises(RecipeError) as e:
        load_policy_recipe(tmp_path)
    assert says in str(e.value) and "\n" not in str(e.value)
    assert str(e.value).startswith(str(tmp_path / "recipe.toml"))


def test_a_recipe_that_is_not_a_regular_file_or_too_large_is_refused(tmp_path):
    from tools.lab.recipe import RecipeError, load_policy_recipe

    os.mkfifo(tmp_path / "recipe.toml")  # never waited on
    with pytest.raises(RecipeError, match="recipe.toml: not a regular file"):
        load_policy_recipe(tmp_path)
    (tmp_path / "recipe.toml").unlink()
    (tmp_path / "recipe.toml").write_text("# " + "x" * (2 << 20))
    with pytest.raises(RecipeError, match="recipe.toml: larger than"):
        load_policy_recipe(tmp_path)


def test_a_recipe_override_naming_nothing_is_one_line(tmp_path):
    """The tool's per-stage changes name stages and corpora the recipe has, of their kind."""
    r = subprocess.run(
        [sys.executable, "-m", "tools.reproduce_policy", "policies/inlining-size-link",
         "--minutes", "nosuch=3", "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=120, cwd=Path(__file__).parents[1],
    )  # fmt: skip
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "no stage 'nosuch' (have: train, choose)" in r.stderr
    assert not (tmp_path / "out").exists()


def test_an_object_whose_headers_claim_more_than_it_holds_is_one_line_not_a_huge_read(tc, tmp_path):
    import struct

    from mlgo.llvm.sizes import text_parts, text_size

    src = tmp_path / "x.c"
    src.write_text("int f(int x) { return x * 3; }\n")
    obj = tmp_path / "x.o"
    subprocess.run([tc.clang, "-Oz", "-c", str(src), "-o", str(obj)], check=True)
    good = obj.read_bytes()
    shoff = struct.unpack_from("<Q", good, 0x28)[0]
    huge = bytearray(good)
    struct.pack_into("<H", huge, 0x3C, 0)  # e_shnum 0: section 0 holds the count...
    struct.pack_into("<Q", huge, shoff + 0x20, 1 << 60)  # ...of 2^60 sections
    for name, data in {"cut": good[:100], "huge": huge, "not-elf": b"MZ" * 40}.items():
        bad = tmp_path / f"{name}.o"
        bad.write_bytes(bytes(data))
        for read in (text_parts, text_size):
            with pytest.raises(UsageError, match=rf"{bad}: not an ELF object \(") as e:
                read(bad)
            assert "\n" not in str(e.value)
    assert text_size(obj) > 0
