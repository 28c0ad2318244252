"""A third problem, as a new one would be declared: one module, plus its line in
mlgo.problems.MODULES (tests/test_security.py adds that line for the test's lifetime). Its
channel flags are made up: only the lease checks see them, no compiler."""

from __future__ import annotations

from mlgo.problems import Problem


def channel_flags(base: str) -> list[str]:
    return ["-mllvm", "-fake-choice-advisor=release", "-mllvm", f"-fake-choice-channel-base={base}"]


PROBLEM = Problem(
    name="fake-choice",
    summary="a made-up decision point for the lease allow-list tests",
    opt_level="-O2",
    channel_flags=channel_flags,
    feature_names=("fake_feature",),
    advice_name="fake_advice",
    default_advice=lambda obs: 0,
    default_feature=None,
    validate=lambda obs, advice: None,
    measure_flags=lambda workdir: [],
    measure=lambda obj, workdir: {"fake_cost": 0.0},
    reward_metric="fake_cost",
)
