"""AOT compilation: a SavedModel becomes a native policy server with no Python per decision.

TF's `saved_model_cli aot_compile_cpu`, called in-process (TF is already loaded to export
the SavedModel; the CLI would import it again), turns the `action` signature into
`model.h` + objects; `mlgo/ship/native/policy_server.cc` includes that header and serves LLVM's
interactive channel. Linking needs a few sources of the XLA AOT runtime that the wheel
ships in `xla_aot_runtime_src`. The whole runtime takes about 15 minutes on 2 cores, but
a small policy only uses the five files below, which build in seconds; the rest is built
only if a link reports symbols they lack. Everything is cached under ~/.cache/mlgo, keyed
by TF version and content, and written to a temp dir that is renamed when complete.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import subprocess
import tempfile
import threading
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from mlgo.errors import MlgoError
from mlgo.problems.profile_inputs import ONLY_THE_PLUGIN, reads_profile
from mlgo.runtime.files import atomic_directory, cache_subdir, close_to_others, held_lock
from mlgo.runtime.messages import error_line
from mlgo.runtime.tfutil import import_tf
from mlgo.runtime.trust import check_trusted

if TYPE_CHECKING:
    from mlgo.problems.policy import MLPPolicy

SERVER_SOURCE = Path(__file__).parent / "native" / "policy_server.cc"
CLASS_NAME = "Model"
ARTIFACTS = ("model.h", "model.o", "model_constants.o", "model_metadata.o")
CORE_RUNTIME = (
    "tensorflow/compiler/tf2xla/xla_compiled_cpu_function.cc",
    "tensorflow/compiler/tf2xla/allocator.cc",
    "xla/executable_run_options.cc",
    "xla/service/custom_call_status.cc",
    "xla/backends/cpu/runtime/rng_state_lib.cc",
)
CXXFLAGS = ["-O2", "-w", "-std=c++17", "-D_GLIBCXX_USE_CXX11_ABI=1", "-fPIC"]


class AotError(MlgoError):
    """AOT compilation or the native server's build failed; the message is one line."""


@cache
def tf_dir() -> Path:
    """The installed TF wheel's directory, found without importing TF (slow, noisy)."""
    spec = importlib.util.find_spec("tensorflow")
    if spec is None or spec.origin is None:
        raise AotError("TensorFlow is not installed; run tools/setup.sh")
    return Path(spec.origin).parent


def tf_version() -> str:
    from importlib.metadata import version

    return version("tensorflow")


def run_step(cmd: list[str], what: str, cwd: Path | None = None) -> None:
    """CMD, a step of a build; its failure an AotError naming WHAT and its error line."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="-1")
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env)
    if proc.returncode != 0:
        output = proc.stderr + proc.stdout
        raise AotError(f"{what} failed (exit {proc.returncode}): {error_line(output)}")


def aot_compile(saved_model: Path, out: Path) -> Path:
    """Writes OUT/model.h and its objects from SAVED_MODEL's `action` signature."""
    if not (saved_model / "saved_model.pb").is_file():
        raise AotError(f"{saved_model}: not a SavedModel (no saved_model.pb)")
    with atomic_directory(out) as staging:
        _compile_action_signature(saved_model, staging / "model")
        (staging / "tf_version").write_text(tf_version() + "\n")
        (staging / "model_makefile.inc").unlink(missing_ok=True)  # names this machine's paths
    return out


_COMPILING = threading.Lock()


def _compile_action_signature(saved_model: Path, prefix: Path) -> None:
    """What `saved_model_cli aot_compile_cpu` does with this module's options (the CLI's
    own function). One compile at a time: TF's function freezes the graph into a
    per-process temp dir and appends to XLA_FLAGS, which is restored after it."""
    import_tf()
    from tensorflow.python.tools import saved_model_aot_compile, saved_model_utils

    with _COMPILING:
        xla_flags = os.environ.get("XLA_FLAGS")
        try:
            saved_model_aot_compile.aot_compile_cpu_meta_graph_def(
                checkpoint_path=str(saved_model / "variables" / "variables"),
                meta_graph_def=saved_model_utils.get_meta_graph_def(str(saved_model), "serve"),
                output_prefix=str(prefix),
                signature_def_key="action",
                cpp_class=CLASS_NAME,
                target_triple="x86_64-pc-linux",
                target_cpu="",
            )
        except Exception as e:  # TF's own errors are many kinds; each says what failed
            raise AotError(f"AOT compiling {saved_model}: {error_line(e)}") from e
        finally:
            if xla_flags is None:
                os.environ.pop("XLA_FLAGS", None)
            else:
                os.environ["XLA_FLAGS"] = xla_flags


