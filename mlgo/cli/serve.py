"""`mlgo serve`, `status`, `channel`, `flags`, `stop` and `install-wrappers`: the policy service
that builds reach through mlgo-cc."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from mlgo.cli.options import DEFAULT_POLICIES, PoliciesOpt, SocketOpt, console, err
from mlgo.errors import UsageError
from mlgo.options import MOST_SECONDS, non_negative, positive_up_to


def serve(
    policy: PoliciesOpt = DEFAULT_POLICIES,
    backend: Annotated[
        str,
        typer.Option(
            help="plugin (inside clang), native (AOT policy server on a channel), python, "
            "or auto: plugin where the problem has one, native otherwise"
        ),
    ] = "auto",
    socket: SocketOpt = None,
    idle_exit: Annotated[
        float,
        typer.Option(help="exit after this many idle seconds (0: never)", callback=non_negative),
    ] = 0.0,
) -> None:
    """Run the policy service: one channel per compilation, many at once, until stopped."""
    from mlgo.serve.client import socket_path
    from mlgo.serve.server import run_service

    def say(line: str) -> None:
        err.print(line, highlight=False)

    run_service(policy, backend, socket or socket_path(), idle_exit, say)


def status(socket: SocketOpt = None) -> None:
    """What the service serves: policies, compilations, decisions, latency percentiles."""
    from mlgo.serve.client import request

    s = request({"op": "status"}, path=socket)
    table = Table("", "", title=f"mlgo service (pid {s['pid']}, up {s['uptime_s']:.0f} s)")
    for key in ("active_leases", "compilations", "decisions", "failed_compilations"):
        table.add_row(key.replace("_", " "), f"{s[key]:,}")
    kinds = (
        ("compiles", "levels"),
        ("links (full LTO)", "links"),
        ("links (ThinLTO)", "thin_links"),
    )
    for what, key in kinds:
        for level, n in sorted(s.get(key, {}).items()):
            served = f"{n['served']:,} served, {n['default']:,} left to clang's default"
            table.add_row(f"{level} {what}", served)
    for p in s["policies"]:
        lat = p["latency"]
        pct = ", ".join(f"{k[:-3]} {v:.1f} µs" for k, v in lat.items()) if lat else "no decisions"
        if p["backend"] == "plugin":
            pct = "decided inside clang (not counted here)"
        by_hand = f"; channels by hand: {p['by_hand']}" if p.get("by_hand") else ""
        table.add_row(f"{p['problem']} ({p['backend']}{by_hand})", f"{p['path']}\n{pct}")
    console.print(table)


def channel(
    problem: Annotated[str, typer.Option(help="the decision the channel serves")] = (
        "inlining-size"
    ),
    socket: SocketOpt = None,
    ttl: Annotated[
        float,
        typer.Option(
            help="seconds the channel waits for its compiler", callback=positive_up_to(MOST_SECONDS)
        ),
    ] = 600,
) -> None:
    """Print a channel base for one compilation run by hand (-mllvm -...-channel-base=);
    starts the service (as mlgo-cc would) when none is running. When the policy needs more
    than the base (a gated one needs the compiler's own answer), a note says which flags."""
    from mlgo.problems import get_problem
    from mlgo.serve.cc import by_hand
    from mlgo.serve.client import socket_path
    from mlgo.serve.lease import check_lease_flags

    path = socket or socket_path()
    reply = by_hand(path, socket is None, {"op": "channel", "problem": problem, "ttl_s": ttl})
    base, flags = reply["base"], reply.get("flags") or []
    flags = check_lease_flags(flags, path.parent)
    if flags and flags != get_problem(problem).flags_for_serving(base):
        err.print(f"mlgo: note: this policy's channel needs: {' '.join(flags)}", highlight=False)
    print(base)


def flags(
    cflags: Annotated[
        list[str] | None, typer.Argument(help="your compile flags, after --: their -O level")
    ] = None,
    problem: Annotated[
        str | None, typer.Option(help="only this decision (default: every served policy)")
    ] = None,
    language: Annotated[
        str, typer.Option(help="the language of the compiles: c (CFLAGS) or c++ (CXXFLAGS)")
    ] = "c",
    link: Annotated[
        bool, typer.Option(help="for an LTO link by lld (-flto[=thin] -fuse-ld=lld): LDFLAGS")
    ] = False,
    socket: SocketOpt = None,
    decisions: Annotated[
        Path | None, typer.Option(help="instead, the flags that replay this decisions directory")
    ] = None,
) -> None:
    """Print the flags that bring the served policies to your own clang command, each by its
    fastest route (the plugin; a channel, for one compilation, where a problem has none);
    with --link, those for the link of an LTO build (full or thin, as CFLAGS say), which
    only link-time policies of that kind answer. Nothing when CFLAGS select a level (or
    --language one) no policy serves. Starts the service (as mlgo-cc would) when none is
    running. With --decisions, those that replay a decisions directory, and no service."""
    from mlgo.llvm.driver import link_stage
    from mlgo.llvm.languages import LANGUAGES
    from mlgo.serve.cc import flags_by_hand
    from mlgo.serve.client import socket_path
    from mlgo.ship.decisions import build_flags, read

    if language not in LANGUAGES:
        raise UsageError(f"--language {language!r} is not one of {', '.join(LANGUAGES)}")
    if decisions:
        found, note = build_flags(read(decisions), cflags or [], link)
    else:
        stage = (link_stage(cflags or []) or "link") if link else "compile"
        path = socket or socket_path()
        found, note = flags_by_hand(path, socket is None, problem, cflags or [], language, stage)
    if note:
        err.print(f"mlgo: note: {note}", highlight=False)
    if found:
        print(" ".join(found))


def install_wrappers() -> None:
    """Install the native mlgo-cc/mlgo-c++ (C; no interpreter start-up per compile) over
    the Python entry points, which they hand every uncommon case to. tools/setup.sh runs it."""
    from mlgo.serve.native_wrapper import install_native_wrappers

    for path in install_native_wrappers(Path(sys.executable).parent):
        console.print(f"installed {path}")


def stop(socket: SocketOpt = None) -> None:
    """Stop the service; its channels are cleaned up."""
    from mlgo.serve.client import request

    request({"op": "stop"}, path=socket)
    console.print("mlgo service stopping")
