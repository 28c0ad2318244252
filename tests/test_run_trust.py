"""A run's directory and its inputs are the user's own, and every child process and every
number is bounded: a crafted checkpoint, an --out another user made or changed, a test that
leaves children behind, and numbers no run could use."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from mlgo.programs.measure import Workload, run_workload
from mlgo.runtime.commands import run_logged
from tests import test_security
from tests.cli_helpers import POLICIES, mlgo, one_line_error, user_cache
from tests.conftest import DATA, MLGO, copy_corpus
from tests.test_bad_input import assert_killed
from tests.test_security import NOBODY

as_nobody = test_security.as_nobody  # a second user, as the service's trust tests use one
nobodys_dir = test_security.nobodys_dir


def _bomb(path: Path) -> None:
    """A small archive whose one array's header declares 3.35 GiB of float64."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<f8", "fortran_order": False, "shape": (450_000_000,)}
    )
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("theta.npy", header.getvalue() + bytes(3_500_000))


@pytest.mark.parametrize("bad", ["not an archive", "a FIFO", "a bomb"])
def test_a_bad_checkpoint_is_one_line(mini_corpus, tmp_path, bad):
    """The checkpoint a rerun resumes from is read bounded by the run's own size: a file
    that is no archive, a FIFO (it hung) and a 3.5 MB archive declaring 3.35 GiB (it asked
    for them) are each one line naming it."""
    corpus = copy_corpus(mini_corpus, tmp_path / "c")
    run = tmp_path / "run"
    run.mkdir()
    (run / "state.json").write_text(json.dumps({"algo": "es"}))
    checkpoint = run / "checkpoint.npz"
    if bad == "a FIFO":
        os.mkfifo(checkpoint)
    elif bad == "a bomb":
        _bomb(checkpoint)
    else:
        checkpoint.write_bytes(b"PK\x03\x04 not really")
    init = str(POLICIES / "inlining-size")
    r = mlgo("train", "--algo", "es", "--corpus", str(corpus), "--init", init,
             "--out", str(run), "--steps", "1", timeout=120)  # fmt: skip
    why = {"a FIFO": "not a regular file", "a bomb": "at most", "not an archive": "not an array"}
    one_line_error(r, str(checkpoint), why[bad])


# -- every child process is bounded: a command's group goes when it ends ------------------
def wordcount(tmp_path: Path, *options: str) -> tuple[Path, list[str]]:
    """`mlgo tune` with OPTIONS on a copy of the minipkg program, into TMP_PATH/out."""
    src = shutil.copytree(DATA / "minipkg", tmp_path / "wordcount")
    out = tmp_path / "out"
    build = 'for f in *.c; do "$CC" -c "$f" || exit 1; done && "$CC" -o wordcount *.o'
    return out, ["tune", "--source", str(src), "--build", build, *options, "--out", str(out)]


def left_behind(pidfile: Path) -> str:
    """A shell line that leaves `sleep 300` running in the background, its pid in PIDFILE."""
    return f"sleep 300 & echo $! > {pidfile}"


def test_a_test_that_leaves_a_child_behind_leaves_no_process_when_it_fails(tmp_path):
    pidfile = tmp_path / "sleeper"
    _, args = wordcount(tmp_path, "--test", f"{left_behind(pidfile)}; false")
    r = mlgo(*args, env=user_cache(tmp_path), timeout=300)
    one_line_error(r, "its own tests, on the recorded build before training failed")
    assert_killed(int(pidfile.read_text()))


