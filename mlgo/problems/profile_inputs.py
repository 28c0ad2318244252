"""A profile's counts as an inlining policy's own inputs (`mlgo tune --pgo --profile-inputs`):
how often a call site ran, how often its callee was entered, and whether the profile
summary calls the site hot or cold.

LLVM's inliner features carry no profile, and its channel sends none of these: the clang
plugin computes them at each call site (mlgo/ship/native/inline_plugin.cc, from the caller's
block frequencies and the profile summary), so a policy that reads them is served by the
plugin. Where nothing says (the channel, a build with no profile), a count is 0 and the site
is neither hot nor cold, which is what the plugin computes in a build without a profile.

No trace carries them, so their normalization is fixed, not learned from traces: counts on
a log2 scale, hotness as three steps. A policy is given them with zero weight
(`MLPPolicy.with_profile_inputs`), so it decides as before until a search moves those weights.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from mlgo.llvm.log_format import element_column


@dataclass(frozen=True)
class ProfileInput:
    symbol: str  # the C++ constant that gives the plugin this name
    unknown: float  # its value where nothing says
    boundaries: tuple[float, ...]  # its fixed quantile boundaries


# 1, 2, 4, ... 2^40: a count's quantile is about its log2 over 41
COUNT_SCALE = tuple(float(2**k) for k in range(41))
PROFILE_INPUTS = {
    "callsite_count": ProfileInput("kCallSiteCountName", 0.0, COUNT_SCALE),
    "callee_entry_count": ProfileInput("kCalleeEntryCountName", 0.0, COUNT_SCALE),
    # 0 cold, 1 neither, 2 hot
    "callsite_hotness": ProfileInput("kCallSiteHotnessName", 1.0, (1.0, 2.0)),
}


ONLY_THE_PLUGIN = "the policy reads the profile's inputs, which only the clang plugin computes"


def feature_column(features: Mapping[str, np.ndarray], name: str, n: int) -> np.ndarray:
    """`element_column`, or where the compiler sent none of a profile's input, its value
    where nothing says."""
    if name in PROFILE_INPUTS and name not in features:
        return np.full(n, PROFILE_INPUTS[name].unknown)
    return element_column(features, name, n)


def reads_profile(features: Sequence[str]) -> bool:
    """Whether a policy of these input FEATURES reads any of the profile's inputs."""
    return any(f in PROFILE_INPUTS for f in features)
