"""Bitcode out of a finished build's objects, into a corpus.

Which compiles a build kept (from bear's compile_commands.json or the wrappers' own log), one
module per distinct bitcode under a name that does not depend on the build's order, and
LLVM's own `extract_ir` (PyPI's mlgo-utils) writing `NAME.bc` + `NAME.cmd` per module.
Objects carry their bitcode because they were compiled with `wrappers.RECORD_FLAGS`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from mlgo.corpus.format import DESCRIPTION, CorpusError, read_stage, write_description
from mlgo.llvm.driver import COMPILED_SUFFIXES, named_output, takes_value
from mlgo.llvm.toolchain import Toolchain
from mlgo.runtime.commands import BuildError, run_logged
from mlgo.runtime.files import atomic_write_text
from mlgo.runtime.inputs import read_json

MLGO_UTILS_DIR = Path(sys.prefix) / "mlgo-utils"  # installed by tools/setup.sh


def _bitcode_digest(obj: Path) -> str | None:
    """The hash of OBJ's embedded bitcode, or None if it has none."""
    try:
        with open(obj, "rb") as f:
            section = ELFFile(f).get_section_by_name(".llvmbc")
            return hashlib.sha256(section.data()).hexdigest() if section else None
    except (OSError, ELFError):
        return None


NO_BITCODE = "no bitcode (not compiled by the recording CC/CXX, or not C/C++)"


def distinct_modules(named: list[tuple[str, Path]], skipped: list[str]) -> dict[str, Path]:
    """Module name -> object, from (wanted name, object) pairs: one module per distinct
    bitcode (a file compiled twice the same way is kept once, under its shortest name), and
    a name wanted twice for different bitcode (a library's PIC and static copies of one
    source) gets `.2`, `.3`... in the order of the objects' paths, so names do not depend on
    the order a parallel build ran in. An object without bitcode is named in SKIPPED."""
    names: dict[str, Path] = {}
    seen: set[str] = set()
    for base, obj in sorted(named, key=lambda n: (n[0].count("/"), n[0], str(n[1]))):
        digest = _bitcode_digest(obj)
        if digest is None:
            skipped.append(f"{obj}: {NO_BITCODE}, not recorded")
            continue
        if digest in seen:
            continue
        seen.add(digest)
        name, n = base, 1
        while name in names:
            n += 1
            name = f"{base}.{n}"
        names[name] = obj
    return names


def extract_modules(
    modules: dict[str, Path], staged: Path, tc: Toolchain, work: Path, log: Path, what: str
) -> list[str]:
    """LLVM's extract_ir over MODULES (name -> object) into the corpus directory STAGED;
    returns the names it extracted (a BuildError if none).

    extract_ir names each module by its object's path as the build wrote it (an absolute
    one lands outside the corpus): link the objects under WORK by their module names."""
    if not MLGO_UTILS_DIR.is_dir():
        raise BuildError(
            f"LLVM's mlgo-utils is not installed in {MLGO_UTILS_DIR}; run tools/setup.sh"
        )
    linked = work / "modules"
    shutil.rmtree(linked, ignore_errors=True)
    entries = []
    for name, obj in modules.items():
        (linked / name).parent.mkdir(parents=True, exist_ok=True)
        (linked / name).symlink_to(obj.resolve())
        entries.append({"directory": str(linked), "file": name, "arguments": ["-o", name]})
    cc_json = work / "compile_commands.modules.json"
    atomic_write_text(cc_json, json.dumps(entries, indent=1))
    # mlgo-utils' top-level package is also called `mlgo`: run it without site-packages.
    run_logged(
        [
            sys.executable,
            "-S",
            "-m",
            "mlgo.corpus.extract_ir",
            "--input",
            str(cc_json),
            "--input_type",
            "json",
            "--output_dir",
            str(staged.resolve()),  # extract_ir runs in WORK, not where OUT was named
            "--llvm_objcopy_path",
            tc.tool("llvm-objcopy"),
            "--num_workers",
            str(min(8, os.cpu_count() or 2)),
        ],
        work,
        log,
        900,
        dict(os.environ, PYTHONPATH=str(MLGO_UTILS_DIR)),
        f"{what}: extract_ir",
    )
    try:
        names = _extracted_modules(staged)
    except (OSError, ValueError, KeyError) as e:
        raise BuildError(f"{what}: extract_ir wrote no corpus ({e}; log: {log})") from e
    if not names:
        raise BuildError(f"{what}: the build produced no bitcode (log: {log})")
    write_description(staged, names)  # a failure to write it is not extract_ir's
    return names


