"""A real Debian source package end to end: apt-get source, build, extract, replay."""

import pytest

from mlgo.corpus.compile import replay_matches_default
from mlgo.corpus.format import load_corpus
from mlgo.problems import get_problem
from tests.conftest import run_mlgo


@pytest.fixture(scope="module")
def zlib_demo(tmp_path_factory):
    """README's main job, `mlgo demo`: zlib's corpus, its inlining traces, its statistics."""
    root = tmp_path_factory.mktemp("zlib")
    r = run_mlgo("demo", "--out", str(root), timeout=900)
    assert r.returncode == 0, r.stderr + r.stdout
    return root, r.stdout


@pytest.fixture(scope="module")
def zlib_corpus(zlib_demo):
    root, _ = zlib_demo
    return load_corpus(root / "corpus")


def test_the_demo_collects_and_reports_the_package(zlib_demo):
    root, out = zlib_demo
    traces = list((root / "traces" / "modules" / "zlib").glob("*.tfrecord"))
    assert len(traces) >= 15 and (root / "traces" / "manifest.json").is_file()
    assert "zlib" in out and "total" in out and "call sites" in out


def test_zlib_builds_and_extracts(zlib_corpus):
    names = {m.name for m in zlib_corpus.modules}
    assert {"zlib/deflate.o", "zlib/inflate.o", "zlib/trees.o"} <= names
    assert len(names) >= 15


def test_default_replay_reproduces_plain_oz_byte_for_byte(zlib_corpus, tc):
    problem = get_problem("inlining-size")
    mismatched = [
        m.name for m in zlib_corpus.modules if not replay_matches_default(problem, m, tc.clang)
    ]
    assert mismatched == []


def test_unknown_recipe_fails_alone(tmp_path):
    r = run_mlgo(
        "corpus",
        "build",
        "no-such-pkg",
        "--out",
        str(tmp_path / "c"),
        "--work",
        str(tmp_path / "b"),
        timeout=300,
    )
    assert r.returncode == 1
    assert "failed no-such-pkg: no recipe no-such-pkg.toml" in " ".join(r.stderr.split())
