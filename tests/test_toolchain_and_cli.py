"""Toolchain discovery, the in-process llvmlite path, and the command line."""

import click
import pytest
import typer.main
from click.testing import CliRunner

from mlgo.cli import app
from mlgo.corpus.stats import cache_file
from mlgo.llvm.inprocess import compile_in_process
from mlgo.llvm.toolchain import ToolchainError, find_toolchain, probe
from mlgo.problems import get_problem
from tests.conftest import run_mlgo


def test_reference_toolchain_is_llvm_22_and_both_channels_work(tc):
    assert tc.major >= 22
    assert tc.tool("llvm-objcopy").endswith("llvm-objcopy")
    assert probe(tc, get_problem("inlining-size")) >= 1
    assert probe(tc, get_problem("regalloc-eviction")) >= 0


@pytest.mark.unit
def test_too_old_clang_is_refused_with_the_fix(tmp_path):
    old = tmp_path / "clang"
    old.write_text('#!/bin/sh\necho "Debian clang version 19.1.7 (3+b1)"\n')
    old.chmod(0o755)
    with pytest.raises(ToolchainError, match="clang 19; mlgo needs LLVM 22.*tools/setup.sh"):
        find_toolchain(str(old))


@pytest.mark.unit
def test_missing_clang_is_reported(tmp_path):
    with pytest.raises(ToolchainError, match="no clang found"):
        find_toolchain(str(tmp_path / "nothing-here"))


def test_clang_without_ml_hooks_fails_the_probe(tc, tmp_path):
    # A "compiler" that compiles fine but ignores the channel flags it does not know.
    fake = tmp_path / "clang"
    fake.write_text(
        f'#!/bin/sh\n[ "$1" = --version ] && exec {tc.clang} --version\n'
        f"exec {tc.clang} -Oz -c -o /dev/null -x c /dev/null\n"
    )
    fake.chmod(0o755)
    with pytest.raises(ToolchainError, match="never opened the inlining-size channel"):
        probe(find_toolchain(str(fake)), get_problem("inlining-size"))


def test_in_process_llvmlite_path_answers_the_same_channel(mini_corpus):
    problem = get_problem("inlining-size")
    bitcode = mini_corpus.modules[0].bitcode.read_bytes()
    default = compile_in_process(problem, bitcode)
    assert default.decisions and default.object_code[:4] == b"\x7fELF"
    assert compile_in_process(problem, bitcode).object_code == default.object_code
    never = compile_in_process(problem, bitcode, policy=lambda obs: 0)
    assert never.object_code != default.object_code or not any(
        int(d.advice[0]) for d in default.decisions
    )


def test_in_process_policy_failure_is_reported_without_a_hang(mini_corpus):
    from mlgo.llvm.channel import ChannelError

    problem = get_problem("inlining-size")
    with pytest.raises(ChannelError, match="policy failed on decision 0"):
        compile_in_process(
            problem, mini_corpus.modules[0].bitcode.read_bytes(), policy=lambda obs: 5
        )


def _command_paths(command: click.Command, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every registered command and sub-app, found by walking the click tree typer builds."""
    subs = command.commands.items() if isinstance(command, click.Group) else ()
    return [path, *(p for name, sub in subs for p in _command_paths(sub, (*path, name)))]


MLGO = typer.main.get_command(app)  # built once: typer builds the whole tree at each call
COMMANDS = _command_paths(MLGO)


@pytest.mark.unit
def test_the_command_walk_sees_the_sub_apps():
    assert {("corpus", "build"), ("xla", "tune"), ("demo",), ()} <= set(COMMANDS)
    assert len(COMMANDS) >= 22


@pytest.mark.unit
@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "mlgo")
def test_every_command_has_help(path):
    r = CliRunner().invoke(MLGO, [*path, "--help"], prog_name="mlgo")
    assert r.exit_code == 0, r.output
    assert f"Usage: mlgo {' '.join(path)}".rstrip() in r.output
    doc = MLGO
    for name in path:
        doc = doc.commands[name]
    assert doc.help or doc.short_help, f"mlgo {' '.join(path)} has no help text"


def test_the_installed_entry_point_answers_help():
    r = run_mlgo("--help", timeout=120)
    assert r.returncode == 0 and "Usage" in r.stdout


def test_corpus_stats_counts_call_sites_and_text(mini_corpus):
    r = run_mlgo("corpus", "stats", str(mini_corpus.root), timeout=300)
    assert r.returncode == 0, r.stderr
    assert "minipkg" in r.stdout and "total" in r.stdout
    assert cache_file(mini_corpus).exists()  # cached in the user's cache, not the corpus
    assert not (mini_corpus.root / "stats.json").exists()


def test_malformed_corpus_gives_one_line_error(tmp_path):
    (tmp_path / "corpus_description.json").write_text("[1, 2")
    r = run_mlgo("corpus", "stats", str(tmp_path), timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().startswith("error:") and "not valid JSON" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