def _is_relocatable_object(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return ELFFile(f).header["e_type"] == "ET_REL"
    except (OSError, ELFError):
        return False


@dataclass(frozen=True)
class Compile:
    """One compile step of a recorded build: its source and the object it wrote."""

    source: Path
    obj: Path


def kept_compiles(recorded: Path) -> list[Compile]:
    """The compile commands of bear's RECORDED compile_commands.json whose output is a
    relocatable object that survived the build, one per object (`surviving`).

    bear also records the `clang -cc1` jobs of a compile-and-link step (their objects are
    deleted temporaries) and splits such a step into one `-c` entry per source, all naming
    the linked program as output; none of those is a module.
    """
    steps = []
    for entry in read_json(recorded, BuildError):
        args = entry.get("arguments") or shlex.split(entry.get("command", ""))
        if "-cc1" not in args:
            steps.append((Path(entry["directory"]), args, entry["file"]))
    keep = surviving(steps)
    if not keep:
        raise BuildError(
            f"{recorded}: the build compiled no object file that survived it "
            "(an up-to-date build compiles nothing: record a clean one)"
        )
    return keep


@dataclass(frozen=True)
class Invocation:
    """One call of a recording wrapper: its working directory and the command it ran, the
    compiler (as the wrapper names it) and then the build's own arguments; the log's name."""

    cwd: Path
    argv: list[str]
    log_name: str = ""

    def inputs(self) -> list[str]:
        """The arguments that are no option nor an option's value: sources and objects."""
        args = self.argv[1:]
        return [
            a
            for i, a in enumerate(args)
            if not a.startswith("-") and (i == 0 or not takes_value(args[i - 1]))
        ]


def logged_invocations(log_dir: Path) -> list[Invocation]:
    """What the recording wrappers logged in LOG_DIR (`wrappers.write_wrapper`), in the
    order they started (a log's time; its random name breaks a tie). A log cut short (a
    killed wrapper) is none. Paths keep their bytes (`os.fsdecode`), whatever their encoding."""
    found = []
    for log in log_dir.iterdir():
        fields = log.read_bytes().split(b"\0")
        if len(fields) < 3 or fields[-1] != b"":
            continue
        started = (log.stat().st_mtime_ns, log.name)
        argv = [os.fsdecode(a) for a in fields[1:-1]]
        found.append((started, Invocation(Path(os.fsdecode(fields[0])), argv, log.name)))
    return [i for _, i in sorted(found, key=lambda f: f[0])]


def logged_compiles(invocations: list[Invocation]) -> list[Compile]:
    """The compiles among a build's logged INVOCATIONS whose object survived the build, one
    per object (`surviving`). Each source of a `-c` call is one compile."""
    steps = [
        (i.cwd, i.argv[1:], a)
        for i in invocations
        if "-c" in i.argv  # not a link, nor a preprocessing run
        for a in i.inputs()
        if a.endswith(COMPILED_SUFFIXES)
    ]
    return surviving(steps)


def objects_without_bitcode(tree: Path, since: float, known: set[Path]) -> list[Path]:
    """The relocatable objects without bitcode under TREE modified SINCE, but those in KNOWN
    (resolved): what a build wrote with a compiler other than the recording wrappers (one
    named by its path, which their masquerade does not catch), in order."""
    found = []
    for directory, _, files in os.walk(tree):
        for name in files:
            obj = Path(directory, name)
            if not name.endswith((".o", ".obj")) or obj.resolve() in known:
                continue
            try:
                if obj.stat().st_mtime < since:
                    continue
            except OSError:  # gone meanwhile
                continue
            if _is_relocatable_object(obj) and _bitcode_digest(obj) is None:
                found.append(obj)
    return sorted(found)


def surviving(steps: list[tuple[Path, list[str], str]]) -> list[Compile]:
    """The (directory, arguments, source) compile STEPS whose object is a relocatable object
    file that survived the build, one per object: the output its arguments name, as clang
    reads them (mlgo.llvm.driver); a `cc -c dir/x.c` without `-o` writes x.o in its working
    directory. An object its source was compiled to twice (with other flags
    the second time) holds the last compile's bitcode, and is one module; one that several
    sources claim (a compile-and-link step's program) is none."""
    compiles: dict[Path, Compile] = {}
    sources: dict[Path, set[Path]] = {}
    for directory, args, file in steps:
        source = directory / file
        if (output := named_output(args)) is not None:
            obj = directory / output
        elif "-c" in args:
            obj = directory / source.with_suffix(".o").name
        else:
            continue
        compiles[obj] = Compile(source, obj)
        sources.setdefault(obj, set()).add(source)
    return [
        c for c in compiles.values() if len(sources[c.obj]) == 1 and _is_relocatable_object(c.obj)
    ]


def _extracted_modules(corpus_dir: Path) -> list[str]:
    """The modules whose bitcode was really extracted (extract_ir lists failures too)."""
    desc = corpus_dir / DESCRIPTION
    return [
        n for n in read_json(desc, CorpusError)["modules"] if (corpus_dir / f"{n}.bc").is_file()
    ]


def combine(out: Path) -> list[str]:
    """Writes OUT's corpus_description.json over every package sub-corpus in OUT (all from
    one stage of the build: per file or at the link)."""
    names: list[str] = []
    stages: dict[str, str] = {}
    for desc in sorted(out.glob(f"*/{DESCRIPTION}")):
        pkg = desc.parent.name
        if pkg.startswith("."):
            continue
        try:
            names += [f"{pkg}/{m}" for m in read_json(desc, CorpusError)["modules"]]
        except (KeyError, TypeError) as e:
            raise CorpusError(f"{desc}: malformed ({e})") from e
        stages[pkg] = read_stage(desc.parent)
    if len(set(stages.values())) > 1:
        raise CorpusError(f"{out}: its packages come from different stages: {stages}")
    write_description(out, names, next(iter(stages.values()), "compile"))
    return names
