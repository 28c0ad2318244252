"""A policy is checked whole wherever it is loaded: a corrupt, truncated or diverged one is
one line naming its file, in eval, export and serve alike (issue 19, items 7 and 8)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from mlgo.problems.policy_files import load_policy, save_policy
from tests.cli_helpers import POLICIES, mlgo, one_line_error
from tests.conftest import MLGO
from tests.test_service import MLGO_CC, SOURCES, mlgo_cc


def _policy_copy(tmp_path: Path, name: str = "inlining-size") -> Path:
    dest = tmp_path / f"bad-{name}"
    shutil.copytree(POLICIES / name, dest, ignore=shutil.ignore_patterns("saved_model"))
    return dest


def _rewrite_weights(policy: Path, change) -> None:
    with np.load(policy / "policy.npz") as z:
        weights = [z[f"arr_{i}"] for i in range(len(z.files))]
    change(weights)
    with open(policy / "policy.npz", "wb") as f:
        np.savez(f, *weights)


def _nan_weight(w):
    w[0][3, 5] = np.nan


def _inf_bias(w):
    w[3][0] = np.inf


def _wrong_shape(w):
    w[2] = w[2][:-1]


def _rewrite_norm(policy: Path, change) -> None:
    d = json.loads((policy / "normalization.json").read_text())
    change(d)
    (policy / "normalization.json").write_text(json.dumps(d))


def _unsorted(d):
    d["quantiles"][2] = d["quantiles"][2][::-1]


def _nan_inside(d):
    d["quantiles"][2][1] = float("nan")


def _column_missing(d):
    d["quantiles"].pop()


def _nested(file: Path) -> None:
    """FILE nested 10,000 levels deep (20 KB, within the size a policy.json may have):
    Python's parser dies of it (RecursionError)."""
    file.write_text("[" * 10_000 + "]" * 10_000)


def _too_wide(w):
    """A first layer of 3,000 units: 342,000 weights, as no trained policy has."""
    w[0], w[1] = np.zeros((w[0].shape[0], 3000), np.float32), np.zeros(3000, np.float32)


NESTED_META = (
    "policy.json",
    "nested more than 64 levels deep",
    lambda p: _nested(p / "policy.json"),
)
NESTED_NORM = (
    "normalization.json",
    "nested more than 64 levels deep",
    lambda p: _nested(p / "normalization.json"),
)


BAD_POLICIES = [
    ("policy.npz", "NaN or infinite", lambda p: _rewrite_weights(p, _nan_weight)),
    ("policy.npz", "NaN or infinite", lambda p: _rewrite_weights(p, _inf_bias)),
    ("policy.npz", "layer 1 is", lambda p: _rewrite_weights(p, _wrong_shape)),
    ("normalization.json", "not sorted", lambda p: _rewrite_norm(p, _unsorted)),
    ("normalization.json", "column 2", lambda p: _rewrite_norm(p, _nan_inside)),
    ("normalization.json", "boundary lists", lambda p: _rewrite_norm(p, _column_missing)),
    (
        "policy.npz",
        "not an array archive",
        lambda p: (p / "policy.npz").write_bytes((p / "policy.npz").read_bytes()[:3000]),
    ),
    ("policy.json", "not valid JSON", lambda p: (p / "policy.json").write_text('{"problem": ')),
    ("policy.json", "not in \\[0.5, 1\\]", lambda p: _rewrite_meta(p, departure_threshold=0.3)),
    ("policy.json", "not in \\[0.5, 1\\]", lambda p: _rewrite_meta(p, departure_threshold="x")),
    ("policy.json", "are not some of", lambda p: _rewrite_meta(p, languages="c")),
    ("policy.json", "are not some of", lambda p: _rewrite_meta(p, languages=["c", ["c++"]])),
    ("policy.json", "languages is empty", lambda p: _rewrite_meta(p, languages=[])),
    ("policy.json", "guard 'speed' is not one of: size", lambda p: _rewrite_meta(p, guard="speed")),
    NESTED_META,
    NESTED_NORM,
    ("policy.json", "larger than 64 KiB", lambda p: _rewrite_meta(p, notes="x" * (64 << 10))),
    (
        "policy.npz",
        "342,000 numbers or more; at most 250,000",
        lambda p: _rewrite_weights(p, _too_wide),
    ),
]


def _rewrite_meta(policy: Path, **change) -> None:
    d = json.loads((policy / "policy.json").read_text())
    (policy / "policy.json").write_text(json.dumps({**d, **change}))


@pytest.mark.parametrize(("file", "why", "spoil"), BAD_POLICIES)
def test_a_spoilt_policy_is_refused_naming_its_file(tmp_path, file, why, spoil):
    policy = _policy_copy(tmp_path)
    spoil(policy)
    with pytest.raises(ValueError, match=why) as e:
        load_policy(policy)
    assert str(e.value).startswith(f"{policy / file}:") and "\n" not in str(e.value)


