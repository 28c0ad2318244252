"""The cost of serving a link-time policy: each link of a real full-LTO build, run plain and
through mlgo-cc with the policy in lld's LTO, in paired rounds, with an A/A control.

  .venv/bin/python -m tools.bench_link lua sqlite3 --rounds 10 --work data/bench-link

Each recipe's Debian source is built once with `-Oz -flto=full -fuse-ld=lld` under the
recording wrappers, which log its links (`mlgo.corpus.lto.logged_links`). Each round then
runs every link each way, in a shuffled order: plain clang (the baseline), plain clang again
(the A/A control: the noise), and `mlgo-cc` (the installed native wrapper, which leases
the link's flags itself) with a service serving the link-time policy, which lld loads as a
plugin. A
fourth way is plain clang with the plugin's flags added by hand (`mlgo flags --link`): the
policy's own cost in lld, without the wrapper's. A link's CPU time is the driver's and all
its children's (wait4's rusage): clang, lld and its LTO backend, and for mlgo-cc the wrapper
and its lease; the service's own CPU (it hands out one flag) is not counted. Reported: per
recipe, the median and interquartile range over rounds of each way's change in summed CPU
time against the baseline. The policy is --policy, or the shipped link-time policy, served
as it ships: the shipped one asks for the size guard, so `mlgo-cc` links each program twice
(the plugin by hand shows the policy's cost without it).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from mlgo.corpus.extract import logged_invocations
from mlgo.corpus.lto import Link, logged_links, replay_command
from mlgo.corpus.wrappers import build_env
from mlgo.data import shipped_policy
from mlgo.llvm.toolchain import Toolchain, find_toolchain
from mlgo.packages.recipes import Recipe, load_recipe
from mlgo.problems import get_problem
from mlgo.programs.build import mlgo_compilers, policy_service, pristine_source, problem_flags
from mlgo.programs.measure import paired_change
from mlgo.runtime.commands import run_logged
from mlgo.serve.cc import flags_by_hand

LINK = get_problem("inlining-size-link")
WAYS = ("plain", "plain again", "plugin by hand", "mlgo-cc")


def logged_build(recipe: Recipe, work: Path, tc: Toolchain) -> list[Link]:
    """RECIPE built once in WORK/tree with full LTO by lld, its links logged (kept: a rerun
    reuses the build)."""
    tree, logs = work / "tree", work / "logs"
    if not (work / ".built").exists():
        shutil.rmtree(tree, ignore_errors=True)
        shutil.rmtree(logs, ignore_errors=True)
        shutil.copytree(pristine_source(recipe, work), tree, symlinks=True)
        logs.mkdir()
        (work / "bin").mkdir(exist_ok=True)
        env = build_env(tc, work / "bin", problem_flags(LINK), log_dir=logs)
        for cmd in [*recipe.configure, *recipe.build]:
            run_logged(cmd, tree, work / "build.log", recipe.build_timeout_s, env, recipe.name)
        (work / ".built").touch()
    return logged_links(logged_invocations(logs), "link")


def link_cpu_s(cmd: list[str], cwd: Path, env: dict[str, str]) -> float:
    """CPU seconds of one link, the driver and every process under it."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    stderr = proc.stderr.read() if proc.stderr else b""
    if os.waitstatus_to_exitcode(status) != 0 or stderr:
        raise RuntimeError(f"{cmd[0]} in {cwd}: {stderr[:300]!r}")
    return usage.ru_utime + usage.ru_stime


def rounds_of(links: list[Link], env: dict[str, str], rounds: int, seed: int) -> list[dict]:
    """ROUNDS rounds of every link each way (shuffled per round): summed CPU seconds."""
    flags = problem_flags(LINK)
    cc, cxx = mlgo_compilers()
    socket = Path(env["MLGO_SOCKET"])
    by_hand, _ = flags_by_hand(socket, False, None, [*flags, "-Oz"], "c", "link")
    rng = random.Random(seed)
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-link-") as out:
        for _ in range(rounds):
            ways = list(WAYS)
            rng.shuffle(ways)
            cpu = dict.fromkeys(WAYS, 0.0)
            for way in ways:
                for i, link in enumerate(links):
                    extra = by_hand if way == "plugin by hand" else []
                    cmd = replay_command(link, [*flags, *extra], Path(out) / f"{i}.out")
                    if way == "mlgo-cc":
                        cmd[0] = cxx if link.argv[0].endswith("++") else cc
                    cpu[way] += link_cpu_s(cmd, link.cwd, env if way == "mlgo-cc" else {})
            results.append(cpu)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("recipes", nargs="+")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--work", type=Path, default=Path("data/bench-link"))
    ap.add_argument("--policy", type=Path, help="a link-time policy (default: the shipped one)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    tc, work = find_toolchain(), args.work.resolve()
    policy = (args.policy or shipped_policy(LINK.name)).resolve()
    table = Table("recipe", "links", *(f"{w} vs plain: median (IQR)" for w in WAYS[1:]))
    with policy_service([policy], work / "service") as service:
        env = dict(os.environ, **service, MLGO_CC=tc.clang, MLGO_CXX=tc.clangxx)
        for name in args.recipes:
            links = logged_build(load_recipe(name), work / name, tc)
            if not links:  # compiled and linked in one command (sqlite3): no link of objects
                table.add_row(name, "0", *["no link of bitcode objects"] * (len(WAYS) - 1))
                continue
            rounds = rounds_of(links, env, args.rounds, args.seed)
            base = [r["plain"] for r in rounds]
            cells = []
            for way in WAYS[1:]:
                change = paired_change([r[way] for r in rounds], base)
                q1, median, q3 = (100 * change[k] for k in ("q1", "median", "q3"))
                cells.append(f"{median:+.2f}% ({q1:+.2f}..{q3:+.2f}%)")
            table.add_row(name, str(len(links)), *cells)
    Console().print(table)


if __name__ == "__main__":
    main()
