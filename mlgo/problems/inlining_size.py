"""Inlining for size: at each call site, inline (1) or not (0), to minimise .text bytes."""

from __future__ import annotations

import numpy as np

from mlgo.llvm.log_format import Observation
from mlgo.llvm.sizes import text_metrics
from mlgo.problems import Derived, Problem

# The features clang-22's MLInlineAdvisor sends (InlineModelFeatureMaps.h), less the
# `inlining_default` that -inliner-interactive-include-default adds.
FEATURES = (
    "sroa_savings",
    "sroa_losses",
    "load_elimination",
    "call_penalty",
    "call_argument_setup",
    "load_relative_intrinsic",
    "lowered_call_arg_setup",
    "indirect_call_penalty",
    "jump_table_penalty",
    "case_cluster_penalty",
    "switch_default_dest_penalty",
    "switch_penalty",
    "unsimplified_common_instructions",
    "num_loops",
    "dead_blocks",
    "simplified_instructions",
    "constant_args",
    "constant_offset_ptr_args",
    "callsite_cost",
    "cold_cc_penalty",
    "last_call_to_static_bonus",
    "is_multiple_blocks",
    "nested_inlines",
    "nested_inline_cost_estimate",
    "threshold",
    "callee_basic_block_count",
    "callsite_height",
    "node_count",
    "nr_ctant_params",
    "cost_estimate",
    "edge_count",
    "caller_users",
    "caller_conditionally_executed_blocks",
    "caller_basic_block_count",
    "callee_conditionally_executed_blocks",
    "callee_users",
    "is_callee_avail_external",
    "is_caller_avail_external",
)
DEFAULT_FEATURE = "inlining_default"


def serving_flags(base: str) -> list[str]:
    return [
        "-mllvm",
        "-enable-ml-inliner=release",
        "-mllvm",
        f"-inliner-interactive-channel-base={base}",
    ]


def channel_flags(base: str) -> list[str]:
    """Serving's flags plus the compiler's own decision, which training needs."""
    return serving_flags(base) + ["-mllvm", "-inliner-interactive-include-default"]


def default_advice(obs: Observation) -> int:
    return int(obs.features[DEFAULT_FEATURE].reshape(-1)[0])


def validate(obs: Observation, advice: np.ndarray) -> None:
    if int(advice[0]) not in (0, 1):
        raise ValueError(f"inlining_decision must be 0 or 1, got {int(advice[0])}")


PROBLEM = Problem(
    name="inlining-size",
    summary="inline or not at each call site, for the smallest .text (clang -Oz)",
    opt_level="-Oz",
    channel_flags=channel_flags,
    serving_flags=serving_flags,
    feature_names=FEATURES,
    advice_name="inlining_decision",
    default_advice=default_advice,
    default_feature=DEFAULT_FEATURE,
    validate=validate,
    measure_flags=lambda _workdir: [],
    measure=text_metrics,
    # .text with each inline function's copies shared out among the package's objects
    # (`sizes.text_once`): a package's sum counts the copy its link keeps, not one per
    # object, so a search is not paid for deleting one object's copy of a function the
    # others still define. C objects have no such copies: there it is .text itself.
    reward_metric="text_once",
    reward_in_stats=True,
    # One callee's call sites: inlining all of them can delete it, which no single flip
    # shows. The caller's inlining leaves these unchanged (the callee is done first).
    group_features=(
        "callee_basic_block_count",
        "callee_conditionally_executed_blocks",
        "is_callee_avail_external",
    ),
    plugin=True,
    # The default heuristic inlines when the cost is under the threshold; with this the
    # network starts from the default and learns where to depart from it.
    derived=(
        Derived("cost_margin", "threshold", "-", "cost_estimate"),
        Derived("default_rule", "cost_estimate", "<", "threshold"),
    ),
)