def _runtime_objects(sources: tuple[str, ...]) -> list[Path]:
    """Compiled runtime sources, cached per TF version (compiled once per file)."""
    src_root = tf_dir() / "xla_aot_runtime_src"
    target = cache_subdir(f"aot-runtime-tf{tf_version()}")
    objects = []
    for rel in sources:
        obj = target / (rel.replace("/", "__") + ".o")
        if not obj.exists():
            fd, tmp = tempfile.mkstemp(suffix=".o", dir=target)
            os.close(fd)
            try:
                run_step(
                    ["g++", *CXXFLAGS, f"-I{tf_dir() / 'include'}", "-c", str(src_root / rel)]
                    + ["-o", tmp],
                    f"compiling the XLA AOT runtime ({rel})",
                )
                os.replace(tmp, obj)
            finally:
                Path(tmp).unlink(missing_ok=True)
        objects.append(obj)
    return objects


def _all_runtime_sources() -> tuple[str, ...]:
    root = tf_dir() / "xla_aot_runtime_src"
    return tuple(sorted(str(p.relative_to(root)) for p in root.rglob("*.cc")))


def _link(staging: Path, aot: Path, runtime: list[Path]) -> subprocess.CompletedProcess:
    tf = tf_dir()
    return subprocess.run(
        ["g++", *CXXFLAGS, f"-I{aot}", f"-I{tf / 'include'}", str(SERVER_SOURCE)]
        + [str(aot / a) for a in ARTIFACTS[1:]]
        + [str(o) for o in runtime]
        + [f"-L{tf}", "-l:libtensorflow_framework.so.2", f"-Wl,-rpath,{tf}", "-lpthread"]
        + ["-o", str(staging / "policy_server")],
        capture_output=True,
        text=True,
    )


def cached_build(kind: str, key_material: bytes, name: str, build: Callable[[Path], None]) -> Path:
    """CACHE/KIND/<hash>/NAME, made by BUILD(staging dir) on first use, and checked on
    every use (it will run as this user: `mlgo.runtime.trust`). The staging dir is renamed
    into place only when complete, so a killed build leaves nothing half-written; a key is
    built by one process at a time, the others waiting to find it built."""
    key = hashlib.sha256(key_material).hexdigest()[:20]
    target = cache_subdir(kind) / key
    if not (target / name).exists():
        # one build of a key at a time: parallel compiles (or test workers) wait for it
        with held_lock(target.with_name(f"{key}.lock")):
            if not (target / name).exists():
                with atomic_directory(target, replace=False) as staging:
                    build(staging)
                    close_to_others(staging)
    return check_trusted(target / name, f"the cached {kind} build", f"remove {target}")


def native_server(policy: MLPPolicy) -> Path:
    """The policy server for POLICY, built on first use and cached. Its SavedModel is
    exported here from the policy's weights, never taken from the policy's directory: AOT
    compilation turns whatever graph a SavedModel holds into code, and a policy is data
    that other people send."""
    if reads_profile(policy.normalizer.features):
        raise AotError(f"no policy server: {ONLY_THE_PLUGIN}")

    def build(staging: Path) -> None:
        from mlgo.ship.export import export_saved_model

        aot = aot_compile(export_saved_model(policy, staging), staging / "aot")
        proc = _link(staging, aot, _runtime_objects(CORE_RUNTIME))
        if proc.returncode != 0 and re.search(r"undefined reference", proc.stderr):
            proc = _link(staging, aot, _runtime_objects(_all_runtime_sources()))
        if proc.returncode != 0:
            raise AotError(f"linking the policy server failed: {error_line(proc.stderr)}")

    return cached_build("native", server_key(policy), "policy_server", build)


def server_key(policy: MLPPolicy) -> bytes:
    """What a built policy server depends on: the policy, the server's source, the TF
    version and the directory of TF's library, which the binary's rpath names (a server
    built for a virtualenv that was since deleted or recreated elsewhere would not start)."""
    head = f"{tf_version()}\0{tf_dir()}\0{policy.fingerprint()}\0"
    return head.encode() + SERVER_SOURCE.read_bytes()


def replay(server: Path, log: Path) -> bytes:
    """The raw advice the native server answers to every observation of a recorded log."""
    with tempfile.NamedTemporaryFile(suffix=".advice") as out:
        proc = subprocess.run(
            [str(server), "replay", str(log), out.name], capture_output=True, text=True
        )
        if proc.returncode != 0:
            raise AotError(f"policy server replay of {log}: {proc.stderr.strip()[-300:]}")
        return Path(out.name).read_bytes()