def test_the_languages_a_policy_answers_are_saved_with_it(tmp_path):
    policy = load_policy(POLICIES / "inlining-size")
    save_policy(replace(policy, languages=None), tmp_path / "all")
    assert load_policy(tmp_path / "all").languages is None  # none saved: every language
    save_policy(replace(policy, languages=("c",)), tmp_path / "c")
    loaded = load_policy(tmp_path / "c")
    assert loaded.languages == ("c",) and "answers C compiles only" in loaded.describe()


def test_a_departure_threshold_is_saved_with_the_policy_and_only_where_a_default_is(tmp_path):
    policy = load_policy(POLICIES / "inlining-size")
    policy.departure_threshold = 0.8
    save_policy(policy, tmp_path / "gated")
    assert load_policy(tmp_path / "gated").departure_threshold == 0.8
    regalloc = _policy_copy(tmp_path, "regalloc-eviction")
    _rewrite_meta(regalloc, departure_threshold=0.8)
    with pytest.raises(ValueError, match="no default to gate on") as e:
        load_policy(regalloc)
    assert str(e.value).startswith(f"{regalloc / 'policy.json'}:")


def test_a_policy_or_traces_made_with_another_vocabulary_are_refused_in_one_line(tmp_path):
    """An embeddings policy keeps the digest of the vocabulary its features were computed
    with; under another one its inputs would be other numbers under the same names."""
    from mlgo.problems import get_problem
    from mlgo.problems.normalizer import Normalizer
    from mlgo.problems.policy import MLPPolicy
    from mlgo.traces.format import Manifest, TraceError

    problem = get_problem("inlining-size-ir2vec")
    names = problem.feature_names
    x = np.random.default_rng(0).normal(size=(50, len(names)))
    save_policy(MLPPolicy.init(problem, Normalizer.fit(names, x)), tmp_path / "p")
    assert json.loads((tmp_path / "p" / "policy.json").read_text())["feature_digest"]
    load_policy(tmp_path / "p")
    _rewrite_meta(tmp_path / "p", feature_digest="0123456789abcdef")
    with pytest.raises(ValueError, match="made with other inlining-size-ir2vec features") as e:
        load_policy(tmp_path / "p")
    assert str(e.value).startswith(f"{tmp_path / 'p' / 'policy.json'}: ")
    assert "digest 0123456789abcdef" in str(e.value) and "\n" not in str(e.value)
    Manifest(problem, "clang", "corpus").save(tmp_path)
    Manifest.load(tmp_path)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    (tmp_path / "manifest.json").write_text(json.dumps({**manifest, "feature_digest": None}))
    with pytest.raises(TraceError, match=r"manifest.json: made with other .* \(digest none"):
        Manifest.load(tmp_path)


def test_the_shipped_policies_load_nan_boundaries_included():
    ra = load_policy(POLICIES / "regalloc-eviction")
    assert any(np.isnan(q).any() for q in ra.normalizer.quantiles)
    assert load_policy(POLICIES / "inlining-size").problem.name == "inlining-size"


@pytest.mark.parametrize(
    "spoil",
    [BAD_POLICIES[0], BAD_POLICIES[6], NESTED_META, NESTED_NORM],
    ids=["nan", "truncated", "nested-policy.json", "nested-normalization.json"],
)
def test_eval_export_and_serve_refuse_a_spoilt_policy_in_one_line(mini_corpus, tmp_path, spoil):
    file, why, change = spoil
    policy = _policy_copy(tmp_path)
    change(policy)
    named = str(policy / file)
    r = mlgo("eval", "--policy", str(policy), "--corpus", str(mini_corpus.root), "--out",
             str(tmp_path / "ev"))  # fmt: skip
    one_line_error(r, named, why)
    assert not (tmp_path / "ev").exists()
    r = mlgo("export", "--policy", str(policy), "--out", str(tmp_path / "exp"), "--no-aot")
    one_line_error(r, named, why)
    assert not (tmp_path / "exp").exists()
    for backend in ("python", "native"):
        sock = tmp_path / backend / "mlgo.sock"
        sock.parent.mkdir()
        r = mlgo("serve", "--policy", str(policy), "--backend", backend, "--socket", str(sock),
                 env={"MLGO_STRICT": "1"}, timeout=120)  # fmt: skip
        one_line_error(r, named, why)
        assert not sock.exists()


