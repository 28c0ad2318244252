"""The inlining policy compiled into a clang pass plugin: decisions made inside clang.

A stock clang has no embedded model, so the interactive channel is how a policy reaches
it: two context switches and a FIFO round trip per call site, which cost about as much
CPU as clang's own feature computation. `mlgo/ship/native/inline_plugin.cc` instead gives
clang LLVM's MLInlineAdvisor with an in-process runner. It is compiled against LLVM's
headers once per LLVM (about 14 s); this module writes each policy's weights and quantiles
as the C++ constants `policy_constants.h` declares (hex float literals: exact) and links
them with that object into `libmlgo_inliner.so` (about a second), so that judging several
candidates, or the thresholds of one, costs little more than one. Both are cached by
content, like the policy server, and written to a temp dir that is renamed when complete.

The XLA AOT model cannot be used here: its runtime needs Abseil from
libtensorflow_framework.so, which costs about 30 ms of CPU to load in every clang.
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from mlgo.llvm import replay
from mlgo.llvm.cmdline import ADVISED, DEPARTED, DEPARTURES_ENV, DEPARTURES_PREFIX
from mlgo.llvm.log_format import column_of
from mlgo.llvm.toolchain import Toolchain, ToolchainError
from mlgo.problems.policy import MLPPolicy
from mlgo.problems.profile_inputs import PROFILE_INPUTS
from mlgo.runtime.csource import c_string
from mlgo.runtime.messages import error_line
from mlgo.ship.aot import AotError, cached_build, run_step

NATIVE = Path(__file__).parent / "native"
PLUGIN_SOURCE, CONSTANTS_HEADER = NATIVE / "inline_plugin.cc", NATIVE / "policy_constants.h"
COMPILE = ["-O2", "-std=c++17", "-fPIC", "-fno-rtti", "-fno-exceptions", "-fvisibility=hidden"]
COMPILE += ["-D_GLIBCXX_USE_CXX11_ABI=1", f"-I{NATIVE}"]


def _array(ctype: str, name: str, values: list[str]) -> str:
    rows = [", ".join(values[i : i + 8]) for i in range(0, len(values), 8)] or ["0"]
    return f"const {ctype} {name}[] = {{\n  " + ",\n  ".join(rows) + "\n};\n"


def policy_constants(policy: MLPPolicy) -> str:
    """The policy as the C++ definitions of `policy_constants.h`: feature names, derived
    columns, quantiles, layers, the gate."""
    norm = policy.normalizer
    index = {f: i for i, f in enumerate(norm.features)}
    quantile_starts = [0]
    for q in norm.quantiles:
        quantile_starts.append(quantile_starts[-1] + len(q))
    layer_in = [w.shape[0] for w in policy.weights[::2]]
    layer_out = [w.shape[1] for w in policy.weights[::2]]
    weights = [float(x).hex() + "f" for w in policy.weights for x in w.reshape(-1)]
    out = f"// The policy's constants, written by mlgo; problem {policy.problem.name}.\n"
    out += '#include <cmath>\n#include "policy_constants.h"\n'
    out += f"const int kFeatures = {len(norm.features)};\n"
    out += f"const int kDerived = {len(norm.derived)};\n"
    out += f"const int kLayers = {len(layer_in)};\n"
    out += f"const int kMaxWidth = {max([norm.width, *layer_out])};\n"
    columns = [column_of(f) for f in norm.features]
    out += _array("char* const", "kFeatureNames", [c_string(t) for t, _ in columns])
    out += _array("int", "kFeatureElement", [str(i or 0) for _, i in columns])
    embeddings = any(i is not None for _, i in columns)  # IR2Vec's vectors, by element
    out += f"const bool kReadsEmbeddings = {str(embeddings).lower()};\n"
    for name, computed in PROFILE_INPUTS.items():
        out += f"const char *const {computed.symbol} = {c_string(name)};\n"
    out += _array("int", "kDerivedLeft", [str(index[d.left]) for d in norm.derived])
    out += _array("int", "kDerivedRight", [str(index[d.right]) for d in norm.derived])
    out += _array("char", "kDerivedOp", [f"'{d.op}'" for d in norm.derived])
    out += _array("int", "kQuantileStart", [str(s) for s in quantile_starts])
    out += _array("double", "kQuantiles", [float(x).hex() for q in norm.quantiles for x in q])
    out += _array("int", "kLayerIn", [str(n) for n in layer_in])
    out += _array("int", "kLayerOut", [str(n) for n in layer_out])
    out += _array("float", "kWeights", weights)
    gated = policy.departure_threshold is not None
    margin = float(policy.departure_margin) if gated else 0.0
    margin_literal = "HUGE_VALF" if margin == np.inf else margin.hex() + "f"
    out += f"const bool kGated = {str(gated).lower()};\n"
    out += f"const float kDepartureMargin = {margin_literal};\n"
    out += f"const char *const kDeparturesEnv = {c_string(DEPARTURES_ENV)};\n"
    out += f"const char *const kDeparturesPrefix = {c_string(DEPARTURES_PREFIX)};\n"
    out += f"const char kDeparted = '{DEPARTED}', kAdvised = '{ADVISED}';\n"
    recorder = {
        "kDecisionsOutEnv": replay.DECISIONS_OUT_ENV,
        "kDecisionsAdvisorEnv": replay.DECISIONS_ADVISOR_ENV,
        "kClangAdvisor": replay.CLANG_ADVISOR,
        "kReplayAdvisorPrefix": replay.REPLAY_ADVISOR_PREFIX,
        "kAnswersAdvisorPrefix": replay.ANSWERS_ADVISOR_PREFIX,
        "kDecisionsLinePrefix": replay.LINE_PREFIX,
        "kInlinedInto": replay.INLINED_INTO,
        "kNotInlinedInto": replay.NOT_INLINED_INTO,
        "kAtCallsite": replay.AT_CALLSITE,
        "kNotViable": replay.NOT_VIABLE,
        "kTrajectoryEnv": replay.TRAJECTORY_ENV,
        "kTrajectoryLog": replay.TRAJECTORY_LOG,
        "kTrajectoryAnswers": replay.TRAJECTORY_ANSWERS,
    }
    for name, value in recorder.items():
        out += f"const char *const {name} = {c_string(value)};\n"
    return out


def _llvm_config(tc: Toolchain) -> tuple[list[str], str, str]:
    """(cxxflags, libdir, version) of the LLVM that clang comes from, or a clear error."""
    try:
        config = tc.tool("llvm-config")
        cxxflags, libdir, version = (
            subprocess.run(
                [config, flag], capture_output=True, text=True, check=True
            ).stdout.strip()
            for flag in ("--cxxflags", "--libdir", "--version")
        )
    except (ToolchainError, subprocess.CalledProcessError) as e:
        raise AotError(f"the inlining plugin needs llvm-config for clang {tc.major}: {e}") from e
    include = Path(libdir).parent / "include" / "llvm" / "Analysis" / "MLInlineAdvisor.h"
    if not include.is_file():
        raise AotError(
            f"the inlining plugin needs LLVM {tc.major}'s headers (llvm-{tc.major}-dev); "
            "run tools/setup.sh, or serve with --backend native"
        )
    return cxxflags.split(), libdir, version


def _advisor_object(cxxflags: list[str], llvm_version: str) -> Path:
    """inline_plugin.cc compiled against LLVM's headers: the part of every plugin that
    does not depend on the policy, built once per LLVM and plugin source."""

    def build(staging: Path) -> None:
        cmd = ["g++", *COMPILE, *cxxflags, "-c", str(PLUGIN_SOURCE)]
        run_step([*cmd, "-o", str(staging / "advisor.o")], "compiling the inlining plugin")

    key = f"{llvm_version}\0{' '.join(cxxflags)}\0".encode()
    key += PLUGIN_SOURCE.read_bytes() + CONSTANTS_HEADER.read_bytes()
    return cached_build("plugin-advisor", key, "advisor.o", build)


def inliner_plugin(policy: MLPPolicy, tc: Toolchain) -> Path:
    """clang's `-fpass-plugin` for POLICY, built on first use and cached."""
    if not policy.problem.plugin:
        raise AotError(f"a {policy.problem.name} policy cannot be a clang plugin")
    if policy.weights[-1].shape != (2,):  # argmax over (no, yes) is LLVM's 0/1 advice
        raise AotError("an inlining plugin's network must end in 2 outputs (no, yes)")
    cxxflags, libdir, llvm_version = _llvm_config(tc)
    advisor = _advisor_object(cxxflags, llvm_version)
    constants = policy_constants(policy)

    def build(staging: Path) -> None:
        (staging / "policy_constants.cc").write_text(constants)
        run_step(
            ["g++", *COMPILE, "-shared", "-Wl,--no-undefined", str(staging / "policy_constants.cc")]
            + [str(advisor), f"-L{libdir}", f"-lLLVM-{tc.major}"]
            + ["-o", str(staging / "libmlgo_inliner.so")],
            "building the inlining plugin",
        )

    key = f"{llvm_version}\0{constants}\0{advisor.parent.name}".encode()  # its inputs' hash
    plugin = cached_build("plugin", key, "libmlgo_inliner.so", build)
    check_loads(plugin, tc, policy.problem.advisor_flags)
    return plugin


def check_loads(plugin: Path, tc: Toolchain, flags: Sequence[str] = ()) -> None:
    """Compiles a two-function file with PLUGIN in clang: a plugin that does not load (a
    truncated file, another LLVM) or crashes is refused before it is served, not found
    by every compile of a build."""
    with tempfile.TemporaryDirectory(prefix="mlgo-plugin-check-") as d:
        source = Path(d) / "check.c"
        source.write_text(
            "static int twice(int x) { return 2 * x; }\nint f(int x) { return twice(x); }\n"
        )
        cmd = [tc.clang, "-Oz", f"-fpass-plugin={plugin}", *flags, "-c", str(source)]
        cmd += ["-o", f"{d}/check.o"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise AotError(
            f"clang cannot load the inlining plugin {plugin} (exit {proc.returncode}: "
            f"{error_line(proc.stderr)}); remove {plugin.parent} to rebuild it"
        )
