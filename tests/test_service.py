"""The policy service and mlgo-cc with the real clang: decisions come from the policy, many
compilations run at once, and every failure ends in a finished compile, never a hang."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from mlgo.corpus.compile import compile_module
from mlgo.data import SERVED_BY_DEFAULT
from mlgo.problems import get_problem
from mlgo.problems.policy_files import load_policy, save_policy
from mlgo.programs.measure import live_children
from mlgo.serve.client import ServiceError, request, runtime_dir
from mlgo.serve.native_wrapper import NATIVE_SOURCE, build_native_wrapper, install_native_wrappers
from tests.conftest import DATA, MLGO, SHIPPED, WRAPPER_KINDS, random_policy, save_inline_all

MLGO_CC = [sys.executable, "-c", "from mlgo.serve.cc import main_c; main_c()"]
SOURCES = sorted((DATA / "minipkg").glob("*.c"))
CXX_SOURCE = DATA / "cxx" / "inventory.cc"


class Service:
    """`mlgo serve` in the background on a private socket."""

    def __init__(self, tmp: Path, *args: str, cwd: Path | None = None):
        self.socket = tmp / "mlgo.sock"
        self.log = tmp / "serve.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [*MLGO, "serve", "--socket", str(self.socket), *args],
                stdout=log,
                stderr=log,
                cwd=cwd,
            )
        deadline = time.monotonic() + 600  # the first start may AOT-compile the policy
        while not self.socket.exists():
            assert self.proc.poll() is None, self.log.read_text()
            assert time.monotonic() < deadline, "service did not start"
            time.sleep(0.1)

    def status(self) -> dict:
        return request({"op": "status"}, path=self.socket)

    def env(self, **extra: str) -> dict[str, str]:
        return dict(os.environ, MLGO_SOCKET=str(self.socket), **extra)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)


@pytest.fixture(scope="module")
def native(tmp_path_factory):
    service = Service(
        tmp_path_factory.mktemp("svc"), "--policy", str(SHIPPED), "--backend", "native"
    )
    yield service
    service.stop()


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    """The default backend: the inlining policy inside clang."""
    service = Service(tmp_path_factory.mktemp("plugin"), "--policy", str(SHIPPED))
    yield service
    service.stop()


@pytest.fixture(scope="module")
def native_wrappers(tmp_path_factory) -> list[Path]:
    """The C fast path, mlgo-cc and mlgo-c++, built as `mlgo install-wrappers` builds it."""
    return install_native_wrappers(tmp_path_factory.mktemp("bin"))


@pytest.fixture(scope="module")
def native_cc(native_wrappers) -> list[str]:
    return [str(native_wrappers[0])]


@pytest.fixture(params=WRAPPER_KINDS)
def cc(request, native_cc) -> list[str]:
    """Both wrappers: the Python reference and the native one must behave the same."""
    return MLGO_CC if request.param == "python" else native_cc


def mlgo_cc(cc: list[str], src: Path, out: Path, env: dict[str, str], timeout: float = 120):
    cmd = [*cc, "-Oz", "-c", str(src), "-o", str(out)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def channel_files(service: Service) -> list[Path]:
    return list((service.socket.parent / "channels").iterdir())


def test_mlgo_cc_builds_what_the_policy_decides(cc, native, mini_corpus, tc, tmp_path):
    """The object from the native service is the object the numpy policy produces."""
    policy = load_policy(SHIPPED)
    before = native.status()["decisions"]
    for module in mini_corpus.modules:
        src = DATA / "minipkg" / (Path(module.name).stem + ".c")
        got = tmp_path / "served.o"
        r = mlgo_cc(cc, src, got, native.env())
        assert r.returncode == 0 and "warning" not in r.stderr, r.stderr
        want = tmp_path / "reference.o"
        compile_module(get_problem("inlining-size"), module, tc.clang, policy, keep_object=want)
        assert got.read_bytes() == want.read_bytes(), module.name
    status = native.status()
    assert status["decisions"] > before and status["failed_compilations"] == 0
    assert status["policies"][0]["backend"] == "native"
    assert status["policies"][0]["latency"]["p50_us"] > 0


def test_many_concurrent_compilations_leave_nothing_behind(native_cc, native, tmp_path):
    jobs = [(src, tmp_path / f"{i}-{src.stem}.o") for i in range(6) for src in SOURCES]
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda job: mlgo_cc(native_cc, *job, native.env()), jobs))
    assert all(r.returncode == 0 and not r.stderr for r in results)
    status = native.status()
    assert status["active_leases"] == 0 and not channel_files(native)


def test_socket_and_runtime_dir_are_private(native, tmp_path, monkeypatch):
    assert stat.S_IMODE(native.socket.stat().st_mode) == 0o600
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert stat.S_IMODE(runtime_dir().stat().st_mode) == 0o700
    (tmp_path / "mlgo").chmod(0o777)
    with pytest.raises(ServiceError, match="not a private directory"):
        runtime_dir()


def test_the_plugin_decides_as_the_policy_does(cc, plugin, mini_corpus, tc, tmp_path):
    """Inside clang, the shipped policy makes the numpy reference's decisions, call site
    for call site; and a policy that departs from the default visibly does so."""
    status = plugin.status()
    assert status["policies"][0]["backend"] == "plugin"
    inline_all = load_policy(save_inline_all(tmp_path / "inline-all", languages=None))
    eager = Service(tmp_path, "--policy", str(tmp_path / "inline-all"), "--backend", "plugin")
    try:
        departed = 0
        for policy, service in ((load_policy(SHIPPED), plugin), (inline_all, eager)):
            for module in mini_corpus.modules:
                src = DATA / "minipkg" / (Path(module.name).stem + ".c")
                got, want = tmp_path / "plugin.o", tmp_path / "reference.o"
                r = mlgo_cc(cc, src, got, service.env())
                assert r.returncode == 0 and not r.stderr, r.stderr
                compile_module(
                    get_problem("inlining-size"), module, tc.clang, policy, keep_object=want
                )
                assert got.read_bytes() == want.read_bytes(), module.name
                plain = tmp_path / "plain.o"
                subprocess.run([tc.clang, "-Oz", "-c", str(src), "-o", str(plain)], check=True)
                departed += service is eager and got.read_bytes() != plain.read_bytes()
        assert departed > 0
    finally:
        eager.stop()
    assert plugin.status()["failed_compilations"] == 0


# Each backend in turn, a service and a native server build each: the long tier.
@pytest.mark.slow
def test_every_backend_applies_a_departure_gate_alike(native_cc, recordings, tc, tmp_path):
    """A gated policy (tests/test_aot.py's random one, gated so that only its surer half of
    departures stay; its native server is built once for both) gives the same objects from
    the numpy policy, the native AOT server and the plugin, on C and on C++; and the gate
    keeps some departures, not all."""
    from mlgo.llvm.channel import compile_interactive
    from mlgo.ship.export import export_saved_model

    problem, _, features, x = recordings("inlining-size")
    gated = random_policy(problem, x, features[problem.default_feature].reshape(-1))
    eager = replace(gated, departure_threshold=None)
    save_policy(gated, tmp_path / "gated")
    export_saved_model(gated, tmp_path / "gated")
    mlgo_cxx = str(Path(native_cc[0]).with_name("mlgo-c++"))
    c_source = DATA / "minipkg" / "hash.c"  # where this gate keeps some departures, not all
    sources = [(c_source, native_cc[0], tc.clang), (CXX_SOURCE, mlgo_cxx, tc.clangxx)]
    objects: dict[str, list[bytes]] = {}
    for backend in ("python", "native", "plugin"):
        (tmp_path / backend).mkdir()
        service = Service(
            tmp_path / backend, "--policy", str(tmp_path / "gated"), "--backend", backend
        )
        try:
            for src, wrapper, _ in sources:
                r = mlgo_cc([wrapper], src, tmp_path / "got.o", service.env())
                assert r.returncode == 0 and not r.stderr, r.stderr
                objects.setdefault(src.name, []).append((tmp_path / "got.o").read_bytes())
            if backend == "plugin":  # by hand, `mlgo channel` names what a gated one needs
                r = by_hand("mlgo channel", service.env())
                note = r.stderr.partition("this policy's channel needs: ")[2].split()
                assert "-inliner-interactive-include-default" in note, r.stderr
                hand = tmp_path / "hand.o"
                subprocess.run([tc.clang, "-Oz", "-c", c_source, "-o", hand, *note], check=True)
                objects[c_source.name].append(hand.read_bytes())
        finally:
            service.stop()
    for src, _, compiler in sources:
        served = objects[src.name]
        assert len(set(served)) == 1, f"{src.name}: the backends (or by hand) disagree"
        plain, ungated = tmp_path / "plain.o", tmp_path / "ungated.o"
        subprocess.run([compiler, "-Oz", "-c", str(src), "-o", str(plain)], check=True)
        cmd = [compiler, "-Oz", "-c", str(src), "-o", str(ungated)]
        compile_interactive(cmd, eager, problem.channel_flags)
        assert served[0] != plain.read_bytes(), f"{src.name}: the gate kept no departure"
        assert served[0] != ungated.read_bytes(), f"{src.name}: the gate let every one through"


# The native backend builds a policy server of this policy's own: the long tier.
@pytest.mark.parametrize(
    "backend", ["python", pytest.param("native", marks=pytest.mark.slow), "plugin"]
)
def test_every_backend_serves_a_policys_base(backend, native_cc, tc, tmp_path):
    """An inlining-speed policy that never departs, with its base at inline threshold 0,
    builds through mlgo-cc what clang -O2 builds with that threshold, whichever backend
    serves it: the base reaches the compiler, through both wrappers' lease checks."""
    speed = get_problem("inlining-speed")
    size = load_policy(SHIPPED)
    policy = replace(size, problem=speed, departure_threshold=1.0, languages=None, base=0)
    save_policy(policy, tmp_path / "based")
    src = SOURCES[-1]
    want, plain = tmp_path / "want.o", tmp_path / "plain.o"
    subprocess.run([tc.clang, "-O2", "-c", src, "-o", want, *policy.base_flags], check=True)
    subprocess.run([tc.clang, "-O2", "-c", src, "-o", plain], check=True)
    assert want.read_bytes() != plain.read_bytes()  # the threshold moves this file
    service = Service(tmp_path, "--policy", str(tmp_path / "based"), "--backend", backend)
    try:
        got = tmp_path / f"{backend}.o"
        cmd = [*native_cc, "-O2", "-c", str(src), "-o", str(got)]
        r = subprocess.run(cmd, env=service.env(), capture_output=True, text=True, timeout=300)
        assert r.returncode == 0 and not r.stderr, r.stderr
        assert got.read_bytes() == want.read_bytes(), backend
    finally:
        service.stop()


