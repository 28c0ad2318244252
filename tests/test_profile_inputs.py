"""A profile's counts as a policy's inputs: given at zero weight they change no answer; the
clang plugin computes them at each call site from the profile (and nothing without one);
the channel, which carries none, reads them as a build without a profile has them; and
only the plugin serves a policy that reads them."""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from mlgo.errors import UsageError
from mlgo.llvm.log_format import Observation
from mlgo.llvm.toolchain import Toolchain
from mlgo.problems.policy import MLPPolicy
from mlgo.problems.policy_files import load_policy, save_policy
from mlgo.problems.profile_inputs import PROFILE_INPUTS, reads_profile
from mlgo.serve.service import Service
from tests.conftest import SHIPPED

# hot() runs 3,000,000 times, cold() 10 times: 2^21 and more against 2^3 and more
PROGRAM = """#include <stdio.h>
static unsigned hot(unsigned x) { return x * 2654435761u ^ (x >> 7); }
static unsigned cold(unsigned x) { return x * 40503u + (x >> 3); }
int main(int argc, char **argv) {
  unsigned s = (unsigned)argc;
  for (unsigned i = 0; i < 3000000; ++i) s += hot(s + i);
  for (unsigned i = 0; i < 10; ++i) s += cold(s + i);
  printf("%u\\n", s);
  return 0;
}
"""


def inlines_where_the_profile_counts_a_million() -> MLPPolicy:
    """The shipped policy with the profile's inputs, ungated, and a network that reads
    nothing but the call site's count: inline where it ran 2^20 times or more (its
    quantile on the log2 scale past one half)."""
    policy = replace(load_policy(SHIPPED), departure_threshold=None).with_profile_inputs()
    norm = policy.normalizer
    weights = [np.zeros_like(w) for w in policy.weights]
    weights[0][norm.features.index("callsite_count"), 0] = 1.0  # q of the count
    for layer in range(2, len(weights) - 2, 2):
        weights[layer][0, 0] = 1.0  # carried through the hidden layers
    weights[-2][0, 1] = 1.0  # the "inline" logit is q
    weights[-1][:] = [0.5, 0.0]  # "not" is one half
    return replace(policy, weights=weights)


def test_given_at_zero_weight_the_profiles_inputs_change_no_answer(recordings):
    _, _, _, rows = recordings("inlining-size")
    policy = load_policy(SHIPPED)
    wider = policy.with_profile_inputs()
    assert reads_profile(wider.normalizer.features)
    assert not reads_profile(policy.normalizer.features)
    assert wider.normalizer.features[-len(PROFILE_INPUTS) :] == tuple(PROFILE_INPUTS)
    hot = np.tile([2.0**30, 2.0**12, 2.0], (len(rows), 1))
    widened = np.concatenate([rows, hot], 1)
    np.testing.assert_array_equal(wider.predict(widened), policy.predict(rows))
    np.testing.assert_allclose(wider.logits(widened), policy.logits(rows), atol=1e-5)
    assert wider.with_profile_inputs() is wider
    deaf = wider.deaf_to(tuple(PROFILE_INPUTS))  # after a search, taken away again
    moved = replace(wider, weights=[w + 0.01 for w in wider.weights])
    assert not np.array_equal(moved.logits(widened), deaf.logits(widened))
    np.testing.assert_array_equal(
        moved.deaf_to(tuple(PROFILE_INPUTS)).logits(widened),
        moved.deaf_to(tuple(PROFILE_INPUTS)).logits(np.concatenate([rows, 0 * hot], 1)),
    )


def test_the_channel_sends_none_and_the_policy_reads_them_as_without_a_profile(recordings):
    problem, _, features, rows = recordings("inlining-size")
    policy = inlines_where_the_profile_counts_a_million()
    obs = Observation("main", 0, {name: values[:1] for name, values in features.items()})
    read = policy.raw_features(obs)
    assert list(read[-len(PROFILE_INPUTS) :]) == [p.unknown for p in PROFILE_INPUTS.values()]
    assert policy.decision_rows({n: v[:3] for n, v in features.items()}, 3).shape == (
        3,
        len(policy.normalizer.features),
    )
    assert policy(obs) == 0  # no count, no inlining


def objects_functions(tc: Toolchain, obj: Path) -> set[str]:
    shown = subprocess.run([tc.tool("llvm-nm"), obj], capture_output=True, text=True, check=True)
    return {line.split()[-1] for line in shown.stdout.splitlines()}


def test_the_plugin_computes_them_from_the_profile_at_each_call_site(tc, tmp_path):
    from mlgo.ship.plugin import inliner_plugin

    source = tmp_path / "loop.c"
    source.write_text(PROGRAM)
    raw = tmp_path / "run.profraw"
    instrumented = [tc.clang, "-O2", "-fprofile-instr-generate", str(source), "-o"]
    subprocess.run([*instrumented, tmp_path / "loop"], check=True)
    env = {"LLVM_PROFILE_FILE": str(raw)}
    subprocess.run([tmp_path / "loop"], check=True, env=env, capture_output=True)
    profile = tmp_path / "run.profdata"
    subprocess.run([tc.tool("llvm-profdata"), "merge", "-o", profile, raw], check=True)

    plugin = inliner_plugin(inlines_where_the_profile_counts_a_million(), tc)
    compile_ = [tc.clang, "-O2", f"-fpass-plugin={plugin}", "-c", str(source)]
    with_profile, without = tmp_path / "with.o", tmp_path / "without.o"
    subprocess.run([*compile_, f"-fprofile-instr-use={profile}", "-o", with_profile], check=True)
    subprocess.run([*compile_, "-o", without], check=True)
    # a static function left is one not inlined at its only call
    assert {"hot", "cold"} & objects_functions(tc, with_profile) == {"cold"}
    assert {"hot", "cold"} <= objects_functions(tc, without)


def test_only_the_plugin_serves_a_policy_that_reads_them(tmp_path):
    saved = tmp_path / "policy"
    save_policy(load_policy(SHIPPED).with_profile_inputs(), saved)
    for backend in ("python", "native"):
        runtime = tmp_path / f"run-{backend}"
        runtime.mkdir(mode=0o700)
        with pytest.raises(UsageError, match="only the clang plugin computes"):
            Service([saved], backend, runtime)
