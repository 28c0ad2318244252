"""A search's compile answered inside clang by the plugin is the channel's compile of the
same trajectory: the same questions, answers, features and object, at less cost."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from mlgo.corpus.compile import CompileError, compile_module
from mlgo.data import shipped_policy
from mlgo.problems import get_problem
from mlgo.problems.policy_files import load_policy
from mlgo.records import ModuleRun
from mlgo.train.bcmax import Answerer, SearchConfig, SearchTask, search_module
from mlgo.train.plugin_compile import answers_in_plugin, compile_in_plugin, search_plugin

PROBLEM = get_problem("inlining-size")


@pytest.fixture(scope="module")
def greedy():
    return replace(load_policy(shipped_policy("inlining-size")), temperature=0.0)


def same_runs(a: ModuleRun, b: ModuleRun) -> None:
    assert a.metrics == b.metrics
    assert a.specs == b.specs and a.contexts == b.contexts
    assert np.array_equal(a.advice, b.advice) and np.array_equal(a.default, b.default)
    assert a.features.keys() == b.features.keys()
    assert all(np.array_equal(a.features[k], b.features[k]) for k in a.features)


def moves_of(run: ModuleRun) -> list:
    """Two flips and one group move (the group of the first decision, to the other
    answer) of the trajectory RUN measured."""
    group = tuple(int(run.features[f][0].reshape(-1)[0]) for f in PROBLEM.group_features)
    return [1, run.num_decisions - 1, (group, 1 - int(run.advice[0]))]


def test_the_plugin_answers_a_trajectory_as_the_channel_does(mini_corpus, tc, greedy):
    """The default's and the policy's trajectories, and each moved by flips and a group
    move: every decision's features, answer and clang's own, and the object's size, alike."""
    compared = 0
    for m in mini_corpus.modules:
        for policy in (None, greedy):
            plugin = search_plugin(PROBLEM, policy, tc.clang)
            assert plugin is not None
            start = Answerer(PROBLEM, policy)
            first = compile_module(PROBLEM, m, tc.clang, start)
            if first.num_decisions < 2:
                continue
            moved = start.moved(moves_of(first))
            same_runs(first, compile_in_plugin(m, tc.clang, start, plugin))
            through_channel = compile_module(PROBLEM, m, tc.clang, moved)
            assert not np.array_equal(through_channel.advice[: first.num_decisions], first.advice)
            same_runs(through_channel, compile_in_plugin(m, tc.clang, moved, plugin))
            compared += 1
    assert compared >= 4


def test_a_search_finds_the_same_through_the_plugin_as_through_the_channel(mini_corpus, tc, greedy):
    for m in mini_corpus.modules:
        found = []
        for in_plugin in (True, False):
            cfg = SearchConfig(budget=8, samples=0, in_plugin=in_plugin)
            r = search_module(SearchTask(PROBLEM, m, tc.clang, greedy, cfg, seed=3))
            found.append((r.best.cost, r.best.actions.tolist(), r.curve, r.starts))
        assert found[0] == found[1]


@pytest.mark.unit
def test_what_the_plugin_cannot_answer_goes_through_the_channel(greedy):
    """A sampled policy (numpy's draws) and one that reads the profile's inputs (which
    only the plugin computes) are answered through the channel."""
    assert answers_in_plugin(PROBLEM, None) and answers_in_plugin(PROBLEM, greedy)
    assert not answers_in_plugin(PROBLEM, replace(greedy, temperature=1.0))
    assert not answers_in_plugin(PROBLEM, greedy.with_profile_inputs())
    assert not answers_in_plugin(get_problem("regalloc-eviction"), None)


def test_a_trajectory_the_plugin_refuses_is_a_failed_compile_naming_the_module(
    mini_corpus, tc, greedy, monkeypatch
):
    """A spec the plugin cannot read (here, a line it does not know) fails that compile in
    one line, not with the compiler's own answers passed off as the trajectory's."""
    import mlgo.train.plugin_compile as plugin_compile

    monkeypatch.setattr(plugin_compile, "spec_text", lambda _a: "base sideways\n")
    m = mini_corpus.modules[0]
    plugin = search_plugin(PROBLEM, greedy, tc.clang)
    assert plugin is not None
    with pytest.raises(CompileError, match=rf"^{m.name}: the plugin did not answer"):
        compile_in_plugin(m, tc.clang, Answerer(PROBLEM, greedy), plugin)