def as_a_shell_starts_a_job() -> None:
    """Ctrl-C's signal as an interactive shell leaves it to a job it starts: handled by
    default and not blocked, whatever this test's own process had (a signal ignored or
    blocked here would be so in the child too)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def test_an_interrupted_test_leaves_no_process(tmp_path):
    """Ctrl-C (SIGINT to mlgo alone, as a job control shell's kill -INT does) while --test
    runs: mlgo stops, and its test's whole group with it."""
    pidfile = tmp_path / "sleeper"
    _, args = wordcount(tmp_path, "--test", f"{left_behind(pidfile)}; sleep 300")
    err = tmp_path / "stderr"  # a file, not a pipe nobody reads that could fill and block it
    with err.open("w") as stderr:
        proc = subprocess.Popen([*MLGO, *args], env=dict(os.environ, **user_cache(tmp_path)),
                                stdout=subprocess.DEVNULL, stderr=stderr,
                                preexec_fn=as_a_shell_starts_a_job)  # fmt: skip
    deadline = time.monotonic() + 300
    while not pidfile.exists() or not pidfile.read_text().strip():
        assert proc.poll() is None and time.monotonic() < deadline, err.read_text()
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        status = Path(f"/proc/{proc.pid}/status").read_text().splitlines()
        proc.kill()
        raise AssertionError([line for line in status if line.startswith("Sig")]) from None
    assert_killed(int(pidfile.read_text()))


def test_a_passing_command_and_workload_leave_no_process(tmp_path):
    """A test line that passes and a workload that passes, each leaving a child behind."""
    test_pid, bench_pid = tmp_path / "test-sleeper", tmp_path / "bench-sleeper"
    run_logged(left_behind(test_pid), tmp_path, tmp_path / "log", 60, None, "a test")
    assert_killed(int(test_pid.read_text()))
    workload = Workload("w", (), (("sh", "-c", left_behind(bench_pid)),), timeout_s=60)
    run_workload(workload, tmp_path)
    assert_killed(int(bench_pid.read_text()))


# -- a failed --refresh leaves tune.json as it was --------------------------------------------
@pytest.mark.slow
def test_a_failed_refresh_leaves_the_tunes_arguments_and_a_larger_budget_trains_on(tmp_path):
    out, args = wordcount(tmp_path, "--minutes", "0.05", "--train-steps", "1")
    env = user_cache(tmp_path)
    r = mlgo(*args, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    before = (out / "tune.json").read_bytes()
    r = mlgo(*args, "--refresh", "--test", "false", env=env, timeout=600)
    one_line_error(r, "its own tests failed")
    assert (out / "tune.json").read_bytes() == before
    assert "refresh" not in json.loads(before)
    longer = [a if a != "0.05" else "0.1" for a in args]
    r = mlgo(*longer, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "training on from 0.05 to 0.1 minutes" in r.stdout


# -- an output directory another user made or can change is refused ---------------------
@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A private directory of root's with a file in it: what a planted link points at."""
    path = tmp_path / "victim"
    path.mkdir(mode=0o700)
    (path / "precious").write_text("keep me\n")
    return path


def plant_link(directory: Path, name: str, target: Path) -> None:
    (directory / name).symlink_to(target)
    os.lchown(directory / name, NOBODY, NOBODY)


def test_a_tune_into_another_users_directory_is_refused(as_nobody, nobodys_dir, victim, tmp_path):
    """In a sticky /tmp, uid 65534 made the --out with `tune.json` = `{}` and a link
    `decide -> victim`: root's tune took it for a tune to resume, and removed the victim."""
    (nobodys_dir / "tune.json").write_text("{}")
    os.chown(nobodys_dir / "tune.json", NOBODY, NOBODY)
    plant_link(nobodys_dir, "decide", victim)
    _, args = wordcount(tmp_path, "--minutes", "0.05", "--train-steps", "1")
    args[-1] = str(nobodys_dir)
    r = mlgo(*args, env=user_cache(tmp_path), timeout=600)
    one_line_error(r, f"refusing the output directory {nobodys_dir}", "belongs to uid 65534")
    assert (victim / "precious").read_text() == "keep me\n"


@pytest.mark.parametrize(
    "command",
    [
        ["tune", "--source", ".", "--build", "true"],
        ["train", "--corpus", "c"],
        ["collect", "--problem", "inlining-size", "--corpus", "c"],
        ["corpus", "build", "zlib"],
        ["decisions", "record", "--policy", "p", "--", "true"],
        ["calibrate", "--policy", "p", "--corpus", "c"],
    ],
)
def test_an_empty_output_directory_of_another_user_is_refused(as_nobody, nobodys_dir, command):
    """An empty --out made by 65534, who could swap OUT/decisions for a copy with their own
    `cc` once it appears (it then ran as root): refused before anything runs."""
    at = command.index("--") if "--" in command else len(command)
    args = [*command[:at], "--out", str(nobodys_dir), *command[at:]]
    r = mlgo(*args, timeout=120)
    one_line_error(r, f"refusing the output directory {nobodys_dir}", "belongs to uid 65534")
    assert not list(nobodys_dir.iterdir())


def test_an_output_directory_under_one_others_may_write_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # not sticky: anyone may rename what is in it
    r = mlgo("train", "--corpus", "c", "--out", str(shared / "run"), timeout=120)
    one_line_error(r, f"{shared} is writable by other users (mode 777)")
    assert not (shared / "run").exists()


def test_a_stray_link_in_a_tunes_directory_is_one_line(victim, tmp_path):
    """A tune directory of the user's own (a colleague's, unpacked) with a link where mlgo
    keeps a scratch tree of its own: one line naming it, the victim untouched."""
    out, args = wordcount(tmp_path, "--minutes", "0.05", "--train-steps", "1")
    out.mkdir()
    (out / "tune.json").write_text("{}")
    (out / "decide").symlink_to(victim)
    r = mlgo(*args, env=user_cache(tmp_path), timeout=600)
    one_line_error(r, f"{out / 'decide'} is a symbolic link (to {victim})")
    assert (victim / "precious").read_text() == "keep me\n"


# -- every number is bounded ----------------------------------------------------------------
TUNE = ["tune", "--source", "s", "--build", "true", "--bench", "true", "--out", "o"]
TRAIN = ["train", "--corpus", "c", "--out", "o"]
COLLECT = ["collect", "--problem", "inlining-size", "--corpus", "c", "--out", "o"]
HUGE = "100000000000000000000000"  # 1e23: the rounds ran until killed
TOO_MANY = [
    (TUNE, "--bench-rounds", HUGE),
    (TUNE, "--layouts", "100000"),
    (TUNE, "--train-steps", HUGE),
    (TUNE, "--minutes", "1e8"),
    (TUNE, "--bench-timeout", "1e8"),
    (["demo"], "--minutes", "1e8"),
    (["demo"], "--bench-rounds", HUGE),
    (["build", "zlib"], "--bench-rounds", HUGE),
    (["build", "zlib"], "--layouts", "100000"),
    (TRAIN, "--steps", HUGE),
    (TRAIN, "--minutes", "1e8"),
    (TRAIN, "--directions", "100000"),
    (TRAIN, "--batch", "100000"),
    (TRAIN, "--search-budget", "100000"),
    (TRAIN, "--clone-epochs", HUGE),
    (TRAIN, "--workers", "100000"),
    (COLLECT, "--timeout", "1e8"),
    (COLLECT, "--workers", "100000"),
    (["corpus", "vocabulary", "c", "--out", "v.json"], "--dim", "100000"),
    (["corpus", "vocabulary", "c", "--out", "v.json"], "--steps", HUGE),
    (["channel"], "--ttl", "1e8"),
    (["xla", "collect"], "--rounds", HUGE),
    (["xla", "train", "--data", "d", "--out", "o"], "--hidden", "100000"),
    (["xla", "train", "--data", "d", "--out", "o"], "--ensemble", "100000"),
    (["xla", "tune", "f.py:g"], "--top-k", "100000"),
]


@pytest.mark.parametrize(("command", "option", "value"), TOO_MANY)
def test_a_number_no_run_could_use_is_refused_when_parsed(tmp_path, command, option, value):
    r = subprocess.run(
        [*MLGO, *command, option, value], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    one_line_error(r, f"Invalid value for '{option}'")
    assert not list(tmp_path.iterdir())  # nothing ran: nothing written


def test_too_many_workers_are_refused_naming_the_most(tmp_path):
    most = 4 * (os.cpu_count() or 1)
    r = mlgo(*COLLECT, "--workers", str(most + 1), timeout=120)
    one_line_error(r, f"{most + 1} processes: at most {most} (4 per core")