def test_a_base_is_saved_with_the_policy_and_only_where_its_problem_has_one(tmp_path):
    """inlining-speed's policy carries clang's inline threshold, which reaches every compile
    it serves; a base that is no small whole number, or on a problem without one, is one
    line naming policy.json."""
    from mlgo.problems import get_problem

    size = load_policy(POLICIES / "inlining-size")
    speed = replace(size, problem=get_problem("inlining-speed"), base=400)
    save_policy(speed, tmp_path / "speed")
    loaded = load_policy(tmp_path / "speed")
    assert loaded.base == 400 and loaded.base_flags == ["-mllvm", "-inline-threshold=400"]
    assert "-inline-threshold=400" in loaded.describe()
    assert replace(loaded, base=None).base_flags == []
    for bad, why in (("400", "is not an integer"), (-1, "is not an integer"),
                     (True, "is not an integer"), (10**9, "is not an integer")):  # fmt: skip
        _rewrite_meta(tmp_path / "speed", base=bad)
        with pytest.raises(ValueError, match=why) as e:
            load_policy(tmp_path / "speed")
        assert str(e.value).startswith(f"{tmp_path / 'speed' / 'policy.json'}:")
    sized = _policy_copy(tmp_path)
    _rewrite_meta(sized, base=400)
    with pytest.raises(ValueError, match="inlining-size has no base to set"):
        load_policy(sized)


def _declare_huge(npz: Path, count: int) -> None:
    """NPZ made an archive whose one array is COUNT float32 zeros, compressed: a small file
    that would take 4 x COUNT bytes of memory to read."""
    with (
        zipfile.ZipFile(npz, "w", zipfile.ZIP_DEFLATED) as z,
        z.open("arr_0.npy", "w", force_zip64=True) as member,
    ):
        header = {"descr": "<f4", "fortran_order": False, "shape": (count,)}
        np.lib.format.write_array_header_1_0(member, header)
        zeros = bytes(1 << 24)
        for _ in range(4 * count // len(zeros)):
            member.write(zeros)


PEAK = (
    "import resource, subprocess, sys\n"
    "code = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode\n"
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    "sys.exit(code)"
)


def test_an_archive_declaring_a_huge_array_is_refused_before_it_is_read(tmp_path):
    """A 600 KB policy.npz holding a 600 MB array: refused from its header, in the memory
    the command takes anyway (it took 645 MB before the header was read first)."""
    policy = _policy_copy(tmp_path)
    _declare_huge(policy / "policy.npz", 150_000_000)
    assert (policy / "policy.npz").stat().st_size < 2 << 20
    cmd = [*MLGO, "export", "--policy", str(policy), "--out", str(tmp_path / "exp"), "--no-aot"]
    # A child's peak memory counts the pages of the process it was forked from (ru_maxrss
    # survives exec), and a test worker holds a gigabyte: the command runs under a small
    # interpreter that prints its own child's peak.
    peak = subprocess.run(
        [sys.executable, "-c", PEAK, *cmd], capture_output=True, text=True, timeout=300
    )
    refused = subprocess.CompletedProcess(cmd, peak.returncode, "", peak.stderr)
    one_line_error(refused, str(policy / "policy.npz"), "150,000,000 numbers or more")
    max_rss = int(peak.stdout)
    assert max_rss < 300 << 10, max_rss  # KiB: far below the array's 600 MB
    assert not (tmp_path / "exp").exists()


@pytest.mark.parametrize(
    "spoil", [NESTED_META, NESTED_NORM], ids=["policy.json", "normalization.json"]
)
def test_mlgo_cc_names_a_spoilt_policy_and_its_reason_in_full(tc, tmp_path, spoil):
    """A service that cannot start on MLGO_POLICY costs no compile, and mlgo-cc's one
    warning names the file and why, however long its path (it was cut at 200 characters)."""
    file, why, change = spoil
    policy = tmp_path / ("a-long-directory-name-" * 10) / "policy"
    shutil.copytree(
        POLICIES / "inlining-size", policy, ignore=shutil.ignore_patterns("saved_model")
    )
    change(policy)
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    env = dict(os.environ, XDG_RUNTIME_DIR=str(runtime), MLGO_BACKEND="python")
    env.update(MLGO_POLICY=str(policy), MLGO_CACHE=str(tmp_path / "cache"))
    env.pop("MLGO_SOCKET", None)
    r = mlgo_cc(MLGO_CC, SOURCES[0], tmp_path / "a.o", env, timeout=300)
    assert r.returncode == 0 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("mlgo-cc: warning: the mlgo service did not start:")
    assert f"{policy / file}: {why}" in r.stderr and "default heuristic" in r.stderr
    plain = tmp_path / "plain.o"
    subprocess.run([tc.clang, "-Oz", "-c", str(SOURCES[0]), "-o", str(plain)], check=True)
    assert (tmp_path / "a.o").read_bytes() == plain.read_bytes()
