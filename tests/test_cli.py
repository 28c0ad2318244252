"""The command line stays thin: every command a few lines over a library function, and the
library functions it calls are the ones tools/ and these tests call."""

from __future__ import annotations

import ast
import inspect
import json
import subprocess
import textwrap
from pathlib import Path

import click
import numpy as np
import pytest
import typer.main
from typer.testing import CliRunner

from mlgo.cli import app
from mlgo.cli.train import train_command
from mlgo.llvm.sizes import SizeRow, linked_rows, tree_report, tree_totals
from mlgo.problems import get_problem
from mlgo.problems.policy_files import load_policy
from mlgo.train import registry
from mlgo.train.run import load_start, start_policy
from tests.conftest import MLGO, run_mlgo

MAX_BODY_LINES = 30
POLICIES = Path(__file__).parent.parent / "policies"


def _callbacks(group: click.Group) -> list:
    found = []
    for cmd in group.commands.values():
        found += _callbacks(cmd) if isinstance(cmd, click.Group) else [cmd.callback]
    return found


def _body_lines(fn) -> int:
    """Lines of FN's body, its docstring left out."""
    node = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0]
    assert isinstance(node, ast.FunctionDef)
    body = node.body[1:] if ast.get_docstring(node) else node.body
    return body[-1].end_lineno - body[0].lineno + 1


ALL_COMMANDS = _callbacks(typer.main.get_command(app))
CLI_COMMANDS = [fn for fn in ALL_COMMANDS if fn.__module__.startswith("mlgo.cli.")]


@pytest.mark.unit
def test_every_command_lives_in_the_cli_package_but_the_xla_wing():
    elsewhere = {fn.__module__ for fn in ALL_COMMANDS} - {fn.__module__ for fn in CLI_COMMANDS}
    assert elsewhere == {"mlgo.xla.cli"}
    modules = {fn.__module__ for fn in CLI_COMMANDS}
    assert modules == {
        f"mlgo.cli.{m}" for m in ("corpus", "train", "ship", "programs", "serve", "decisions")
    }
    assert len(CLI_COMMANDS) == 24


@pytest.mark.unit
@pytest.mark.parametrize("fn", CLI_COMMANDS, ids=lambda fn: fn.__name__)
def test_each_command_is_at_most_30_lines(fn):
    assert _body_lines(fn) <= MAX_BODY_LINES, f"{fn.__module__}.{fn.__name__} is not thin"


@pytest.mark.unit
def test_the_line_count_sees_a_long_command():
    def long_command() -> None:
        """Doc."""
        x = 0
        for _ in range(3):
            x += 1
        print(x)

    assert _body_lines(long_command) == 4


@pytest.mark.unit
def test_python_dash_m_runs_the_package():
    r = subprocess.run([*MLGO, "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "collect" in r.stdout and "install-wrappers" in r.stdout


# -- train.run: every input checked before anything is written ------------------------
@pytest.mark.unit
def test_start_policy_checks_algo_and_init_before_training(tmp_path):
    inlining = get_problem("inlining-size")
    assert start_policy("bc", None, inlining) is None
    with pytest.raises(ValueError, match="unknown --algo 'sgd': use bc, es, ppo or bcmax"):
        start_policy("sgd", None, inlining)
    with pytest.raises(ValueError, match="--algo ppo needs --init"):
        start_policy("ppo", None, inlining)
    with pytest.raises(ValueError, match="is a regalloc-eviction policy, not inlining-size"):
        load_start(POLICIES / "regalloc-eviction", inlining)
    regalloc = load_policy(POLICIES / "regalloc-eviction")  # a library caller's, loaded
    with pytest.raises(ValueError, match="is a regalloc-eviction policy, not inlining-size"):
        start_policy("es", regalloc, inlining)
    shipped = load_policy(POLICIES / "inlining-size")
    assert start_policy("bc", shipped, inlining) is None  # BC starts from nothing
    assert start_policy("es", shipped, inlining).problem is inlining
    link = get_problem("inlining-size-link")  # the same decision, at the link: a warm start
    assert start_policy("bcmax", shipped, link).problem is link
    taken_over = load_start(POLICIES / "inlining-size", link)  # for every link, not C only
    assert taken_over.problem is link and taken_over.languages is None
    assert load_start(POLICIES / "inlining-size", inlining).languages == ("c",)


def test_a_trainer_registered_with_one_line_brings_its_option_to_mlgo_train(
    mini_corpus, monkeypatch, tmp_path
):
    """tests/fake_trainer.py declares --stride in its config alone; `mlgo train` offers it,
    checks it when parsed, and hands it to the trainer, which starts from --init."""
    monkeypatch.setattr(registry, "MODULES", (*registry.MODULES, "tests.fake_trainer"))
    cli = typer.Typer()
    cli.command()(train_command())  # `mlgo train`, made as `mlgo` makes it
    runner = CliRunner()
    shown = runner.invoke(cli, ["--help"])
    assert shown.exit_code == 0 and "--stride" in shown.output and "walk" in shown.output
    start = POLICIES / "inlining-size"
    args = ["--algo", "walk", "--init", str(start), "--corpus", str(mini_corpus.root)]
    refused = runner.invoke(cli, [*args, "--out", str(tmp_path / "bad"), "--stride", "0"])
    assert refused.exit_code == 2 and "Invalid value for '--stride'" in refused.output
    assert not (tmp_path / "bad").exists()
    out = tmp_path / "walk"
    r = runner.invoke(cli, [*args, "--out", str(out), "--steps", "2", "--stride", "0.5"])
    assert r.exit_code == 0, r.output
    state = json.loads((out / "state.json").read_text())
    assert state["extra"]["config"]["stride"] == 0.5
    # its best policy is step 2's (tests/fake_trainer.py's rewards): two strides from --init
    walked = load_policy(out / "policy").flat()
    assert np.allclose(walked, load_policy(start).flat() + 2 * 0.5)
    assert "training corpus text_once" in r.output


@pytest.mark.unit
def test_tree_report_totals():
    rows = [SizeRow("a.o", 100, 90), SizeRow("b", 300, 330, linked=True)]
    assert tree_totals(rows) == {"baseline": 400, "build": 420, "delta_pct": pytest.approx(5.0)}
    b = {"path": "b", "baseline": 300, "build": 330, "linked": True}
    assert tree_report(rows)["files"][1] == b
    assert linked_rows(rows) == rows[1:]
    assert tree_totals([])["delta_pct"] == 0.0


def test_report_compares_two_build_trees(tc, tmp_path):
    src = tmp_path / "x.c"
    src.write_text("int f(int *a, int n) { int s = 0; for (int i = 0; i < n; i++) s += a[i] * i;"
                   " return s; }\n")  # fmt: skip
    for tree, level in (("small", "-Oz"), ("fast", "-O3")):
        (tmp_path / tree / "lib").mkdir(parents=True)
        obj = tmp_path / tree / "lib" / "x.o"
        subprocess.run([tc.clang, level, "-c", str(src), "-o", str(obj)], check=True)
    out = tmp_path / "report.json"
    r = run_mlgo("report", "--build-dir", str(tmp_path / "small"), "--baseline-dir",
                 str(tmp_path / "fast"), "--json", str(out), timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    report = json.loads(out.read_text())
    assert [f["path"] for f in report["files"]] == ["lib/x.o"]
    total = report["total"]
    assert total["build"] < total["baseline"] and total["delta_pct"] < 0
    assert "total" in r.stdout and "lib/x.o" in r.stdout
