"""A chain's candidates and its keep rule: the gates, the cheapest distinct, the surely
faster, none larger."""

import json
import math

import pytest

from mlgo.corpus.format import Corpus
from mlgo.problems.policy_files import load_policy
from mlgo.programs.chain import linked_choice
from mlgo.train.candidates import (
    cheapest,
    cheapest_distinct,
    gated,
    gated_candidates,
    none_larger,
    smaller,
    surely_faster,
)
from tests.cli_helpers import POLICIES
from tools.lab.reproduce import choice_table, outcome_line


@pytest.mark.unit
def test_tune_weighs_each_threshold_for_every_language_and_each_alone():
    """`mlgo tune`'s candidates: a failed threshold is none; C alone is a policy for C."""
    policy = load_policy(POLICIES / "inlining-size")
    alone = {"c": {"change": -0.02}, "c++": {"change": 0.01}}
    sweep = [
        {"threshold": 0.6, "change": -0.01, "failed": [], "by_language": alone},
        {"threshold": 0.8, "change": -0.03, "failed": ["p/m.c"]},
    ]
    candidates = gated_candidates(policy, sweep)
    assert {k: c for k, (_, c) in candidates.items()} == {
        "trained, gated at 0.6": -0.01,
        "trained, gated at 0.6, C only": -0.02,
        "trained, gated at 0.6, C++ only": 0.01,
    }
    gates = {(p.departure_threshold, p.languages) for p, _ in candidates.values()}
    assert gates == {(0.6, None), (0.6, ("c",)), (0.6, ("c++",))}


@pytest.mark.unit
def test_a_speed_tune_times_the_cheapest_few_and_keeps_only_what_is_surely_faster():
    """The clock's finalists: cheaper than the default by the judge, cheapest first, one of
    equal costs (the same build); of them, the lowest median whose IQR is below zero."""
    judged = {"default": 0.0, "a": -0.02, "a, C only": -0.02, "b": -0.01, "c": 0.01, "d": -0.03}
    assert cheapest_distinct(judged, 3) == ["d", "a", "b"]
    assert cheapest_distinct(judged, 1) == ["d"]
    assert cheapest_distinct({"default": 0.0, "c": 0.01}, 3) == []

    def timed(median: float, q3: float) -> dict:
        return {"change_pct": median, "iqr_pct": [median - 1, q3]}

    # the lowest median loses where its IQR reaches zero
    clock = {"d": timed(-3.0, 0.5), "a": timed(-1.0, -0.2), "b": timed(-1.5, -0.1)}
    assert surely_faster(clock) == "b"
    assert surely_faster({"d": timed(-3.0, 0.0), "a": timed(1.0, 2.0)}) is None


@pytest.mark.unit
def test_a_candidate_that_makes_anything_larger_is_never_kept_and_the_earliest_of_equals_is():
    """The link recipe's rule: the smallest with nothing larger, only if below clang's own."""
    judged = {
        "shipped": none_larger(-0.01, []),
        "trained": none_larger(-0.03, ["zlib"]),
        "trained, gated at 0.9": none_larger(-0.01, []),
    }
    assert judged["trained"] == math.inf
    assert cheapest(judged) == smaller(judged) == "shipped"
    assert smaller({"shipped": 0.0, "trained": none_larger(-0.1, ["a"])}) is None
    assert smaller({}) is None
    policy = load_policy(POLICIES / "inlining-size")
    gates = gated(policy, (0.6, 0.99))
    assert list(gates) == ["trained, gated at 0.6", "trained, gated at 0.99"]
    assert [p.departure_threshold for p in gates.values()] == [0.6, 0.99]


def judgement(change: float, larger: tuple[str, ...] = ()) -> dict:
    return {
        "change_pct": change,
        "packages_larger": list(larger),
        "packages_over_0.1pct": list(larger),
        "packages": {"zlib": change},
        "by_language_pct": {"C": change},
    }


@pytest.mark.unit
def test_a_link_recipe_rerun_keeps_its_judgements_and_its_one_test(tmp_path):
    """`linked_choice` on a record that judged the same candidates: nothing is linked
    again (the corpora are never read), the smallest with no package larger is kept, and
    its test is the one recorded; a candidate that made a package larger is never kept."""
    policy = load_policy(POLICIES / "inlining-size")
    candidates = {"shipped": policy, **gated(policy, (0.6,))}
    record = tmp_path / "ship.json"
    validation = {"shipped": judgement(-0.5), "trained, gated at 0.6": judgement(-0.9, ["a"])}
    test = judgement(-0.3)
    record.write_text(json.dumps({"validation": validation, "chosen": "shipped", "test": test}))

    def unread() -> Corpus:
        raise AssertionError("a corpus was read")

    choice = linked_choice(candidates, unread, unread, None, record)
    assert choice == {"validation": validation, "chosen": "shipped", "test": test}
    assert "shipped (kept)" in "".join(
        str(cell) for column in choice_table(choice, "t").columns for cell in column.cells
    )
    assert outcome_line(choice) == "test: -0.300% (C -0.300%); larger: none; >0.1%: none"
    grown = {n: judgement(0.1, ["a"]) for n in validation}
    record.write_text(json.dumps({"validation": grown}))
    assert linked_choice(candidates, unread, unread, None, record) == {
        "validation": grown,
        "chosen": None,
    }
