"""Check what you use, and use what you checked (issue 61): a link on the cache path, a
relative MLGO_CACHE, a runtime directory in another user's, the size guard's scratch and
Ray's bitcode cache. Real clang, both wrappers, and a second user (uid 65534) for what
another user could have placed or swapped."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from mlgo.corpus.record import work_dir
from mlgo.runtime.files import cache_dir, content_cached
from mlgo.runtime.trust import UntrustedPathError, private_dir
from mlgo.serve.guard import GUARD_SCRATCH, put_in_place
from mlgo.serve.native_wrapper import build_native_wrapper
from tests import test_guard, test_security, test_service, test_trust
from tests.cli_helpers import mlgo, one_line_error
from tests.test_security import NOBODY, start_fake
from tests.test_service import mlgo_cc
from tests.test_trust import PLUGIN, canary_and_plain, planted_plugin

cc = test_service.cc  # both wrappers, the Python reference and the native one
native_cc = test_service.native_cc
native_wrappers = test_service.native_wrappers
as_nobody = test_security.as_nobody
nobodys_dir = test_security.nobodys_dir
root_only = test_trust.root_only
inline_all = test_guard.inline_all
eager = test_guard.eager
departing = test_guard.departing

# A pass plugin that clang-22 loads and that changes nothing: the object stays plain clang's
# (llvm/Plugins/PassPlugin.h's PassPluginLibraryInfo, API version 2).
NOOP_PLUGIN = """#include <stdint.h>
struct info { uint32_t api; const char *name, *version; void (*callbacks)(void *); void *codegen; };
static void callbacks(void *builder) { (void)builder; }
struct info llvmGetPassPluginInfo(void) { return (struct info){2, "noop", "1", callbacks, 0}; }
"""


def noop_plugin(path: Path) -> Path:
    source = path.parent / "noop.c"
    source.write_text(NOOP_PLUGIN)
    subprocess.run(["cc", "-shared", "-fPIC", str(source), "-o", str(path)], check=True)
    source.unlink()
    return path


def give_away(top: Path) -> None:
    """TOP and everything in it to user 65534."""
    for path in [top, *top.rglob("*")]:
        os.lchown(path, NOBODY, NOBODY)


@contextmanager
def flipping(link: Path, targets: tuple[Path, Path]) -> Iterator[None]:
    """LINK pointed at each of TARGETS in turn, as fast as it goes, while the body runs:
    what another user who may write LINK's directory can do at any moment."""
    stop = threading.Event()

    def flip() -> None:
        staged = link.with_name(f".{link.name}.flip")
        while not stop.is_set():
            for target in targets:
                staged.unlink(missing_ok=True)
                staged.symlink_to(target)
                staged.replace(link)
                time.sleep(0.001)  # each way for a while, on a machine busy with compiles

    thread = threading.Thread(target=flip, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


# -- 1. the cache: resolved once, checked, and only that path used --------------------------
def test_a_cache_through_another_users_link_is_refused(
    cc, root_only, nobodys_dir, tmp_path, monkeypatch
):
    """MLGO_CACHE through a link of uid 65534 (who may point it anywhere): one line naming
    the link, the compile plain clang's, and nothing behind the link loaded."""
    (tmp_path / "cache" / "plugin" / "k").mkdir(parents=True)
    mark = tmp_path / "planted-code-ran"
    planted_plugin(tmp_path / "cache" / "plugin" / "k" / PLUGIN, mark)
    link = nobodys_dir / "cache"
    link.symlink_to(tmp_path / "cache")
    os.lchown(link, NOBODY, NOBODY)
    monkeypatch.setenv("MLGO_CACHE", str(link))
    with pytest.raises(UntrustedPathError, match=f"{link} is a symbolic link of uid {NOBODY}"):
        cache_dir()
    src, plain = canary_and_plain(tmp_path)
    flags = [f"-fpass-plugin={link}/plugin/k/{PLUGIN}"]
    (tmp_path / "channels").mkdir()  # the runtime directory's: the native wrapper checks it
    fake = start_fake(tmp_path / "mlgo.sock", {"lease": "1", "flags": flags, "policies": []})
    try:
        env = dict(os.environ, MLGO_SOCKET=str(tmp_path / "mlgo.sock"))
        out = tmp_path / "canary.o"
        r = mlgo_cc(cc, src, out, env)
        test_trust.assert_plain_compile(r, out, plain, f"symbolic link of uid {NOBODY}")
        assert not mark.exists(), "a plugin behind another user's link ran"
    finally:
        fake.kill()
        fake.wait()


def test_a_relative_cache_is_one_line(cc, tmp_path):
    """A relative MLGO_CACHE would be another directory in every directory a build enters:
    refused in one line by every command, and the compile is plain clang's."""
    src, plain = canary_and_plain(tmp_path)
    (tmp_path / "cache" / "plugin" / "k").mkdir(parents=True)
    noop_plugin(tmp_path / "cache" / "plugin" / "k" / PLUGIN)
    flags = [f"-fpass-plugin={tmp_path}/cache/plugin/k/{PLUGIN}"]
    (tmp_path / "channels").mkdir()  # the runtime directory's: the native wrapper checks it
    fake = start_fake(tmp_path / "mlgo.sock", {"lease": "1", "flags": flags, "policies": []})
    try:
        env = dict(os.environ, MLGO_SOCKET=str(tmp_path / "mlgo.sock"), MLGO_CACHE="cache")
        r = mlgo("flags", "--", "-Oz", env=env)
        one_line_error(r, "the mlgo cache cache is a relative path", "MLGO_CACHE")
        out = tmp_path / "canary.o"
        r = subprocess.run(
            [*cc, "-Oz", "-c", src.name, "-o", out.name],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        test_trust.assert_plain_compile(r, out, plain, "is a relative path")
    finally:
        fake.kill()
        fake.wait()


def test_everything_built_in_the_cache_is_named_by_its_resolved_path(tmp_path, monkeypatch):
    """Plugins, policy servers, tune's builds and the recording wrappers are all under
    cache_dir(), which is the resolved path: a link on the way is followed once, never again."""
    real = tmp_path / "real"
    (tmp_path / "link").symlink_to(real)  # ours: allowed, and resolved
    monkeypatch.setenv("MLGO_CACHE", str(tmp_path / "link" / "mlgo"))
    assert cache_dir() == real / "mlgo" and (real / "mlgo").is_dir()
    wrappers = work_dir(tmp_path / "corpus")
    assert wrappers.is_relative_to(real / "mlgo") and Path(os.path.realpath(wrappers)) == wrappers


def test_a_link_flipped_during_a_build_never_runs_their_plugin(
    cc, root_only, nobodys_dir, tmp_path
):
    """The cache is reached through a link that someone flips, in a loop, between our cache
    and a copy of theirs (a plugin whose constructor leaves a mark) during 24 compiles. The
    link is root's, so the path passes every check whichever way it points; what protects is
    that the compiler gets the path that was checked. Nothing of theirs ever runs, and every
    object is plain clang's (our plugin changes nothing); both ways of the race happen."""
    ours = tmp_path / "cache"
    (ours / "plugin" / "k").mkdir(parents=True)
    noop_plugin(ours / "plugin" / "k" / PLUGIN)
    theirs = nobodys_dir / "copy"
    (theirs / "plugin" / "k").mkdir(parents=True)
    mark = tmp_path / "planted-code-ran"
    planted_plugin(theirs / "plugin" / "k" / PLUGIN, mark)
    give_away(theirs)
    theirs.chmod(0o755)
    link = nobodys_dir / "cache"  # in their directory: they may replace it at any time
    src, plain = canary_and_plain(tmp_path)
    flags = [f"-fpass-plugin={link}/plugin/k/{PLUGIN}"]
    (tmp_path / "channels").mkdir()  # the runtime directory's: the native wrapper checks it
    fake = start_fake(tmp_path / "mlgo.sock", {"lease": "1", "flags": flags, "policies": []})
    env = dict(os.environ, MLGO_SOCKET=str(tmp_path / "mlgo.sock"), MLGO_CACHE=str(link))
    warned = served = 0
    last = ""
    try:
        with flipping(link, (ours, theirs)):
            for i in range(24):
                out = tmp_path / f"canary{i}.o"
                r = mlgo_cc(cc, src, out, env)
                assert r.returncode == 0, r.stderr
                assert out.read_bytes() == plain, r.stderr
                assert not mark.exists(), f"their plugin ran (compile {i}): {r.stderr}"
                warned += bool(r.stderr)
                served += not r.stderr
                last = r.stderr
    finally:
        fake.kill()
        fake.wait()
    assert warned and served, (
        f"the race was not run both ways: {warned} refused, {served} served; {last}"
    )


# -- 2. the runtime directory's parent -----------------------------------------------------
def test_a_runtime_directory_in_another_users_directory_is_refused(
    cc, root_only, nobodys_dir, tmp_path
):
    """They could rename it away: one line naming their directory and its owner (from every
    command, and from both wrappers, which then compile plainly); a sticky root-owned
    directory such as /tmp is fine."""
    with pytest.raises(UntrustedPathError, match=f"{nobodys_dir} belongs to uid {NOBODY}"):
        private_dir(nobodys_dir / "mlgo", "the runtime directory", "set XDG_RUNTIME_DIR")
    assert not (nobodys_dir / "mlgo").exists()
    r = mlgo("status", env={"XDG_RUNTIME_DIR": str(nobodys_dir)})
    one_line_error(r, f"{nobodys_dir} belongs to uid {NOBODY}", "XDG_RUNTIME_DIR")
    src, plain = canary_and_plain(tmp_path)
    env = dict(os.environ, XDG_RUNTIME_DIR=str(nobodys_dir))
    env.pop("MLGO_SOCKET", None)
    out = tmp_path / "canary.o"
    r = mlgo_cc(cc, src, out, env)
    test_trust.assert_plain_compile(r, out, plain, f"{nobodys_dir} belongs to uid {NOBODY}")
    assert list(nobodys_dir.iterdir()) == [], "something was made in their directory"
    sticky = Path(tempfile.mkdtemp(prefix="mlgo-sticky-"))
    try:
        sticky.chmod(0o1777)
        assert private_dir(sticky / "mlgo", "the runtime directory", "way out").is_dir()
    finally:
        (sticky / "mlgo").rmdir()
        sticky.rmdir()


# -- 3. the guard's scratch lives where only this user can write --------------------------
def test_the_guard_writes_nothing_beside_the_object(cc, root_only, eager, nobodys_dir, tmp_path):
    """A build directory another user may write: whatever they swap there, the guard makes
    no scratch directory in it (so none can become a link to a victim's directory), the
    victim's file survives, and every object is the guard's choice."""
    build = nobodys_dir / "build"
    build.mkdir(mode=0o777)
    build.chmod(0o777)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_text("keep me")
    src = test_service.SOURCES[0]
    seen: list[str] = []
    stop = threading.Event()

    def swap_scratch_for_links() -> None:  # what the other user would do, as fast as it goes
        while not stop.is_set():
            for entry in os.scandir(build):
                if entry.name.startswith(".mlgo-guard-") and entry.is_dir(follow_symlinks=False):
                    seen.append(entry.name)
                    os.rename(entry.path, entry.path + ".moved")
                    os.symlink(victim, entry.path)

    thread = threading.Thread(target=swap_scratch_for_links, daemon=True)
    thread.start()
    try:
        for i in range(6):
            out = build / f"hash{i}.o"
            r = mlgo_cc(cc, src, out, eager.env(MLGO_GUARD="size"))
            assert r.returncode == 0 and r.stderr == "" and out.stat().st_size, r.stderr
    finally:
        stop.set()
        thread.join()
    assert seen == [], "a scratch directory was made beside the object"
    assert [p.name for p in victim.iterdir()] == ["precious"]
    assert (victim / "precious").read_text() == "keep me"
    assert sorted(p.name for p in build.iterdir()) == [f"hash{i}.o" for i in range(6)]


def test_the_kept_object_crosses_file_systems_into_a_new_file(tmp_path):
    """A runtime directory on another file system (a tmpfs): the kept object is copied into
    a new file beside the target and renamed over it; nothing else is left."""
    if not Path("/dev/shm").is_dir() or os.stat("/dev/shm").st_dev == tmp_path.stat().st_dev:
        pytest.skip("needs /dev/shm on another file system")
    scratch = Path(tempfile.mkdtemp(dir="/dev/shm"))
    try:
        kept = scratch / "x.o"
        kept.write_bytes(b"\x7fELF the default's")
        kept.chmod(0o755)
        target = tmp_path / "x.o"
        target.write_bytes(b"the policy's")
        put_in_place(kept, target)
        assert target.read_bytes() == b"\x7fELF the default's"
        assert target.stat().st_mode & 0o777 == 0o755
        assert [p.name for p in tmp_path.iterdir()] == ["x.o"]
    finally:
        for path in scratch.iterdir():
            path.unlink()
        scratch.rmdir()


def test_the_guard_crosses_file_systems(inline_all, tc, tmp_path):
    """The runtime directory on a tmpfs, the build tree elsewhere: the native wrapper (with
    no interpreter to hand over to) and the Python one keep clang's smaller object, copied
    into place, and leave nothing behind in either directory."""
    if not Path("/dev/shm").is_dir() or os.stat("/dev/shm").st_dev == tmp_path.stat().st_dev:
        pytest.skip("needs /dev/shm on another file system")
    native = tmp_path / "bin" / "mlgo-cc"
    native.parent.mkdir()
    build_native_wrapper(native, python=str(tmp_path / "no-python"))
    build = tmp_path / "build"
    build.mkdir()
    args = ["-Oz", "-c", str(test_guard.HASH), "-o", "hash.o"]
    test_guard.plain(tc, args, cwd=build)
    default = (build / "hash.o").read_bytes()
    runtime = Path(tempfile.mkdtemp(dir="/dev/shm"))
    service = test_service.Service(runtime, "--policy", str(inline_all), "--backend", "python")
    try:
        for wrapper in ([str(native)], test_service.MLGO_CC):
            (build / "hash.o").unlink()
            r = test_guard.run([*wrapper, *args], service.env(MLGO_GUARD="size"), cwd=build)
            assert r.returncode == 0 and not r.stderr, r.stderr
            assert (build / "hash.o").read_bytes() == default
            assert [p.name for p in build.iterdir()] == ["hash.o"]
            assert not list(runtime.glob(f"{GUARD_SCRATCH}*"))
    finally:
        service.stop()
        shutil.rmtree(runtime)


# -- 4. Ray's bitcode cache: private, and each file's hash checked before it is used --------
def test_a_planted_bitcode_file_is_never_used(root_only, tmp_path, monkeypatch):
    data = b"BC\xc0\xde the module's bytes"
    digest = hashlib.sha256(data).hexdigest()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    fetched: list[bytes] = []

    def fetch() -> bytes:
        fetched.append(data)
        return data

    path = content_cached("ray-bitcode", digest, ".bc", fetch)
    assert path.parent.parent == tmp_path / f"mlgo-{os.getuid()}" and path.read_bytes() == data
    assert path.parent.stat().st_mode & 0o777 == 0o700 and len(fetched) == 1
    assert content_cached("ray-bitcode", digest, ".bc", fetch) == path and len(fetched) == 1
    path.write_bytes(b"poisoned")  # other bytes under the right name: fetched again
    assert content_cached("ray-bitcode", digest, ".bc", fetch).read_bytes() == data
    os.chown(path, NOBODY, NOBODY)  # right bytes, wrong owner: fetched again, and ours
    assert content_cached("ray-bitcode", digest, ".bc", fetch).stat().st_uid == os.getuid()
    assert len(fetched) == 3
    squatted = tmp_path / "elsewhere"
    (squatted / f"mlgo-{os.getuid()}").mkdir(parents=True, mode=0o777)
    os.chown(squatted / f"mlgo-{os.getuid()}", NOBODY, NOBODY)
    monkeypatch.setattr(tempfile, "tempdir", str(squatted))
    with pytest.raises(UntrustedPathError, match=f"uid {NOBODY}.*TMPDIR"):
        content_cached("ray-bitcode", digest, ".bc", fetch)


def test_an_entry_of_the_guards_memory_of_another_user_is_a_miss(
    root_only, departing, native_cc, tc, tmp_path
):
    """An entry of the guard's memory that uid 65534 owns (who could have written anything
    in it) is not read: the file is guarded again, into the right object, and the entry
    written anew, the user's."""
    build = test_guard.Rebuild(native_cc, departing, tc, tmp_path, test_guard.HASH.read_text())
    assert build.compiles() == 2
    (entry,) = build.memory()
    os.lchown(entry, NOBODY, NOBODY)
    assert build.compiles() == 2
    assert build.object() == build.default
    assert entry.stat().st_uid == os.getuid()
    assert build.compiles() == 1
