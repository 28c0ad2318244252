"""Nothing another user planted runs as this user, and no compile is lost to a broken artifact
(issue 36): real clang, both wrappers, real services, and a second user (uid 65534) for what
another user could have placed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from mlgo.problems.policy_files import PolicyError, load_policy
from mlgo.runtime.csource import c_string
from mlgo.runtime.trust import UntrustedPathError, path_problem, private_dir, trusted_dir
from tests import test_security, test_service
from tests.cli_helpers import mlgo, one_line_error
from tests.test_security import CANARY, NOBODY, one_line, start_fake
from tests.test_service import SHIPPED, mlgo_cc

cc = test_service.cc  # both wrappers, the Python reference and the native one
native_cc = test_service.native_cc
native_wrappers = test_service.native_wrappers
plugin = test_service.plugin
as_nobody = test_security.as_nobody
nobodys_dir = test_security.nobodys_dir

PLUGIN = "libmlgo_inliner.so"
# A plugin whose constructor leaves a mark: if the mark appears, another user's code ran.
PLANTED = """#include <stdio.h>
__attribute__((constructor)) static void planted(void) {
  FILE *f = fopen(MARK, "w");
  if (f) fclose(f);
}
"""


@pytest.fixture
def root_only() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to give a file to a second user")


def planted_plugin(path: Path, mark: Path) -> Path:
    """A loadable plugin at PATH whose constructor creates MARK."""
    source = path.parent / "planted.c"
    source.write_text(PLANTED)
    define = f'-DMARK="{mark}"'
    subprocess.run(["cc", "-shared", "-fPIC", define, str(source), "-o", str(path)], check=True)
    source.unlink()
    return path


def plain_object(src: Path, out: Path, compiler: str = "clang-22") -> bytes:
    subprocess.run([compiler, "-Oz", "-c", str(src), "-o", str(out)], check=True)
    return out.read_bytes()


def canary_and_plain(tmp_path: Path) -> tuple[Path, bytes]:
    """The canary source in TMP_PATH, and the object plain clang makes of it."""
    src = tmp_path / "canary.c"
    src.write_text(CANARY)
    return src, plain_object(src, tmp_path / "plain.o")


def assert_plain_compile(r: subprocess.CompletedProcess, out: Path, plain: bytes, why: str):
    """One warning naming WHY, and the object plain clang writes, byte for byte."""
    assert r.returncode == 0, r.stderr
    line = one_line(r.stderr)
    assert line.startswith("mlgo-cc: warning:") and why in line and "default heuristic" in line
    assert out.read_bytes() == plain


def lease_env(tmp_path: Path, flags: list[str], cache: Path) -> tuple[dict, subprocess.Popen]:
    fake = start_fake(tmp_path / "mlgo.sock", {"lease": "1", "flags": flags, "policies": []})
    return dict(os.environ, MLGO_SOCKET=str(tmp_path / "mlgo.sock"), MLGO_CACHE=str(cache)), fake


# -- 1. a plugin in a cache another user could write never runs ---------------------------
@pytest.mark.parametrize(
    "setup", ["their cache", "a cache others may write", "their plugin", "a path through theirs"]
)
def test_a_plugin_another_user_could_have_planted_never_runs(
    setup, cc, root_only, nobodys_dir, tmp_path
):
    """The lease names a plugin in MLGO_CACHE; whoever could have written it, it is not
    loaded: one warning, plain clang's object, and the planted constructor never ran."""
    cache = {"a path through theirs": nobodys_dir / "mine"}.get(setup, tmp_path / "cache")
    plugin_dir = cache / "plugin" / "k"
    plugin_dir.mkdir(parents=True)
    mark = tmp_path / "planted-code-ran"
    planted_plugin(plugin_dir / PLUGIN, mark)
    if setup == "their cache":
        for p in (cache, cache / "plugin", plugin_dir, plugin_dir / PLUGIN):
            os.chown(p, NOBODY, NOBODY)
    elif setup == "a cache others may write":
        cache.chmod(0o777)
    elif setup == "their plugin":
        os.chown(plugin_dir / PLUGIN, NOBODY, NOBODY)
    src, plain = canary_and_plain(tmp_path)
    env, fake = lease_env(tmp_path, [f"-fpass-plugin={plugin_dir / PLUGIN}"], cache)
    try:
        out = tmp_path / "canary.o"
        assert_plain_compile(mlgo_cc(cc, src, out, env), out, plain, "")
        assert not mark.exists(), "another user's plugin ran"
        r = mlgo_cc(cc, src, out, dict(env, MLGO_STRICT="1"))
        assert r.returncode == 1 and one_line(r.stderr).startswith("mlgo-cc: error:")
        assert not mark.exists(), "another user's plugin ran"
    finally:
        fake.kill()
        fake.wait()


