"""A corpus: pre-optimization bitcode modules and the cc1 command lines that finish them.

The on-disk layout is ml-compiler-opt's, so corpora move freely between the two tools:
`corpus_description.json` = {"has_thinlto": false, "modules": [NAME, ...]} (optionally
"global_command_override", and mlgo's "stage": "link" for the merged modules of full-LTO
links, "thin-link" for ThinLTO backends' modules, `mlgo.problems.STAGES`), and per module
`NAME.bc` plus `NAME.cmd`, the cc1 arguments separated by NUL bytes, as LLVM's extract_ir
writes them. A module's package is the first
component of its name (`zstd/lib/compress/zstd_compress`), which is how results are grouped
and how training and held-out sets are split.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING

from mlgo.errors import MlgoError
from mlgo.llvm.driver import suffix_language
from mlgo.problems import LTO_STAGES, STAGES
from mlgo.runtime.inputs import read_json

if TYPE_CHECKING:
    from mlgo.problems import Problem

DESCRIPTION = "corpus_description.json"

# Flags that must not survive into a re-compile: re-embedding bitcode is wasted work, and
# split-dwarf/thinlto/profile paths point into the original build tree.
_DROP = ("-fembed-bitcode=all", "-fembed-bitcode")
_DROP_WITH_VALUE = (
    "-split-dwarf-file",
    "-split-dwarf-output",
    "-fthinlto-index",
    "-fprofile-sample-use",
    "-fprofile-remapping-file",
    "-o",
    "-dependency-file",
    "-MT",
)
_DROP_JOINED = tuple(f + "=" for f in _DROP_WITH_VALUE)  # the same given as -FLAG=VALUE
_OPT_LEVEL = re.compile(r"^-O([0-3sz]|fast)?$")


class CorpusError(MlgoError, ValueError):
    """The corpus on disk is malformed; the message names the file."""


@dataclass(frozen=True)
class Module:
    name: str
    bitcode: Path
    args: tuple[str, ...]  # cc1 arguments, starting with -cc1
    # How many objects of its package define each COMDAT group (an inline or template
    # function's copy) when compiled by clang's own heuristics; empty until the default has
    # been measured (`mlgo.corpus.stats.shared_out`). Not part of what the module is.
    copies: Mapping[str, int] = field(default_factory=dict, compare=False, repr=False)

    @property
    def package(self) -> str:
        return self.name.split("/", 1)[0]

    @property
    def path(self) -> Path:
        """The file a remote worker needs (`mlgo.runtime.tasks.ShippedFile`)."""
        return self.bitcode

    def at(self, path: Path) -> Module:
        """The same module, its bitcode at PATH (a worker-local copy)."""
        return replace(self, bitcode=path)

    @property
    def opt_level(self) -> str:
        """The optimization level the module was recorded at (the last -O flag wins)."""
        levels = [a for a in self.args if _OPT_LEVEL.match(a)]
        return levels[-1] if levels else "-O0"

    @property
    def language(self) -> str | None:
        """C or C++ (`mlgo.llvm.languages`): by a C++ -std, else by the suffix of the source
        it was compiled from (cc1's -main-file-name); None when that is neither."""
        if any(a.startswith("-std=") and "++" in a for a in self.args):
            return "c++"
        names = [b for a, b in pairwise(self.args) if a == "-main-file-name"]
        return suffix_language(names[-1]) if names else None

    @property
    def profiled(self) -> bool:
        """Recorded with measured block counts (`mlgo corpus build --profile`)."""
        return any(a.startswith("-fprofile-instrument-use-path=") for a in self.args)

    def compile_command(
        self,
        clang: str,
        output: Path,
        opt_level: str | None = None,
        extra: list[str] | tuple[str, ...] = (),
    ) -> list[str]:
        """clang -cc1 ... -x ir NAME.bc -o OUTPUT. OPT_LEVEL is the level the caller needs;
        a module recorded at another one is refused, not re-leveled: clang's frontend
        already decided for that level (-Oz marks every function minsize, -O2 asks for the
        vectorizers), so a re-leveled compile is neither build."""
        if opt_level and opt_level != self.opt_level:
            raise CorpusError(
                f"{self.name}: recorded at {self.opt_level}, needed at {opt_level}; "
                f"build the corpus with `mlgo corpus build --opt-level {opt_level}`"
            )
        args: list[str] = []
        skip = False
        for a in self.args:
            if skip:
                skip = False
                continue
            if a in _DROP_WITH_VALUE:
                skip = True
                continue
            if a in _DROP or a.startswith(_DROP_JOINED):
                continue
            args.append(a)
        return [clang, *args, *extra, "-x", "ir", str(self.bitcode), "-o", str(output)]


@dataclass(frozen=True)
class Corpus:
    root: Path
    modules: tuple[Module, ...]
    stage: str = "compile"  # the step of the build its modules are from (problems.STAGES)

    def packages(self) -> dict[str, list[Module]]:
        out: dict[str, list[Module]] = {}
        for m in self.modules:
            out.setdefault(m.package, []).append(m)
        return out

    def select(self, packages: list[str] | None) -> Corpus:
        if not packages:
            return self
        unknown = set(packages) - set(self.packages())
        if unknown:
            raise CorpusError(f"{self.root}: no package(s) {', '.join(sorted(unknown))} in corpus")
        chosen = tuple(m for m in self.modules if m.package in packages)
        return replace(self, modules=chosen)

    def require(self, problem: Problem) -> Corpus:
        """This corpus, if it is from PROBLEM's stage and every module was recorded at its
        level; else one CorpusError up front, instead of one failed compile per module."""
        if self.stage != problem.stage:
            modes = {stage: f"mlgo corpus record --lto {m}" for m, stage in LTO_STAGES.items()}
            how = modes.get(problem.stage, "a build")
            raise CorpusError(
                f"{self.root}: a corpus of the {self.stage} step, and {problem.name} decides "
                f"at the {problem.stage} step; record one with `{how}`"
            )
        other = sorted({m.opt_level for m in self.modules} - {problem.opt_level})
        if other:
            raise CorpusError(
                f"{self.root}: recorded at {', '.join(other)}, needed at {problem.opt_level}; "
                f"build it with `mlgo corpus build --opt-level {problem.opt_level}`"
            )
        return self


def _read_cmd(path: Path) -> tuple[str, ...]:
    try:
        args = tuple(a for a in path.read_bytes().decode().split("\0") if a)
    except (OSError, UnicodeDecodeError) as e:
        raise CorpusError(f"{path}: cannot read command line ({e})") from e
    if not args or args[0] != "-cc1":
        raise CorpusError(f"{path}: command line does not start with -cc1")
    return args


def _check_name(desc_path: Path, name: str) -> None:
    """A module name becomes paths under the corpus and under every output directory
    (traces, evaluations): it must stay inside them."""
    if "\0" in name or any(p in ("", ".", "..") for p in name.split("/")):
        raise CorpusError(
            f"{desc_path}: module name {name!r} is not a plain relative path "
            "(no '..', '.', empty or absolute parts)"
        )


def load_corpus(root: str | Path) -> Corpus:
    """Reads and checks a corpus; every problem is reported as a CorpusError naming a file."""
    root = Path(root)
    desc_path = root / DESCRIPTION
    try:
        desc = read_json(desc_path, CorpusError)
    except FileNotFoundError as e:
        raise CorpusError(f"{desc_path}: not found (is {root} a corpus?)") from e
    except OSError as e:
        raise CorpusError(f"{desc_path}: cannot read ({e})") from e
    if not isinstance(desc, dict) or not isinstance(desc.get("modules"), list):
        raise CorpusError(f"{desc_path}: needs a 'modules' list")
    names = desc["modules"]
    if not names or not all(isinstance(n, str) and n for n in names):
        raise CorpusError(f"{desc_path}: 'modules' must be a non-empty list of names")
    seen: set[str] = set()
    for name in names:
        _check_name(desc_path, name)
        if name in seen:
            raise CorpusError(f"{desc_path}: module {name!r} is listed twice")
        seen.add(name)
    if desc.get("has_thinlto"):
        raise CorpusError(f"{desc_path}: ThinLTO corpora are not supported yet")
    stage = _stage(desc, desc_path)
    override = desc.get("global_command_override")
    if override is not None and not (
        isinstance(override, list) and all(isinstance(a, str) for a in override)
    ):
        raise CorpusError(f"{desc_path}: 'global_command_override' must be a list of strings")
    modules = []
    for name in names:
        bc = root / f"{name}.bc"
        if not bc.is_file():
            raise CorpusError(f"{bc}: listed in {DESCRIPTION} but missing")
        args = tuple(override) if override is not None else _read_cmd(root / f"{name}.cmd")
        modules.append(Module(name, bc, args))
    return Corpus(root, tuple(modules), stage)


def _stage(desc: dict, desc_path: Path) -> str:
    """The stage the description DESC (read from DESC_PATH) names, compile when none."""
    stage = desc.get("stage", "compile")
    if stage not in STAGES:
        raise CorpusError(f"{desc_path}: 'stage' must be one of {', '.join(STAGES)}, not {stage!r}")
    return stage


def read_stage(root: Path) -> str:
    """The stage a corpus description at ROOT names (compile when it names none)."""
    desc_path = root / DESCRIPTION
    try:
        desc = read_json(desc_path, CorpusError)
    except OSError as e:
        raise CorpusError(f"{desc_path}: cannot read ({e})") from e
    if not isinstance(desc, dict):
        raise CorpusError(f"{desc_path}: malformed (not a JSON object)")
    return _stage(desc, desc_path)


def write_description(root: Path, names: list[str], stage: str = "compile") -> None:
    from mlgo.runtime.files import atomic_write_text

    desc: dict = {"has_thinlto": False, "modules": sorted(names)}
    if stage != "compile":  # ml-compiler-opt reads the rest as it always has
        desc["stage"] = stage
    atomic_write_text(root / DESCRIPTION, json.dumps(desc, indent=2))
