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
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from mlgo.corpus.extract import Invocation, logged_invocations
from mlgo.corpus.lto import Link, lto_flags, merged_module
from mlgo.corpus.wrappers import build_env
from mlgo.errors import UsageError
from mlgo.llvm.cmdline import without_outputs
from mlgo.llvm.driver import (
    SOURCE_SUFFIXES,
    link_output,
    link_stage,
    links_with_lld,
    named_output,
    source_files,
)
from mlgo.llvm.replay import ANSWERS_ADVISOR_PREFIX, CLANG_ADVISOR, DECISIONS_OUT_ENV, Decision
from mlgo.llvm.toolchain import Toolchain
from mlgo.problems.policy import MLPPolicy
from mlgo.runtime.commands import BuildError, run_logged
from mlgo.runtime.files import cache_subdir
from mlgo.runtime.trust import private_temp_dir
from mlgo.ship.decisions import (
    LOCATION_FLAGS,
    UnitDecisions,
    departures,
    from_recorder,
    name_problem,
    needs_locations,
    record,
    source_sums,
    write,
)
from mlgo.ship.plugin import inliner_plugin

SOURCES = "sources"  # beside the logged calls: each compile's source as it compiled it
# How the recording wrapper tells an LTO link by lld (mlgo.llvm.driver's `lto` and
# `links_with_lld`, in sh): only there does the link get the plugin, which GNU ld refuses.
_LLD_LTO = """lld= lto=
for a do
  case $a in
    -fuse-ld=* | --ld-path=*)
      l=${a#*=} && case ${l##*/} in ld.lld* | lld*) lld=1 ;; *) lld= ;; esac ;;
    -flto | -flto=*) lto=1 ;;
    -fno-lto) lto= ;;
  esac
done
"""


# How the recording wrapper keeps a copy of the source it compiles under the log's name in
# $sources (an argument with a source's suffix that is a file, not the value of -o): a build
# that generates a source and deletes it once compiled (bash's builtins) leaves its object,
# and the copy lets the decisions stage compile it again.
_KEEP_SOURCE = f"""prev=
for a do
  [ "$prev" != -o ] && case $a in {" | ".join(f"*{s}" for s in SOURCE_SUFFIXES)})
    [ -f "$a" ] && cp -- "$a" "$sources/${{log##*/}}" 2>/dev/null ;;
  esac
  prev=$a
done
"""