def test_a_shared_cache_is_refused_before_anything_is_built_in_it(tmp_path):
    """A service started on demand with a cache others may write builds nothing there: its
    start fails with one line, and the compile is plain clang's."""
    cache = tmp_path / "shared"
    cache.mkdir()
    cache.chmod(0o777)
    src, plain = canary_and_plain(tmp_path)
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    env = dict(os.environ, MLGO_CACHE=str(cache), XDG_RUNTIME_DIR=str(runtime))
    env.pop("MLGO_SOCKET", None)
    out = tmp_path / "canary.o"
    r = mlgo_cc(test_service.MLGO_CC, src, out, env)
    assert_plain_compile(r, out, plain, "did not start")
    assert not list(cache.iterdir()), "something was built in a shared cache"
    log = (runtime / "mlgo" / "service.log").read_text()
    assert "is writable by other users" in log and "MLGO_CACHE" in log


@pytest.mark.unit
def test_trust_follows_the_whole_path(tmp_path):
    private = trusted_dir(tmp_path / "a" / "b", "the cache", "way out")
    assert path_problem(private) is None and private.stat().st_mode & 0o777 == 0o700
    (tmp_path / "a").chmod(0o775)
    assert "writable by other users" in (path_problem(private) or "")
    with pytest.raises(UntrustedPathError, match="refusing the cache .* way out"):
        trusted_dir(private, "the cache", "way out")
    (tmp_path / "a").chmod(0o1777)  # sticky: others may add names, not replace ours
    assert path_problem(private) is None
    assert "cannot be checked" in (path_problem(tmp_path / "missing") or "")


# -- 2. a policy is data: its strings never become code -----------------------------------
INJECTED_NAME = (
    'sroa_savings", 0};\n__attribute__((constructor)) static void planted() '
    '{ __builtin_trap(); }\nconst char* const kIgnored[] = {"x'
)


@pytest.fixture
def injected_policy(tmp_path: Path) -> Path:
    policy = tmp_path / "injected-policy"
    shutil.copytree(SHIPPED, policy, ignore=shutil.ignore_patterns("saved_model"))
    norm = json.loads((policy / "normalization.json").read_text())
    norm["features"][0] = INJECTED_NAME
    (policy / "normalization.json").write_text(json.dumps(norm))
    return policy


@pytest.mark.unit
def test_a_feature_name_that_is_not_llvms_is_refused(injected_policy):
    with pytest.raises(PolicyError) as e:
        load_policy(injected_policy)
    message = str(e.value)
    assert "normalization.json" in message and "is not a inlining-size feature" in message
    assert "\n" not in message.replace("\\n", "")


@pytest.mark.unit
def test_a_string_written_into_generated_source_cannot_end_its_literal():
    assert c_string("callee_users") == '"callee_users"'
    assert c_string('a"b\\c\n\u00e9') == '"a\\042b\\134c\\012\\303\\251"'


def test_an_injected_policy_is_one_line_and_loses_no_compile(cc, injected_policy, tmp_path):
    one_line_error(mlgo("serve", "--policy", str(injected_policy)), "normalization.json")
    src, plain = canary_and_plain(tmp_path)
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    env = dict(os.environ, MLGO_POLICY=str(injected_policy), XDG_RUNTIME_DIR=str(runtime))
    env.update(MLGO_CACHE=str(tmp_path / "cache"))
    env.pop("MLGO_SOCKET", None)
    out = tmp_path / "canary.o"
    assert_plain_compile(mlgo_cc(cc, src, out, env), out, plain, "did not start")
    assert not (tmp_path / "cache" / "plugin").exists(), "a plugin was built from it"


