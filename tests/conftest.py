"""Shared fixtures: the real toolchain and a small real corpus built from tests/data."""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import replace
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from mlgo.corpus.compile import compile_module
from mlgo.corpus.extract import combine
from mlgo.corpus.format import Corpus, load_corpus
from mlgo.llvm.log_format import TensorSpec, element_column
from mlgo.llvm.toolchain import Toolchain, find_toolchain
from mlgo.packages.build import build_corpus
from mlgo.problems import Problem, get_problem
from mlgo.problems.normalizer import Normalizer
from mlgo.problems.policy import MLPPolicy
from mlgo.problems.policy_files import load_policy, save_policy
from mlgo.train import RunDir

DATA = Path(__file__).parent / "data"
MLGO = [sys.executable, "-m", "mlgo.cli"]
SHIPPED = Path(__file__).parent.parent / "policies" / "inlining-size"
# The two mlgo-cc kinds a wrapper test runs with: the Python reference in the long tier,
# the native one, which a user's build runs, in both (tests/test_driver.py holds the two
# to one reading of a command line).
WRAPPER_KINDS = [pytest.param("python", marks=pytest.mark.slow), "native"]

# Fixtures that run the real toolchain: a test using any of them (directly or through
# another fixture) is marked `toolchain`, so new tests get the mark without asking.
TOOLCHAIN_FIXTURES = {"tc", "mini_corpus", "mini_corpus_o2"}
# Whole files that belong to a tier: a Ray cluster, trust and bad input (what another user
# could plant, what a user could get wrong), the policy service and its AOT server, Debian
# sources fetched and built. The long tier (`slow`) is marked test by test.
FILE_MARKS = {
    "test_ray.py": ("ray",),
    "test_security.py": ("security",),
    "test_trust.py": ("security",),
    "test_trusted_paths.py": ("security",),
    "test_bad_input.py": ("security",),
    "test_decisions_trust.py": ("security",),
    "test_bad_policy.py": ("security",),
    "test_bad_corpus.py": ("security",),
    "test_killed_runs.py": ("security",),
    "test_bounded_waits.py": ("security",),
    "test_run_trust.py": ("security",),
    "test_service.py": ("toolchain",),
    "test_guard.py": ("toolchain",),
    "test_aot.py": ("toolchain",),
    "test_debian_package.py": ("toolchain",),
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks tests by what they use; a `unit` test that reaches for the toolchain is an
    error at collection, so the fast tier stays free of clang."""
    for item in items:
        needs_toolchain = TOOLCHAIN_FIXTURES & set(getattr(item, "fixturenames", ()))
        if needs_toolchain:
            if item.get_closest_marker("unit"):
                raise pytest.UsageError(
                    f"{item.nodeid}: marked unit but uses {', '.join(sorted(needs_toolchain))}"
                )
            item.add_marker(pytest.mark.toolchain)
        for mark in FILE_MARKS.get(item.path.name, ()):
            item.add_marker(getattr(pytest.mark, mark))


def run_mlgo(*args: str, timeout: float) -> subprocess.CompletedProcess:
    """The `mlgo` command as a user runs it, with its output captured."""
    return subprocess.run([*MLGO, *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def tc() -> Toolchain:
    return find_toolchain()


def _build_minipkg(tc: Toolchain, root: Path, opt_level: str) -> Corpus:
    """tests/data/minipkg built through the recording wrapper, bear and LLVM's extract_ir."""
    src = root / "src"
    shutil.copytree(DATA / "minipkg", src)
    build = tuple(f'"$CC" -O2 -c {c.name} -o {c.stem}.o' for c in sorted(src.glob("*.c")))
    # Like real builds: the same file compiled twice the same way (kept once), and a
    # compile-and-link step whose per-file objects are temporaries (skipped).
    build += (
        'mkdir -p again && "$CC" -O2 -c strbuf.c -o again/strbuf.o',
        '"$CC" -O2 main.c strbuf.c hash.c -o wordcount',
    )
    out = root / "corpus"
    assert build_corpus("minipkg", src, (), build, tc, out, root / "work", opt_level=opt_level) == 3
    combine(out)
    return load_corpus(out)


@pytest.fixture(scope="session")
def mini_corpus(tc: Toolchain, tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    """The small real corpus at -Oz, the inliner's level."""
    return _build_minipkg(tc, tmp_path_factory.mktemp("mini"), "-Oz")


@pytest.fixture(scope="session")
def mini_corpus_o2(tc: Toolchain, tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    """The same package recorded at -O2, the register allocator's level."""
    return _build_minipkg(tc, tmp_path_factory.mktemp("mini-o2"), "-O2")


def save_inline_all(out: Path, **changes: object) -> Path:
    """The shipped policy, ungated, made to always say "inline" (its objects differ visibly
    from clang's), with CHANGES, saved to OUT."""
    policy = replace(load_policy(SHIPPED), departure_threshold=None, **changes)
    policy.weights[-1] = np.array([0.0, 1e30], np.float32)
    save_policy(policy, out)
    return out


Recording = tuple[Problem, tuple[TensorSpec, ...], dict[str, np.ndarray], np.ndarray]


@pytest.fixture(scope="session")
def recordings(mini_corpus: Corpus, tc: Toolchain):
    """Real feature rows from real compilations of the small corpus, per problem name: the
    problem, LLVM's tensor specs, its tensors by name [decisions, ...], and the policy's raw
    feature rows [decisions, features]."""

    @cache
    def record(name: str) -> Recording:
        problem = get_problem(name)
        runs = [compile_module(problem, m, tc.clang) for m in mini_corpus.modules]
        runs = [r for r in runs if r.num_decisions]
        specs = runs[0].specs
        features = {s.name: np.concatenate([r.features[s.name] for r in runs]) for s in specs}
        n = len(features[problem.default_feature])
        x = np.stack([element_column(features, f, n) for f in problem.feature_names], 1)
        return problem, specs, features, x.astype(np.float64)

    return record


def random_policy(problem: Problem, x: np.ndarray, default: np.ndarray | None) -> MLPPolicy:
    """A randomly initialised policy on the raw feature rows X, centred so that its answers
    are mixed (a trained one's mostly are not); given clang's DEFAULT decisions, gated to
    keep about half of its departures, those with the larger margin. The same rows give the
    same policy, so every test that serves it natively shares one cached policy server."""
    x = x.astype(np.float64)
    policy = MLPPolicy.init(problem, Normalizer.fit(problem.feature_names, x), hidden=(16,), seed=3)
    margin = np.diff(policy.logits(x), axis=1)[:, 0]
    policy.weights[-1][1] -= np.median(margin) + 1e-3  # centred: about half inline
    if default is not None:
        logits = policy.logits(x)
        departs = np.abs(np.diff(logits, axis=1)[:, 0])[np.argmax(logits, 1) != default]
        policy.departure_threshold = float(1 / (1 + np.exp(-np.median(departs))))
    return policy


def copy_corpus(corpus: Corpus, dest: Path) -> Path:
    shutil.copytree(corpus.root, dest)
    return dest


def assert_saved_best_is_best_evaluated(run: RunDir, init: MLPPolicy) -> dict[str, np.ndarray]:
    """An ES or PPO run's saved policy is the best it evaluated on the pool (its start and
    every logged pool evaluation), and is the start itself only if nothing beat it.
    Returns the run's checkpoint arrays."""
    state, arrays = run.load_state()
    key = f"{state.algo}/pool_reward"
    evaluated = [h[key] for h in state.history if key in h]
    assert evaluated, f"the run logged no {key}"
    assert state.extra["best_reward"] == max([state.extra["init_reward"], *evaluated])
    saved = load_policy(run.policy_dir).flat()
    assert np.array_equal(saved, arrays["best"].astype(saved.dtype))
    kept_start = state.extra["best_reward"] == state.extra["init_reward"]
    assert np.array_equal(saved, init.flat()) == kept_start
    return arrays