def _recording_wrapper(
    path: Path,
    compiler: str,
    calls: Path,
    recorded: Path,
    flags: list[str],
    at_link: list[str],
    keep_sources: bool,
) -> Path:
    """A compiler that logs its call in CALLS (as mlgo.corpus.wrappers does), with
    KEEP_SOURCES keeps a copy of its source in SOURCES beside it, and records the plugin's
    decisions in RECORDED under the log's name; an LTO link by lld also gets AT_LINK."""
    log_template = shlex.quote(str(calls / "XXXXXXXX"))
    path.write_text(
        "#!/bin/sh\n"
        f"log=$(mktemp {log_template}) && "
        f'printf \'%s\\0\' "$(pwd -P)" {shlex.quote(compiler)} "$@" >"$log" || exit 1\n'
        + (f"sources={shlex.quote(str(calls.parent / SOURCES))}\n" + _KEEP_SOURCE) * keep_sources
        + (_LLD_LTO + f'[ -n "$lld" ] && [ -n "$lto" ] && set -- "$@" {shlex.join(at_link)}\n')
        * bool(at_link)
        + f'{DECISIONS_OUT_ENV}={shlex.quote(str(recorded))}/"${{log##*/}}" '
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


@dataclass
class Recorded:
    """What a recorded build decided (per source path from its root, and per program), and
    the calls that decided it, still runnable in the build's tree."""

    files: dict[str, UnitDecisions]
    links: dict[str, UnitDecisions]
    compiles: dict[str, Invocation]
    link_calls: dict[str, Invocation]
    skipped: list[str]  # what was compiled but not kept, one line each
    flags: list[str]  # what every compile of a build replaying them adds (`compile_flags`)
    clangs: dict[str, Path]  # each unit's output by clang's own (`files/NAME`, `links/NAME`)
    own: dict[str, list[Decision]]  # each unit's decisions by clang's own, by the same names
    advised: list[str]  # what a compile's own flags are given for the plugin's advisor
    plugin: Path  # the plugin that served the policy (and serves a searched trajectory)


def record_build(
    policy: MLPPolicy, out: Path, root: Path, build: list[str], tc: Toolchain
) -> tuple[Path, list[str]]:
    """Runs BUILD in ROOT with POLICY served by the plugin and writes the decisions of its
    compiles and full-LTO links to OUT; also the lines that say what it could not keep."""
    with tempfile.TemporaryDirectory(prefix="mlgo-clangs-", dir=private_temp_dir()) as d:
        found = record_units(policy, root, build, tc, _log(out), Path(d))
    write(out, root, found.files, found.links, found.flags, tc.major)
    return out.resolve(), found.skipped


def record_units(
    policy: MLPPolicy,
    root: Path,
    build: list[str],
    tc: Toolchain,
    log: Path,
    clangs: Path,
    flags: list[str] | None = None,
    stage: str | None = None,
    restore_deleted: bool = False,
) -> Recorded:
    """Runs BUILD in ROOT (its output in LOG), its compiles given FLAGS after their own,
    with POLICY served by the plugin and recorded: at the compiles and at lld's LTO links,
    or only at the STAGE the policy serves (`Problem.stage`: the compiles, or the link of a
    full-LTO or ThinLTO build). Each recorded unit's departures from clang's own are
    counted by running its call once more with clang's own advisor, its output kept in
    CLANGS: the `.text` of plain clang's (the location flags change no code), which
    `decisions_kept` weighs the decisions against without compiling it again. With
    RESTORE_DELETED (ROOT is a scratch copy of the caller's), a source the build deleted
    once compiled, whose object it kept, is put back as it was compiled, to be decided."""
    if not build:
        raise UsageError("no build command to record (give it after `--`)")
    plugin = inliner_plugin(policy, tc)
    at_compile, at_link = stage in (None, "compile"), stage != "compile"
    root = root.resolve()
    link_load = [f"-Wl,--load-pass-plugin={plugin}"] * at_link
    # the plugin for a compile is unused at a link, the link's at a compile
    located = [*[f"-fpass-plugin={plugin}"] * at_compile, *LOCATION_FLAGS, "-Qunused-arguments"]
    common = [*located, *link_load]
    # as the service serves it: the advisor's own flags, and the base of clang's it departs from
    served = [*located, *policy.problem.advisor_flags, *policy.base_flags]
    with tempfile.TemporaryDirectory(prefix="mlgo-decisions-", dir=private_temp_dir()) as d:
        work, calls, recorded = Path(d), Path(d) / "calls", Path(d) / "recorded"
        calls.mkdir()
        recorded.mkdir()
        (work / SOURCES).mkdir()
        cc, cxx = (
            _recording_wrapper(
                work / name, compiler, calls, recorded, served, link_load, restore_deleted
            )  # fmt: skip
            for name, compiler in (("rec-cc", tc.clang), ("rec-c++", tc.clangxx))
        )
        env = build_env(tc, work, flags or [], str(cc), str(cxx))
        run_logged(build, root, log, None, env, shlex.join(build))
        texts: dict[tuple[str, str], list[str]] = {}
        compiles: dict[str, Invocation] = {}
        linked: dict[str, Invocation] = {}
        skipped = []
        for call in logged_invocations(calls):
            args, rec = call.argv[1:], recorded / call.log_name
            text = rec.read_text() if rec.exists() else ""
            sources = source_files(args)
            if "-c" in args and len(sources) == 1:
                if not (call.cwd / sources[0]).is_file() and not (
                    restore_deleted and _restored(call, sources[0], work / SOURCES)
                ):
                    continue  # a configure's probe, deleted since: nothing to replay
                name = os.path.relpath((call.cwd / sources[0]).resolve(), root)
                if name.startswith(".."):
                    skipped.append(f"{sources[0]}: outside {root}, not kept")
                    continue
                if (problem := name_problem("files", name)) is not None:
                    skipped.append(f"{name!r}: its name {problem}; clang's own decisions")
                    continue
                if at_compile:
                    texts.setdefault(("files", name), []).append(text)
                compiles[name] = call
            elif link_stage(args) is not None and links_with_lld(args):  # full or thin
                if not (call.cwd / link_output(args)).is_file():
                    continue  # a configure's probe, deleted since
                program = Path(link_output(args)).name
                if (problem := name_problem("links", program)) is not None:
                    skipped.append(f"{program!r}: its name {problem}; clang's own decisions")
                    continue
                if at_link:
                    texts.setdefault(("links", program), []).append(text)
                    linked[program] = call
            elif sources:
                skipped.append(f"{shlex.join(call.argv[:4])} ...: not one source, not kept")
    if not compiles and not linked:
        raise UsageError(f"{shlex.join(build)} compiled nothing in {root}: record a clean build")
    units: dict[str, dict[str, UnitDecisions]] = {"files": {}, "links": {}}
    for (kind, name), parts in texts.items():
        ours, conflicts, refused = from_recorder("".join(parts), f"{kind}/{name}")
        units[kind][name] = UnitDecisions(ours, conflicts, refused=len(refused))
        skipped += [f"{kind}/{name}: {r}; clang's own decision there" for r in refused]
    outputs: dict[str, Path] = {}
    own: dict[str, list[Decision]] = {}
    for n, (name, unit) in enumerate(units["files"].items()):
        call, outputs[f"files/{name}"] = compiles[name], clangs / f"{n}.o"
        command = [*without_outputs(call.argv), *common, "-o", str(outputs[f"files/{name}"])]
        own[f"files/{name}"] = record(command, call.cwd, CLANG_ADVISOR)[0]
        unit.departures = departures(unit.decisions, own[f"files/{name}"])
        unit.digest, unit.cksum = source_sums(root / name)
    for n, (program, unit) in enumerate(units["links"].items()):
        outputs[f"links/{program}"] = clangs / f"{n}.program"
        own[f"links/{program}"] = clangs_link(linked[program], common, outputs[f"links/{program}"])
        unit.departures = departures(unit.decisions, own[f"links/{program}"])
    g0 = any(needs_locations(call.argv) for call in compiles.values())
    return Recorded(
        units["files"], units["links"], compiles if at_compile else {}, linked, skipped,
        list(LOCATION_FLAGS) if g0 else [], outputs, own,
        [*located, *policy.problem.advisor_flags], plugin,
    )  # fmt: skip


def _restored(call: Invocation, source: str, kept: Path) -> bool:
    """Whether CALL's SOURCE, deleted since the build compiled it, was put back from its
    copy in KEPT: only where the compile's object is still there (a product of the build,
    not a configure's probe, which deletes both)."""
    args = call.argv[1:]
    obj = named_output(args) or Path(source).with_suffix(".o").name
    copy = kept / call.log_name
    if not (call.cwd / obj).is_file() or not copy.is_file():
        return False
    (call.cwd / source).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(copy, call.cwd / source)
    return True


def answered_units(found: Recorded, answers: Mapping[str, str]) -> dict[str, UnitDecisions]:
    """Per file of FOUND that ANSWERS answers (a searched trajectory's answers, in the
    order the advisor asks them: `ANSWERS_ADVISOR_PREFIX`), its compile run once more with
    those answers, recorded and so keyed by call site: the search's decisions (by
    `files/NAME`), which `decisions_kept` weighs beside the policy's."""
    units: dict[str, UnitDecisions] = {}
    with tempfile.TemporaryDirectory(prefix="mlgo-answers-", dir=private_temp_dir()) as d:
        path = Path(d) / "answers"
        for name, given in answers.items():
            if name not in found.files:  # a file the build did not record
                continue
            call, policys = found.compiles[name], found.files[name]
            path.write_text(given)
            command = [*without_outputs(call.argv), *found.advised, "-o", os.devnull]
            ours, conflicts, refused = record(command, call.cwd, ANSWERS_ADVISOR_PREFIX + str(path))
            unit = UnitDecisions(ours, conflicts, refused=len(refused), found_by="search")
            unit.departures = departures(ours, found.own[f"files/{name}"])
            unit.digest, unit.cksum = policys.digest, policys.cksum
            units[f"files/{name}"] = unit
    return units


def answered_links(
    found: Recorded, answers: Mapping[str, str], tc: Toolchain, opt_level: str
) -> dict[str, UnitDecisions]:
    """Per program of FOUND's full-LTO links that ANSWERS answers (a searched trajectory's
    answers on its merged module, as `clang OPT_LEVEL -c` of it asked them: `lto.cc1_args`),
    the link replayed as the corpus replayed it (`lto.merged_module`) for its merged module,
    which then compiles as the search compiled it, with those answers, recorded: the
    search's decisions keyed by call site. The link's own pipeline asks in another order,
    so only keys carry the answers there: its replay matches the sites it shares with the
    compile, clang's own decide the others, and `decisions_kept` judges the link (by
    `links/PROGRAM`)."""
    units: dict[str, UnitDecisions] = {}
    load = f"-fpass-plugin={found.plugin}"
    advised = [*[load] * (load not in found.advised), *found.advised]
    with tempfile.TemporaryDirectory(prefix="mlgo-answers-", dir=private_temp_dir()) as d:
        path = Path(d) / "answers"
        for program, given in answers.items():
            if program not in found.links:
                continue
            call = found.link_calls[program]
            link = Link(call.cwd, call.argv, Path(call.cwd) / link_output(call.argv[1:]))
            with tempfile.TemporaryDirectory(prefix="link-", dir=d) as private:
                try:
                    flags = [opt_level, *lto_flags("link")]
                    merged = merged_module(link, flags, Path(private), None)
                except BuildError:  # the recorded link replays: this one did, to be recorded
                    continue
                path.write_text(given)
                command = [tc.clang, opt_level, "-c", str(merged), *advised, "-o", os.devnull]
                advisor = ANSWERS_ADVISOR_PREFIX + str(path)
                ours, conflicts, refused = record(command, call.cwd, advisor)
            unit = UnitDecisions(ours, conflicts, refused=len(refused), found_by="search")
            unit.departures = departures(ours, found.own[f"links/{program}"])
            units[f"links/{program}"] = unit
    return units


def clangs_link(call: Invocation, flags: list[str], output: Path) -> list[Decision]:
    """The decisions clang's own advisor makes at CALL's link (given FLAGS, which load
    our plugin), linked again to OUTPUT."""
    command = [*without_outputs(call.argv), *flags, "-o", str(output)]
    return record(command, call.cwd, CLANG_ADVISOR)[0]