# -- 3. a plugin that does not load loses no compile ---------------------------------------
@pytest.mark.parametrize("broken", ["truncated", "not a library"])
def test_a_plugin_that_does_not_load_loses_no_compile(broken, cc, tmp_path):
    cache = tmp_path / "cache"
    plugin_dir = cache / "plugin" / "k"
    plugin_dir.mkdir(parents=True)
    real = planted_plugin(tmp_path / "whole.so", tmp_path / "mark")
    data = real.read_bytes()
    (plugin_dir / PLUGIN).write_bytes(data[: len(data) // 3] if broken == "truncated" else b"x")
    src, plain = canary_and_plain(tmp_path)
    env, fake = lease_env(tmp_path, [f"-fpass-plugin={plugin_dir / PLUGIN}"], cache)
    try:
        out = tmp_path / "canary.o"
        r = mlgo_cc(cc, src, out, env)
        assert_plain_compile(r, out, plain, "the compile with the policy failed")
        r = mlgo_cc(cc, src, out, dict(env, MLGO_STRICT="1"))
        assert r.returncode != 0 and "mlgo-cc: warning" not in r.stderr
    finally:
        fake.kill()
        fake.wait()


def test_a_compiler_that_is_not_clang_still_compiles(cc, plugin, tmp_path):
    """MLGO_CC=gcc: gcc refuses -fpass-plugin, and the file is gcc's own plain compile."""
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")
    src = tmp_path / "canary.c"
    src.write_text(CANARY)
    plain = plain_object(src, tmp_path / "plain.o", "gcc")
    out = tmp_path / "canary.o"
    r = mlgo_cc(cc, src, out, plugin.env(MLGO_CC="gcc"))
    assert_plain_compile(r, out, plain, "the compile with the policy failed")


def test_a_user_error_is_clangs_alone(cc, plugin, tmp_path):
    """A file that does not compile fails as plain clang fails it, with no word from mlgo."""
    src = tmp_path / "broken.c"
    src.write_text("int f(void) { return }\n")
    r = mlgo_cc(cc, src, tmp_path / "broken.o", plugin.env())
    plain = subprocess.run(["clang-22", "-Oz", "-c", str(src), "-o", str(tmp_path / "p.o")])
    assert r.returncode == plain.returncode != 0
    assert "error:" in r.stderr and "mlgo-cc" not in r.stderr
    assert not (tmp_path / "broken.o").exists()


def test_the_service_refuses_a_plugin_clang_cannot_load(tc, tmp_path):
    from mlgo.ship.aot import AotError
    from mlgo.ship.plugin import check_loads

    broken = tmp_path / PLUGIN
    broken.write_bytes(b"\x7fELF truncated")
    with pytest.raises(AotError, match="clang cannot load the inlining plugin"):
        check_loads(broken, tc)


# -- 4. working directories no other user can squat; numbers that are numbers --------------
def test_a_squatted_channel_directory_names_its_owner(root_only, tmp_path):
    squatted = tmp_path / f"mlgo-{os.getuid()}"
    squatted.mkdir(mode=0o777)
    os.chown(squatted, NOBODY, NOBODY)
    r = mlgo("doctor", env={"TMPDIR": str(tmp_path)})
    one_line_error(r, str(squatted), f"uid {NOBODY}", "TMPDIR")
    assert "channel probe" not in r.stderr and "setup.sh" not in r.stderr
    assert squatted.stat().st_uid == NOBODY, "another user's directory was touched"


def test_a_squatted_runtime_directory_names_its_owner(root_only, tmp_path):
    squatted = tmp_path / "mlgo"
    squatted.mkdir(mode=0o700)
    os.chown(squatted, NOBODY, NOBODY)
    with pytest.raises(UntrustedPathError, match=f"is taken: a directory of uid {NOBODY}"):
        private_dir(squatted, "the runtime directory", "set XDG_RUNTIME_DIR")
    r = mlgo("status", env={"XDG_RUNTIME_DIR": str(tmp_path)})
    one_line_error(r, str(squatted), f"uid {NOBODY}", "XDG_RUNTIME_DIR")


@pytest.mark.parametrize(
    "command",
    [
        ("tune", "--source", ".", "--build", "true", "--out", "OUT", "--minutes", "nan"),
        ("tune", "--source", ".", "--build", "true", "--out", "OUT", "--minutes", "inf"),
        ("tune", "--source", ".", "--build", "true", "--out", "OUT", "--minutes", "1e308"),
        ("train", "--corpus", "C", "--out", "OUT", "--minutes", "-inf"),
        ("demo", "--out", "OUT", "--minutes", "nan"),
        ("serve", "--idle-exit", "inf"),
    ],
)
def test_numbers_that_are_not_finite_are_refused_when_parsed(command, tmp_path):
    args = [a.replace("OUT", str(tmp_path / "out")) for a in command]
    one_line_error(mlgo(*args), "Invalid value", code=2)
    assert not (tmp_path / "out").exists()
