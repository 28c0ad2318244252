"""Bad options, failed modules, full disks and failed commands: one line, exit non-zero,
nothing half-written and nothing lost (issue 19, items 8, 9, 13, 17)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from mlgo.corpus.format import load_corpus
from mlgo.runtime.files import output_dir
from tests.cli_helpers import POLICIES, mlgo, one_line_error, user_cache
from tests.conftest import MLGO, copy_corpus

# -- item 9: numeric options are range-checked when parsed ----------------------------
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