def test_the_plugin_falls_back_on_an_unknown_feature_layout(cc, mismatched_policy, tc, tmp_path):
    service = Service(tmp_path, "--policy", str(mismatched_policy), "--backend", "plugin")
    try:
        r = mlgo_cc(cc, SOURCES[0], tmp_path / "a.o", service.env())
    finally:
        service.stop()
    assert r.returncode == 0 and r.stderr.count("\n") == 1, r.stderr
    assert "inlining_default" in r.stderr and "default heuristic" in r.stderr
    plain = tmp_path / "plain.o"
    subprocess.run([tc.clang, "-Oz", "-c", str(SOURCES[0]), "-o", str(plain)], check=True)
    assert (tmp_path / "a.o").read_bytes() == plain.read_bytes()


def by_hand(line: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """LINE run by a shell, `mlgo` in it being this checkout's command, as a user types it."""
    script = f'mlgo() {{ {shlex.join(MLGO)} "$@"; }}\n{line}'
    return subprocess.run(
        ["sh", "-c", script], env=env, capture_output=True, text=True, timeout=300
    )


README_BY_HAND = (
    "clang-22 -Oz -c {src} -o {out} -mllvm -enable-ml-inliner=release "
    "-mllvm -inliner-interactive-include-default "
    '-mllvm -inliner-interactive-channel-base="$(mlgo channel)"'
)


def test_readme_channel_by_hand_works_on_the_default_service(plugin, tmp_path):
    """README's by-hand line against the service mlgo-cc starts (the plugin): the channel is
    answered by the native server of the same policy, so the objects are mlgo-cc's."""
    for src in SOURCES:
        want, got = tmp_path / "cc.o", tmp_path / "hand.o"
        assert mlgo_cc(MLGO_CC, src, want, plugin.env()).returncode == 0
        r = by_hand(README_BY_HAND.format(src=src, out=got), plugin.env())
        assert r.returncode == 0, r.stderr  # a gated policy's note names the flag the line has
        note = "mlgo: note: this policy's channel needs: "
        assert not r.stderr or (r.stderr.startswith(note) and r.stderr.count("\n") == 1)
        assert "include-default" in r.stderr or not r.stderr, r.stderr
        assert got.read_bytes() == want.read_bytes(), src.name
    (policy,) = plugin.status()["policies"]
    assert (policy["backend"], policy["by_hand"]) == ("plugin", "native")
    status = [*MLGO, "status", "--socket", str(plugin.socket)]
    r = subprocess.run(status, capture_output=True, text=True, env=dict(os.environ, COLUMNS="200"))
    assert "inlining-size (plugin; channels by hand: native)" in r.stdout, r.stdout
    deadline = time.monotonic() + 10
    while channel_files(plugin):  # each by-hand lease ends after its compilation
        assert time.monotonic() < deadline
        time.sleep(0.05)


@pytest.mark.slow
def test_a_plugin_policy_without_a_saved_model_answers_channels_natively(tmp_path, tc):
    """A policy directory's SavedModel is never what gets AOT-compiled: the native server is
    built from the policy's weights, so a policy without one answers channels by hand
    natively, with the plugin's decisions (here, departing from clang's default)."""
    save_inline_all(tmp_path / "inline-all", languages=None)
    service = Service(tmp_path, "--policy", str(tmp_path / "inline-all"))
    try:
        departed = 0
        for src in SOURCES:
            want, got, plain = tmp_path / "cc.o", tmp_path / "hand.o", tmp_path / "plain.o"
            assert mlgo_cc(MLGO_CC, src, want, service.env()).returncode == 0
            r = by_hand(README_BY_HAND.format(src=src, out=got), service.env())
            assert r.returncode == 0 and not r.stderr, r.stderr
            assert got.read_bytes() == want.read_bytes(), src.name
            subprocess.run([tc.clang, "-Oz", "-c", str(src), "-o", str(plain)], check=True)
            departed += got.read_bytes() != plain.read_bytes()
        assert departed > 0
        assert service.status()["policies"][0]["by_hand"] == "native"
        assert not (tmp_path / "inline-all" / "saved_model").exists()
    finally:
        service.stop()


@pytest.mark.parametrize("served", ["plugin", "native"])
def test_mlgo_flags_in_a_users_own_command_build_what_mlgo_cc_builds(served, request, tmp_path):
    """`clang-22 $(mlgo flags -- -Oz) -Oz -c x.c`: the plugin where there is one (flags for a
    whole build), a channel for one compilation otherwise; mlgo-cc's object either way."""
    service = request.getfixturevalue(served)
    want, got = tmp_path / "cc.o", tmp_path / "flags.o"
    assert mlgo_cc(MLGO_CC, SOURCES[0], want, service.env()).returncode == 0
    line = f"f=$(mlgo flags -- -Oz -g) && echo $f && clang-22 $f -Oz -c {SOURCES[0]} -o {got}"
    r = by_hand(line, service.env())
    assert r.returncode == 0 and not r.stderr, r.stderr
    route = "-fpass-plugin=" if served == "plugin" else "-inliner-interactive-channel-base="
    assert r.stdout.count("\n") == 1 and route in r.stdout, r.stdout
    assert got.read_bytes() == want.read_bytes()


def test_serve_with_no_policy_serves_the_shipped_ones_wherever_it_is_run(tmp_path):
    service = Service(tmp_path, cwd=tmp_path)
    try:
        served = [Path(p["path"]) for p in service.status()["policies"]]
        shipped = [SHIPPED.with_name(name).resolve() for name in SERVED_BY_DEFAULT]
        assert served == shipped and shipped[0].name == "inlining-size-guarded"
    finally:
        service.stop()


def test_mlgo_flags_starts_the_service_as_mlgo_cc_does(tmp_path):
    """With no service running, `mlgo flags` starts the default one: the plugin's flag, and
    a note that a command line by hand is not guarded as mlgo-cc's compiles are."""
    env = dict(os.environ, XDG_RUNTIME_DIR=str(tmp_path))
    env.pop("MLGO_SOCKET", None)
    env.pop("MLGO_POLICY", None)
    try:
        r = by_hand("mlgo flags -- -Oz", env)
        assert r.returncode == 0, r.stderr
        assert (
            r.stderr
            == "mlgo: note: a served policy ships with the size guard: only mlgo-cc gives it\n"
        )
        assert r.stdout.startswith("-fpass-plugin=") and r.stdout.count("\n") == 1
    finally:
        by_hand("mlgo stop", env)
    assert "serving inlining-size (plugin)" in (tmp_path / "mlgo" / "service.log").read_text()


def test_mlgo_flags_at_another_level_print_nothing_and_say_why(plugin):
    r = subprocess.run(
        [*MLGO, "flags", "--socket", str(plugin.socket), "--", "-O2", "-Wall"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0 and r.stdout == "", r.stdout
    assert r.stderr == (
        "mlgo: note: -O2 compiles are left to clang's default: the served policies are for -Oz\n"
    )


def test_mlgo_flags_for_a_language_the_policy_does_not_answer_print_nothing_and_say_why(
    tmp_path,
):
    """A policy for C: CFLAGS get its flags, CXXFLAGS nothing and a note; a language it does
    not know is one line."""
    save_policy(replace(load_policy(SHIPPED), languages=("c",)), tmp_path / "c-only")
    service = Service(tmp_path, "--policy", str(tmp_path / "c-only"))
    flags = [*MLGO, "flags", "--socket", str(service.socket)]
    try:
        r = subprocess.run([*flags, "--", "-Oz"], capture_output=True, text=True)
        assert r.returncode == 0 and r.stdout.startswith("-fpass-plugin="), r.stderr
        r = subprocess.run(
            [*flags, "--language", "c++", "--", "-Oz"], capture_output=True, text=True
        )
        assert r.returncode == 0 and r.stdout == "", r.stdout
        assert r.stderr == (
            "mlgo: note: -Oz C++ compiles are left to clang's default: inlining-size is "
            "calibrated for C only\n"
        )
        r = subprocess.run(
            [*flags, "--language", "rust", "--", "-Oz"], capture_output=True, text=True
        )
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--language 'rust'" in r.stderr
    finally:
        service.stop()


@pytest.mark.parametrize("command", [["channel"], ["flags", "--", "-O2"]])
def test_a_problem_the_service_does_not_serve_is_one_line(command, plugin):
    cmd = [*MLGO, command[0], "--socket", str(plugin.socket), "--problem", "regalloc-eviction"]
    r = subprocess.run([*cmd, *command[1:]], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stdout == "", r.stdout
    assert r.stderr.count("\n") == 1 and "serves no policy for 'regalloc-eviction'" in r.stderr


def test_channel_by_hand(native, tmp_path):
    base = subprocess.run(
        [*MLGO, "channel", "--socket", str(native.socket)], capture_output=True, text=True
    ).stdout.strip()
    flags = get_problem("inlining-size").channel_flags(base)
    cmd = ["clang-22", "-Oz", "-c", str(SOURCES[0]), "-o", str(tmp_path / "x.o"), *flags]
    assert subprocess.run(cmd, timeout=60).returncode == 0
    deadline = time.monotonic() + 10
    while Path(base + ".in").exists():  # the one-compilation lease ends by itself
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_no_service_falls_back_with_one_warning(cc, tmp_path):
    env = dict(os.environ, MLGO_SOCKET=str(tmp_path / "absent.sock"))
    r = mlgo_cc(cc, SOURCES[0], tmp_path / "a.o", env)
    assert r.returncode == 0 and (tmp_path / "a.o").exists()
    assert r.stderr.count("\n") == 1 and "default heuristic" in r.stderr
    r = mlgo_cc(cc, SOURCES[0], tmp_path / "b.o", dict(env, MLGO_STRICT="1"))
    assert r.returncode == 1 and "mlgo-cc: error: no mlgo service" in r.stderr


def test_a_native_wrapper_of_another_mlgo_is_told_once_to_be_installed_again(native_cc, tmp_path):
    """A native mlgo-cc built from other sources (an older mlgo's) still builds, and its first
    compile says once what to run; this mlgo's own says nothing."""
    older = tmp_path / "mlgo_cc.c"
    older.write_text(NATIVE_SOURCE.read_text() + "/* another version */\n")
    stale = tmp_path / "stale-mlgo-cc"
    build_native_wrapper(stale, source=older)
    (tmp_path / "svc").mkdir()
    service = Service(tmp_path / "svc", "--policy", str(SHIPPED))
    try:
        r = mlgo_cc(native_cc, SOURCES[0], tmp_path / "a.o", service.env())
        assert r.returncode == 0 and r.stderr == "", r.stderr
        for i in range(2):
            r = mlgo_cc([str(stale)], SOURCES[0], tmp_path / f"stale-{i}.o", service.env())
            assert r.returncode == 0
            assert r.stderr.count("run mlgo install-wrappers") == (i == 0), r.stderr
        assert (tmp_path / "stale-0.o").read_bytes() == (tmp_path / "a.o").read_bytes()
    finally:
        service.stop()


def test_user_compile_errors_are_passed_through(cc, native, tmp_path):
    bad = tmp_path / "bad.c"
    bad.write_text("int f(void) { return undeclared; }\n")
    r = mlgo_cc(cc, bad, tmp_path / "bad.o", native.env())
    assert r.returncode != 0 and "undeclared" in r.stderr and "mlgo-cc" not in r.stderr


@pytest.fixture(scope="module")
def mismatched_policy(tmp_path_factory) -> Path:
    """A policy that wants a feature clang does not send it: the compiler's own decision,
    which a channel sends only when asked (for a gated policy; this one is not)."""
    from mlgo.ship.export import export_saved_model

    out = tmp_path_factory.mktemp("mismatch") / "policy"
    policy = replace(load_policy(SHIPPED), departure_threshold=None)  # as the docstring says
    renamed = list(policy.normalizer.features)
    renamed[0] = "inlining_default"
    policy.normalizer = type(policy.normalizer)(
        tuple(renamed), policy.normalizer.quantiles, policy.normalizer.derived
    )
    save_policy(policy, out)
    export_saved_model(policy, out)
    return out


@pytest.fixture(scope="module")
def mismatched(mismatched_policy):
    service = Service(
        mismatched_policy.parent, "--policy", str(mismatched_policy), "--backend", "native"
    )
    yield service
    service.stop()


@pytest.mark.slow  # a native policy server of the mismatched policy's own
def test_unknown_feature_layout_falls_back(cc, mismatched, tmp_path):
    """The channel fails at its header, the compile is redone with the default, and the
    warning says why."""
    failed = mismatched.status()["failed_compilations"]
    r = mlgo_cc(cc, SOURCES[0], tmp_path / "a.o", mismatched.env())
    assert r.returncode == 0, r.stderr
    assert "feature layout mismatch" in r.stderr and "default heuristic" in r.stderr
    assert mismatched.status()["failed_compilations"] == failed + 1


def test_a_hung_policy_times_out_and_falls_back(native_cc, tmp_path):
    service = Service(tmp_path, "--policy", str(SHIPPED), "--backend", "native")
    try:
        mlgo_cc(
            native_cc, SOURCES[0], tmp_path / "warm.o", service.env()
        )  # starts the policy server
        server = _policy_server_pid(service.proc.pid)
        failed = service.status()["failed_compilations"]
        os.kill(server, signal.SIGSTOP)
        try:
            start = time.monotonic()
            r = mlgo_cc(native_cc, SOURCES[0], tmp_path / "a.o", service.env(MLGO_TIMEOUT="3"))
            assert r.returncode == 0 and "MLGO_TIMEOUT=3" in r.stderr
            assert time.monotonic() - start < 30
        finally:
            os.kill(server, signal.SIGCONT)
        deadline = time.monotonic() + 30  # not awaited by mlgo-cc, still counted
        while service.status()["failed_compilations"] == failed:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        service.stop()


def test_a_crashed_policy_server_is_restarted(native_cc, native, tmp_path):
    mlgo_cc(native_cc, SOURCES[0], tmp_path / "warm.o", native.env())
    crashed = _policy_server_pid(native.proc.pid)
    os.kill(crashed, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while Path(f"/proc/{crashed}").exists():  # reaped: the service has seen the crash
        assert time.monotonic() < deadline
        time.sleep(0.01)
    before = native.status()["decisions"]
    for src in SOURCES:
        r = mlgo_cc(native_cc, src, tmp_path / f"{src.stem}.o", native.env())
        assert r.returncode == 0 and not r.stderr, r.stderr
    assert native.status()["decisions"] > before
    assert _policy_server_pid(native.proc.pid)


def test_killing_the_service_mid_build_never_fails_or_hangs(native_cc, tmp_path):
    service = Service(tmp_path, "--policy", str(SHIPPED), "--backend", "python")
    jobs = [(src, tmp_path / f"{i}-{src.stem}.o") for i in range(10) for src in SOURCES]
    try:
        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(mlgo_cc, native_cc, *job, service.env()) for job in jobs]
            deadline = time.monotonic() + 120
            while service.status()["compilations"] < 3:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            service.proc.kill()  # kill -9 in the middle of the parallel build
            results = [f.result() for f in futures]
    finally:
        service.stop()
    assert all(r.returncode == 0 for r in results), [r.stderr for r in results]
    assert all(out.exists() for _, out in jobs)
    fell_back = sum("default heuristic" in r.stderr for r in results)
    assert 0 < fell_back < len(jobs), "some compiles before the kill, some after"


def _policy_server_pid(service_pid: int) -> int:
    for pid in live_children(service_pid):
        if Path(f"/proc/{pid}/exe").resolve().name == "policy_server":
            return pid
    raise AssertionError("no policy_server child")


def test_service_starts_on_demand_and_stops(native_cc, tmp_path):
    env = dict(os.environ, XDG_RUNTIME_DIR=str(tmp_path), MLGO_BACKEND="python")
    env.pop("MLGO_SOCKET", None)
    r = mlgo_cc(native_cc, SOURCES[0], tmp_path / "a.o", env, timeout=300)
    assert r.returncode == 0 and not r.stderr, r.stderr
    socket = tmp_path / "mlgo" / "mlgo.sock"
    assert request({"op": "status"}, path=socket)["compilations"] == 1
    stopped = subprocess.run([*MLGO, "stop", "--socket", str(socket)], timeout=60)
    assert stopped.returncode == 0
    deadline = time.monotonic() + 20
    while socket.exists():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    shutil.rmtree(tmp_path / "mlgo", ignore_errors=True)


def test_a_stopped_service_leaves_a_socket_another_service_took(tmp_path):
    """A build tool that unlinked a dead-looking socket and started its own service: the
    first service, stopped later, must not remove the second's socket on its way out."""
    first = Service(tmp_path, "--policy", str(SHIPPED), "--backend", "python")
    second = None
    try:
        first.socket.unlink()
        second = Service(tmp_path, "--policy", str(SHIPPED), "--backend", "python")
        first.stop()
        assert second.socket.exists() and second.status()["pid"] == second.proc.pid
    finally:
        first.stop()
        if second is not None:
            second.stop()


@pytest.mark.slow  # each backend in turn, as the gate's test above
def test_every_backend_serves_an_embeddings_policy_as_numpy_decides(
    native_cc, mini_corpus, tc, tmp_path
):
    """An inlining-size-ir2vec policy reads float vectors (the callee's and caller's
    embeddings) beside int64s: served by the numpy policy, the native AOT server and the
    plugin, through mlgo-cc, each object is the numpy reference's; and it departs. It is
    tests/test_aot.py's gated ir2vec policy, so its native server is built once."""
    from mlgo.llvm.log_format import element_column
    from mlgo.ship.export import export_saved_model

    problem = get_problem("inlining-size-ir2vec")
    runs = [compile_module(problem, m, tc.clang) for m in mini_corpus.modules]
    runs = [r for r in runs if r.num_decisions]
    names = problem.feature_names
    x = np.concatenate(
        [np.stack([element_column(r.features, f, r.num_decisions) for f in names], 1) for r in runs]
    )
    default = np.concatenate([r.features[problem.default_feature].reshape(-1) for r in runs])
    policy = random_policy(problem, x, default)
    save_policy(policy, tmp_path / "ir2vec")
    export_saved_model(policy, tmp_path / "ir2vec")
    departed = 0
    for backend in ("python", "native", "plugin"):
        (tmp_path / backend).mkdir()
        service = Service(
            tmp_path / backend, "--policy", str(tmp_path / "ir2vec"), "--backend", backend
        )
        try:
            assert service.status()["policies"][0]["backend"] == backend
            for module in mini_corpus.modules:
                src = DATA / "minipkg" / (Path(module.name).stem + ".c")
                got, want = tmp_path / "got.o", tmp_path / "want.o"
                r = mlgo_cc(native_cc, src, got, service.env())
                assert r.returncode == 0 and not r.stderr, r.stderr
                compile_module(problem, module, tc.clang, policy, keep_object=want)
                assert got.read_bytes() == want.read_bytes(), (backend, module.name)
                plain = tmp_path / "plain.o"
                subprocess.run([tc.clang, "-Oz", "-c", str(src), "-o", str(plain)], check=True)
                departed += got.read_bytes() != plain.read_bytes()
        finally:
            service.stop()
    assert departed > 0
    # by hand, the plugin without the vocabulary flags: clang's default, said in one line
    from mlgo.ship.plugin import inliner_plugin

    src, got, plain = SOURCES[-1], tmp_path / "got.o", tmp_path / "plain.o"
    plugin = inliner_plugin(policy, tc)
    cmd = [tc.clang, "-Oz", "-c", str(src)]
    r = subprocess.run([*cmd, f"-fpass-plugin={plugin}", "-o", got], capture_output=True, text=True)
    assert r.returncode == 0 and r.stderr.count("\n") == 1, r.stderr
    assert "needs 'callee_embedding', which this compiler does not send" in r.stderr
    subprocess.run([*cmd, "-o", plain], check=True)
    assert got.read_bytes() == plain.read_bytes()
