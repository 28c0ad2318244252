"""`mlgo decisions record`: a project's build, its compiles (and full-LTO links by lld)
served a policy by our plugin with its recorder on, kept as a decisions directory
(mlgo.ship.decisions) that plain clang then replays.

The build runs as it is, in its tree, with CC/CXX set to wrappers (mlgo.corpus.wrappers'
environment, so a build that names `gcc` or `ar` gets them too) that log each call as the
corpus recording does and give it its own recorder file beside the log. Every compile gets
the location flags whatever its -g: they change no object, and keys of a -g build are the
same with or without them. Afterwards each compile runs once more with clang's own advisor,
to nowhere, so the directory says where the policy departs from clang.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import tempfile
from pathlib import Path

from mlgo.corpus.extract import logged_invocations
from mlgo.corpus.wrappers import build_env
from mlgo.errors import UsageError
from mlgo.llvm.cmdline import without_outputs
from mlgo.llvm.driver import link_output, link_stage, links_with_lld, source_files
from mlgo.llvm.replay import CLANG_ADVISOR, DECISIONS_OUT_ENV
from mlgo.llvm.toolchain import Toolchain
from mlgo.problems.policy import MLPPolicy
from mlgo.runtime.commands import run_logged
from mlgo.runtime.files import cache_subdir
from mlgo.runtime.trust import private_temp_dir
from mlgo.ship.decisions import (
    LOCATION_FLAGS,
    UnitDecisions,
    departures,
    from_recorder,
    needs_locations,
    record,
    source_digest,
    write,
)
from mlgo.ship.plugin import inliner_plugin


def _recording_wrapper(path: Path, compiler: str, calls: Path, recorded: Path, flags: list[str]):
    """A compiler that logs its call in CALLS (as mlgo.corpus.wrappers does) and records the
    plugin's decisions in RECORDED under the log's name."""
    log_template = shlex.quote(str(calls / "XXXXXXXX"))
    path.write_text(
        "#!/bin/sh\n"
        f"log=$(mktemp {log_template}) && "
        f'printf \'%s\\0\' "$(pwd -P)" {shlex.quote(compiler)} "$@" >"$log" || exit 1\n'
        f'{DECISIONS_OUT_ENV}={shlex.quote(str(recorded))}/"${{log##*/}}" '
        f'exec {shlex.quote(compiler)} "$@" {shlex.join(flags)}\n'
    )
    path.chmod(0o755)
    return path


def _log(out: Path) -> Path:
    """Where the build's output goes: the user's cache, by OUT's path (kept: a failed
    build's error names it)."""
    key = hashlib.sha256(str(out.resolve()).encode()).hexdigest()[:16]
    log = cache_subdir("decisions") / f"{key}.log"
    log.unlink(missing_ok=True)
    return log


def record_build(
    policy: MLPPolicy, out: Path, root: Path, build: list[str], tc: Toolchain
) -> tuple[Path, list[str]]:
    """Runs BUILD in ROOT with POLICY served by the plugin and writes the decisions of its
    compiles and full-LTO links to OUT; also the lines that say what it could not keep."""
    if not build:
        raise UsageError("no build command to record (give it after `--`)")
    plugin = inliner_plugin(policy, tc)
    root = root.resolve()
    flags = [f"-fpass-plugin={plugin}", f"-Wl,--load-pass-plugin={plugin}", *LOCATION_FLAGS]
    flags.append("-Qunused-arguments")  # the plugin for a compile is unused at a link
    with tempfile.TemporaryDirectory(prefix="mlgo-decisions-", dir=private_temp_dir()) as d:
        work, calls, recorded = Path(d), Path(d) / "calls", Path(d) / "recorded"
        calls.mkdir()
        recorded.mkdir()
        cc = _recording_wrapper(work / "rec-cc", tc.clang, calls, recorded, flags)
        cxx = _recording_wrapper(work / "rec-c++", tc.clangxx, calls, recorded, flags)
        env = build_env(tc, work, [], str(cc), str(cxx))
        run_logged(build, root, _log(out), None, env, shlex.join(build))
        texts: dict[tuple[str, str], list[str]] = {}
        compiles: dict[str, tuple[Path, list[str]]] = {}
        skipped = []
        for call in logged_invocations(calls):
            args, rec = call.argv[1:], recorded / call.log_name
            text = rec.read_text() if rec.exists() else ""
            sources = source_files(args)
            if "-c" in args and len(sources) == 1:
                name = os.path.relpath((call.cwd / sources[0]).resolve(), root)
                if name.startswith(".."):
                    skipped.append(f"{sources[0]}: outside {root}, not kept")
                    continue
                texts.setdefault(("files", name), []).append(text)
                compiles[name] = (call.cwd, call.argv)
            elif link_stage(args) == "link" and links_with_lld(args):
                texts.setdefault(("links", Path(link_output(args)).name), []).append(text)
            elif sources:
                skipped.append(f"{shlex.join(call.argv[:4])} ...: not one source, not kept")
    if not texts:
        raise UsageError(f"{shlex.join(build)} compiled nothing in {root}: record a clean build")
    units: dict[str, dict[str, UnitDecisions]] = {"files": {}, "links": {}}
    for (kind, name), parts in texts.items():
        ours, conflicts = from_recorder("".join(parts), f"{kind}/{name}")
        units[kind][name] = UnitDecisions(ours, conflicts)
    for name, (cwd, argv) in compiles.items():
        clangs, _ = record([*without_outputs(argv), *flags, "-o", os.devnull], cwd, CLANG_ADVISOR)
        unit = units["files"][name]
        unit.departures, unit.digest = (
            departures(unit.decisions, clangs),
            source_digest(root / name),
        )
    g0 = any(needs_locations(argv) for _, argv in compiles.values())
    write(out, root, units["files"], units["links"], list(LOCATION_FLAGS) if g0 else [], tc.major)
    return out.resolve(), skipped
