"""The shared runtime helpers: atomic directories, the one-line error, the service start,
and the rule that no module reaches into another's private names."""

from __future__ import annotations

import ast
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from mlgo.runtime.files import atomic_directory
from mlgo.runtime.messages import error_line
from mlgo.serve.client import ServiceError, launch_service
from mlgo.train import Adam

ROOT = Path(__file__).resolve().parents[1]


def test_atomic_directory_replaces_the_target_only_when_complete(tmp_path):
    target = tmp_path / "out" / "model"
    target.mkdir(parents=True)
    (target / "old").write_text("old")
    with pytest.raises(RuntimeError), atomic_directory(target) as staging:
        (staging / "half").write_text("half")
        raise RuntimeError("killed mid-write")
    assert [p.name for p in target.parent.iterdir()] == ["model"]  # no staging left
    assert [p.name for p in target.iterdir()] == ["old"]
    with atomic_directory(target) as staging:
        (staging / "new").write_text("new")
    assert [p.name for p in target.iterdir()] == ["new"]
    assert target.stat().st_mode & 0o777 == 0o777 & ~_umask()  # not mkdtemp's private 0700
    assert [p.name for p in target.parent.iterdir()] == ["model"]


def test_atomic_directory_keeps_a_concurrent_winner_unless_replacing(tmp_path):
    target = tmp_path / "cache" / "key"
    with atomic_directory(target, replace=False) as staging:
        (staging / "ours").write_text("ours")
        target.mkdir()  # another builder published the same thing meanwhile
        (target / "theirs").write_text("theirs")
    assert [p.name for p in target.iterdir()] == ["theirs"]
    assert [p.name for p in target.parent.iterdir()] == ["key"]


def test_a_cached_build_is_built_by_one_process_while_the_others_wait(tmp_path, monkeypatch):
    """Parallel compiles (or test workers) asking for the same cached build: one builds,
    the others wait on the key's lock and find it built."""
    import multiprocessing

    from mlgo.ship.aot import cached_build

    monkeypatch.setenv("MLGO_CACHE", str(tmp_path / "cache"))
    builds = tmp_path / "builds"

    def build(staging: Path) -> None:
        with builds.open("a") as log:
            log.write("built\n")
        time.sleep(1.0)  # long enough for the other process to arrive meanwhile
        (staging / "made").write_text("made")

    def ask() -> None:
        cached_build("test", b"one key", "made", build)

    others = [multiprocessing.get_context("fork").Process(target=ask) for _ in range(2)]
    for p in others:
        p.start()
    ask()
    for p in others:
        p.join(30)
        assert p.exitcode == 0
    assert builds.read_text() == "built\n"


def _umask() -> int:
    import os

    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.parametrize(
    ("output", "line"),
    [
        ("compiling\nfoo.c:3:1: error: expected ';'\n1 error generated.\n", "foo.c:3:1: error:"),
        ("CC error.o\nchecking strerror... yes\nmake: *** [all] Error 2\n", "make: *** [all]"),
        ('Traceback:\n  File "x"\nValueError: bad shape\n', "ValueError: bad shape"),
        ("configured\nE: Unable to locate package foo\n", "E: Unable to locate package foo"),
        ("\n  \n", "(no output)"),
    ],
)
def test_error_line_picks_the_line_that_says_why(output, line):
    assert error_line(output).startswith(line)


def test_error_line_of_an_exception_is_its_first_line_or_its_type():
    assert error_line(ValueError("no such policy\n  details")) == "no such policy"
    assert error_line(KeyError()) == "KeyError"
    assert len(error_line("error: " + "x" * 500, 200)) == 200


def test_a_service_that_cannot_start_says_why_from_this_start_only(tmp_path):
    log = tmp_path / "serve.log"
    log.write_text("error: an earlier start's failure\n")
    not_a_policy = tmp_path / "empty"
    not_a_policy.mkdir()
    with pytest.raises(ServiceError, match="did not start: .*not a policy directory"):
        launch_service(tmp_path / "s.sock", [str(not_a_policy)], "python", log, 0, 120)
    assert not (tmp_path / "s.sock").exists()


def test_a_builds_own_service_dies_with_the_process_that_started_it(tmp_path):
    """A killed `mlgo tune` (SIGKILL: no cleanup runs) must not leave its build's service
    serving, as it never idles out."""
    starter = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from mlgo.programs.build import policy_service\n"
        f"with policy_service([Path({str(ROOT / 'policies' / 'regalloc-eviction')!r})], "
        f"Path({str(tmp_path)!r}), 'python'):\n"
        "    print('serving', flush=True)\n"
        "    time.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", starter], stdout=subprocess.PIPE, cwd=ROOT)
    assert proc.stdout is not None and proc.stdout.readline() == b"serving\n"
    (service,) = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 30
    while running(int(service)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not running(int(service))


def running(pid: int) -> bool:
    """PID is a live process (not gone, nor a zombie waiting to be reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_adam_resumed_from_its_state_steps_like_one_never_stopped():
    rng = np.random.default_rng(0)
    grads = rng.standard_normal((4, 5))
    whole, first = Adam(5, 0.1), Adam(5, 0.1)
    theta = np.zeros(5)
    for g in grads:
        theta = whole.step(theta, g)
    half = first.step(first.step(np.zeros(5), grads[0]), grads[1])
    resumed = Adam(5, 0.1)
    resumed.restore(first.state())
    half = resumed.step(resumed.step(half, grads[2]), grads[3])
    np.testing.assert_allclose(half, theta, rtol=1e-6)
    # Adam's first step is the step size along the gradient's sign: an ascent.
    np.testing.assert_allclose(
        Adam(5, 0.1).step(np.zeros(5), grads[0]), 0.1 * np.sign(grads[0]), rtol=1e-4
    )


def test_no_module_imports_another_modules_private_names():
    found = []
    for path in sorted([*(ROOT / "mlgo").rglob("*.py"), *(ROOT / "tools").glob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("mlgo"):
                private = [a.name for a in node.names if a.name.startswith("_")]
                found += [f"{path.relative_to(ROOT)}: {node.module}.{n}" for n in private]
    assert found == []
