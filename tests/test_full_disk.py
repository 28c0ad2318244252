"""A full disk names the file it could not write: on a real full file system (a 256 KiB
tmpfs, mounted for the test: skipped where mounting is not allowed), through the atomic
writes, a copy into a staging directory, and `mlgo tune`'s snapshot and record stages."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from mlgo.programs.build import scratch_copy
from mlgo.programs.tune import snapshot
from mlgo.runtime.files import atomic_directory, atomic_path, atomic_write_bytes, atomic_write_text
from mlgo.runtime.messages import error_line, writing
from mlgo.train.stages import Stage, StageRecord, run_stages
from tests.conftest import run_mlgo

DISK_BYTES = 256 * 1024
TOO_MUCH = os.urandom(2 * DISK_BYTES)  # random: nothing on the way compresses it


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A 256 KiB tmpfs at tmp_path/disk, unmounted after the test."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = ["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES}", "tmpfs", str(disk)]
    try:
        r = subprocess.run(mount, capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        pytest.skip("no mount command here")
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip() or r.returncode}")
    try:
        yield disk
    finally:
        if subprocess.run(["umount", str(disk)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def big_tree(root: Path, files: int = 4) -> Path:
    """A directory of FILES files of 100 KB each: more than the disk holds."""
    root.mkdir()
    for i in range(files):
        (root / f"part{i}.bin").write_bytes(TOO_MUCH[:100_000])
    return root


def one_line(e: BaseException) -> str:
    line = error_line(e, limit=2000)
    assert line == str(e) and "\n" not in line and "[" not in line, line  # no list, no errno
    return line


def test_an_atomic_write_to_a_full_disk_names_its_file_and_leaves_the_old_one(full_disk):
    target = full_disk / "model.bin"
    atomic_write_text(target, "before")
    with pytest.raises(OSError) as e:
        atomic_write_bytes(target, TOO_MUCH)
    assert e.value.errno == errno.ENOSPC
    assert one_line(e.value) == f"cannot write {target}: No space left on device"
    assert target.read_text() == "before"  # the user's file is whole, not half-written
    assert [p.name for p in full_disk.iterdir()] == ["model.bin"]  # no temp file left


def test_a_write_through_atomic_path_names_the_target_not_the_temp_file(full_disk):
    target = full_disk / "traces" / "module.tfrecord"
    with pytest.raises(OSError) as e, atomic_path(target) as tmp, open(tmp, "wb") as f:
        f.write(TOO_MUCH)
    assert one_line(e.value) == f"cannot write {target}: No space left on device"
    assert list(target.parent.iterdir()) == []


def test_a_full_disk_inside_an_atomic_directory_names_the_file_under_its_target(full_disk):
    target = full_disk / "corpus"
    with pytest.raises(OSError) as e, atomic_directory(target) as staged:
        atomic_write_bytes(staged / "pkg" / "a.bc", TOO_MUCH)
    assert e.value.errno == errno.ENOSPC
    assert one_line(e.value) == f"cannot write {target}/pkg/a.bc: No space left on device"
    assert list(full_disk.iterdir()) == []  # no staging directory left


def test_a_copy_into_a_full_disk_is_one_line_naming_the_first_file_and_the_count(
    full_disk, tmp_path
):
    source = big_tree(tmp_path / "src")
    target = full_disk / "pristine"
    with pytest.raises(OSError) as e, atomic_directory(target) as staged:
        shutil.copytree(source, staged, dirs_exist_ok=True)
    line = one_line(e.value)
    assert e.value.errno == errno.ENOSPC
    assert line.startswith(f"cannot copy {source}/part")
    assert f" to {target}/part" in line and ".partial" not in line
    assert line.endswith(": No space left on device (2 files not copied)"), line
    assert list(full_disk.iterdir()) == []


def test_tune_snapshot_and_record_stages_on_a_full_disk_say_which_file(full_disk, tmp_path):
    source = big_tree(tmp_path / "project")
    with pytest.raises(OSError) as e:
        snapshot(source, full_disk / "out" / "pristine")
    assert f"to {full_disk}/out/pristine/part" in one_line(e.value)
    assert list((full_disk / "out").iterdir()) == []
    # record copies the snapshot to a scratch tree first: a plain copytree, whose error
    # message was the list of every failed file
    with pytest.raises(OSError) as e:
        scratch_copy(source, full_disk / "out" / "record" / "project")
    line = one_line(e.value)
    assert line.startswith(f"cannot copy {source}/part") and "files not copied)" in line


def test_a_write_in_a_tune_stage_that_names_no_file_names_the_stage(full_disk, tmp_path):
    """A library's own plain write (a checkpoint, a report) raises a bare `[Errno 28]`."""

    def train(_: object) -> None:
        with open(full_disk / "ckpt", "wb") as f:
            f.write(TOO_MUCH)

    record = StageRecord(tmp_path / "stages.json", ["train"])
    with pytest.raises(OSError) as e:
        run_stages([Stage("train", train, where=lambda _: full_disk)], record, None, "tune")
    assert e.value.errno == errno.ENOSPC
    assert one_line(e.value) == f"tune's train stage, in {full_disk}: No space left on device"


def test_mlgo_tune_on_a_full_disk_stops_with_one_line_naming_the_file(full_disk, tmp_path):
    source = big_tree(tmp_path / "project")
    out = full_disk / "tune"
    r = run_mlgo("tune", "--source", str(source), "--build", "make", "--out", str(out), timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"cannot copy {source}/part" in r.stderr and f"{out}/pristine/part" in r.stderr
    assert "No space left on device" in r.stderr and "Errno" not in r.stderr
    # no half a snapshot: the arguments, and the record of a stage that did not finish
    assert sorted(p.name for p in out.iterdir()) == ["stages.json", "tune.json"]
    assert json.loads((out / "stages.json").read_text())["finished"] == []


@pytest.mark.unit
def test_a_copy_error_is_one_line_and_an_unnamed_os_error_gets_its_file():
    failures = [
        ("src/a.c", "dst/a.c", "[Errno 28] No space left on device: 'src/a.c' -> 'dst/a.c'"),
        ("src/b.c", "dst/b.c", "[Errno 28] No space left on device: 'src/b.c' -> 'dst/b.c'"),
    ]
    line = error_line(shutil.Error(failures))
    assert line == "cannot copy src/a.c to dst/a.c: No space left on device (2 files not copied)"
    with pytest.raises(OSError) as e, writing(Path("out/log")):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert str(e.value) == "cannot write out/log: No space left on device"
    assert e.value.errno == errno.ENOSPC
    with pytest.raises(FileNotFoundError, match=r"'x/y'"), writing(Path("out/log")):
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", "x/y")  # named
