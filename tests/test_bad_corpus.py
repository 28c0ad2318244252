"""A corpus is input, never output: its stats cache lives in the user's cache, keyed by
content; read-only corpora work; module names cannot escape (issue 19, items 11, 12, 14)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from mlgo.corpus.format import CorpusError, load_corpus
from mlgo.problems.policy_files import load_policy
from tests.cli_helpers import POLICIES, mlgo, one_line_error, user_cache
from tests.conftest import copy_corpus


# -- item 11, 12: the stats cache is keyed by content and lives in the user's cache ---
def _stats(corpus: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return mlgo("corpus", "stats", str(corpus), env=env)


def test_stats_cache_sees_a_same_size_corruption_and_a_truncation(mini_corpus, tmp_path):
    cache_env = user_cache(tmp_path)
    corpus = copy_corpus(mini_corpus, tmp_path / "c")
    r = _stats(corpus, cache_env)
    assert r.returncode == 0 and "│ 3 " in r.stdout.replace("┃", "│"), r.stdout + r.stderr
    first, second = (m.bitcode for m in load_corpus(corpus).modules[:2])
    data = first.read_bytes()
    first.write_bytes(data[:100] + bytes(len(data) - 100))  # same size, zeroed past 100
    second.write_bytes(second.read_bytes()[:200])  # truncated
    r = _stats(corpus, cache_env)
    assert r.returncode == 0, r.stderr
    assert f"failed {first.relative_to(corpus).with_suffix('')}" in r.stderr
    assert f"failed {second.relative_to(corpus).with_suffix('')}" in r.stderr
    total = next(ln for ln in r.stdout.splitlines() if "total" in ln)
    assert total.split("│")[2].strip() == "1"


def test_stats_are_cached_outside_the_corpus(mini_corpus, tmp_path):
    cache_env = user_cache(tmp_path)
    corpus = copy_corpus(mini_corpus, tmp_path / "c")
    before = sorted(p.relative_to(corpus) for p in corpus.rglob("*"))
    assert _stats(corpus, cache_env).returncode == 0
    assert sorted(p.relative_to(corpus) for p in corpus.rglob("*")) == before
    assert len(list((tmp_path / "cache" / "mlgo" / "stats").glob("*.json"))) == 1


@pytest.fixture
def read_only_corpus(mini_corpus, tmp_path):
    """The mini corpus behind a read-only bind mount: even root cannot write into it."""
    src = copy_corpus(mini_corpus, tmp_path / "src")
    ro = tmp_path / "ro"
    ro.mkdir()
    if subprocess.run(["mount", "--bind", str(src), str(ro)], capture_output=True).returncode:
        pytest.skip("cannot bind-mount here (needs root with CAP_SYS_ADMIN)")
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(ro)], check=True)
        assert subprocess.run(["touch", str(ro / "x")], capture_output=True).returncode
        yield ro
    finally:
        subprocess.run(["umount", str(ro)], check=True)


@pytest.mark.slow
def test_a_read_only_corpus_can_be_evaluated_and_trained_on(read_only_corpus, tmp_path):
    cache_env = user_cache(tmp_path)
    ro = str(read_only_corpus)
    r = mlgo("eval", "--policy", str(POLICIES / "inlining-size"), "--corpus", ro, "--out",
             str(tmp_path / "ev"), env=cache_env)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "ev" / "eval.json").read_text())["totals"]["modules"] == 3
    r = mlgo("train", "--corpus", ro, "--out", str(tmp_path / "run"), "--steps", "2",
             "--workers", "2", env=cache_env, timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert load_policy(tmp_path / "run" / "policy").problem.name == "inlining-size"


# -- item 14: module names stay inside the corpus and the outputs ---------------------
def _describe(corpus: Path, names: list[str]) -> None:
    (corpus / "corpus_description.json").write_text(json.dumps({"modules": names}))


@pytest.mark.parametrize("bad", ["../evil", "/tmp/evil", "pkg/../../evil", "pkg/./m", "pkg//m"])
def test_a_module_name_that_escapes_is_refused(mini_corpus, tmp_path, bad):
    corpus = copy_corpus(mini_corpus, tmp_path / "c")
    names = [m.name for m in mini_corpus.modules]
    _describe(corpus, [*names, bad])
    with pytest.raises(CorpusError, match="not a plain relative path"):
        load_corpus(corpus)
    r = mlgo("collect", "--problem", "inlining-size", "--corpus", str(corpus), "--out",
             str(tmp_path / "out" / "t"))  # fmt: skip
    one_line_error(r, "corpus_description.json", repr(bad))
    assert not (tmp_path / "out").exists()


def test_a_module_listed_twice_is_refused(mini_corpus, tmp_path):
    corpus = copy_corpus(mini_corpus, tmp_path / "c")
    names = [m.name for m in mini_corpus.modules]
    _describe(corpus, [*names, names[1]])
    r = mlgo("corpus", "stats", str(corpus))
    one_line_error(r, "corpus_description.json", f"{names[1]!r} is listed twice")
