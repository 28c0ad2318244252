"""A non-editable install (`pip install .` into another place) finds its recipes and
policies inside the package and runs `mlgo doctor` and `mlgo eval` with the shipped policy."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# What a source distribution holds: the package, its metadata, and the data it ships.
SHIPPED_FILES = (
    "pyproject.toml",
    "README.md",
    "mlgo",
    "corpus/recipes",
    "corpus/splits.toml",
    "corpus/ir2vec-vocabulary.json",
    "policies",
)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The checkout's package installed with pip into a directory of its own."""
    tmp = tmp_path_factory.mktemp("install")
    src = tmp / "src"
    for name in SHIPPED_FILES:
        dest = src / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / name).is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "aot")
            shutil.copytree(ROOT / name, dest, symlinks=True, ignore=ignore)
        else:
            shutil.copy2(ROOT / name, dest)
    site = tmp / "site"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation"]
    r = subprocess.run(
        [*pip, str(src), "--target", str(site)], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr
    shutil.rmtree(src)  # nothing may lean on the source any more
    return site


def _python(site: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """This interpreter with the installed package first (-P: not the working directory)."""
    env = dict(os.environ, PYTHONPATH=str(site))
    env.pop("MLGO_DATA", None)
    return subprocess.run(
        [sys.executable, "-P", *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=600
    )


def test_an_installed_package_ships_its_recipes_and_policies(installed, tmp_path):
    probe = (
        "import json, mlgo, mlgo.data as d, mlgo.packages.recipes as x, mlgo.corpus.splits as s;"
        "print(json.dumps([mlgo.__file__, [str(p) for p in d.default_policies()],"
        " x.available_recipes(), s.split_packages('test')]))"
    )
    r = _python(installed, "-c", probe, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    package, policies, recipes, test_split = json.loads(r.stdout)
    assert Path(package).is_relative_to(installed)  # not the checkout's editable copy
    assert len(policies) == 2  # per file, and at the link
    for policy in map(Path, policies):
        assert policy.is_relative_to(installed) and not policy.is_symlink()
        assert (policy / "saved_model" / "saved_model.pb").is_file()
    assert "lua" in recipes and len(recipes) == len(list((ROOT / "corpus/recipes").glob("*.toml")))
    assert len(test_split) >= 15 and set(test_split) <= set(recipes)  # splits.toml is shipped


def test_an_installed_mlgo_runs_doctor_and_eval_with_the_shipped_policy(
    installed, mini_corpus, tmp_path
):
    r = _python(installed, "-m", "mlgo.cli", "doctor", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "inlining-size channel" in r.stdout
    policy = installed / "mlgo" / "_data" / "policies" / "inlining-size"
    out = tmp_path / "eval"
    args = ["eval", "--policy", str(policy), "--corpus", str(mini_corpus.root), "--out", str(out)]
    r = _python(installed, "-m", "mlgo.cli", *args, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    result = json.loads((out / "eval.json").read_text())
    assert result["problem"] == "inlining-size" and result["totals"]["modules"] == 3
    assert "total" in r.stdout


def test_mlgo_data_points_every_lookup_at_another_directory(tmp_path):
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "mine.toml").write_text("")
    probe = (
        "import mlgo.data as d, mlgo.packages.recipes as x, mlgo.serve.cc as cc;"
        "print(x.available_recipes(), cc.DEFAULT_POLICY)"
    )
    env = dict(os.environ, MLGO_DATA=str(tmp_path))
    r = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=60
    )
    assert r.returncode == 0, r.stderr
    shipped = [
        str(tmp_path / "policies" / p) for p in ("inlining-size-guarded", "inlining-size-link")
    ]
    assert r.stdout.split() == ["['mine']", os.pathsep.join(shipped)]
