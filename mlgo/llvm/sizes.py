"""Native code size of an object: the bytes of its executable sections."""

from __future__ import annotations

import hashlib
import os
import re
import struct
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from elftools.common.exceptions import ELFError
from elftools.elf.constants import SH_FLAGS
from elftools.elf.elffile import ELFFile
from elftools.elf.relocation import RelocationSection

from mlgo.errors import UsageError

TEXT_FLAGS = SH_FLAGS.SHF_ALLOC | SH_FLAGS.SHF_EXECINSTR


SHT_GROUP = 17
ELF_TYPES = {0: "ET_NONE", 1: "ET_REL", 2: "ET_EXEC", 3: "ET_DYN", 4: "ET_CORE"}


def _is_text_flags(flags: int) -> bool:
    """An executable section: .text, and .text.* with -ffunction-sections."""
    return flags & TEXT_FLAGS == TEXT_FLAGS


@dataclass(frozen=True)
class _Section:
    type: int
    flags: int
    offset: int
    size: int
    link: int
    info: int
    entsize: int

    @property
    def is_text(self) -> bool:
        return _is_text_flags(self.flags)


class _Sections:
    """An ELF file's section headers, read with `struct` alone: all that its .text and
    COMDAT groups take, a few reads instead of a parse of the whole file (a search
    measures every one of its compiles). Anything that is not such a file, or ends
    before what its headers promise, is a UsageError naming it."""

    def __init__(self, f: BinaryIO, path: str | Path):
        self.f, self.path, self.size = f, path, os.fstat(f.fileno()).st_size
        ident = self._read(0, 16)
        if ident[:4] != b"\x7fELF" or ident[4] not in (1, 2) or ident[5] not in (1, 2):
            raise UsageError(f"{path}: not an ELF object (no ELF header)")
        wide, self.order = ident[4] == 2, "<" if ident[5] == 1 else ">"
        addr = "Q" if wide else "I"
        head = struct.Struct(f"{self.order}HHI{addr}{addr}{addr}IHHHHHH")
        e_type, *_, shoff, _, _, _, _, shentsize, shnum, _ = self._unpack(head, 16)
        self.type = ELF_TYPES.get(e_type, f"ET_{e_type}")
        entry = struct.Struct(self.order + ("IIQQQQIIQQ" if wide else "IIIIIIIIII"))
        self.sections: list[_Section] = []
        self._symbol = struct.Struct(f"{self.order}I")  # st_name leads in both classes
        self._strings: dict[int, bytes] = {}  # string tables read, by section
        if not shoff:
            return
        if shentsize < entry.size:
            raise UsageError(f"{path}: not an ELF object (section headers of {shentsize} bytes)")
        first = _Section(*self._pick(self._unpack(entry, shoff)))
        count = shnum or first.size  # past 0xff00 sections, section 0 holds the count
        table = self._read(shoff, count * shentsize)
        self.sections = [
            _Section(*self._pick(entry.unpack_from(table, i * shentsize))) for i in range(count)
        ]

    @staticmethod
    def _pick(raw: tuple[int, ...]) -> tuple[int, ...]:
        _, kind, flags, _, offset, size, link, info, _, entsize = raw
        return kind, flags, offset, size, link, info, entsize

    def _read(self, at: int, n: int) -> bytes:
        """N bytes at AT; the file's size is checked first, as a header can claim any."""
        if at + n > self.size:
            raise UsageError(f"{self.path}: not an ELF object (ends at byte {self.size})")
        self.f.seek(at)
        return self.f.read(n)

    def _unpack(self, s: struct.Struct, at: int) -> tuple:
        return s.unpack(self._read(at, s.size))

    def _get(self, index: int) -> _Section:
        if not 0 <= index < len(self.sections):
            raise UsageError(f"{self.path}: not an ELF object (no section {index})")
        return self.sections[index]

    def words(self, s: _Section) -> tuple[int, ...]:
        """A section's contents as 32-bit words (a group's flag, then its members)."""
        return struct.unpack(f"{self.order}{s.size // 4}I", self._read(s.offset, s.size // 4 * 4))

    def symbol_name(self, symtab: int, index: int) -> str:
        """The name of symbol INDEX of section SYMTAB (a group's signature)."""
        table = self._get(symtab)
        if not table.entsize:
            raise UsageError(f"{self.path}: not an ELF object (symbol table of 0-byte entries)")
        (name,) = self._unpack(self._symbol, table.offset + index * table.entsize)
        if table.link not in self._strings:
            strings = self._get(table.link)
            self._strings[table.link] = self._read(strings.offset, strings.size)
        strings = self._strings[table.link]
        end = strings.find(b"\0", name)
        if end < 0:
            raise UsageError(f"{self.path}: not an ELF object (a name past its table)")
        return strings[name:end].decode(errors="replace")


def _is_text(section: Any) -> bool:
    return _is_text_flags(section["sh_flags"])


def _text_and_type(path: str | Path) -> tuple[int, str]:
    """The .text bytes of an ELF file and its type (ET_REL, ET_EXEC, ET_DYN, ...)."""
    with open(path, "rb") as f:
        elf = _Sections(f, path)
        return sum(s.size for s in elf.sections if s.is_text), elf.type


def text_size(path: str | Path) -> int:
    """Sum of SHF_ALLOC|SHF_EXECINSTR sections (.text and .text.* with -ffunction-sections)."""
    return _text_and_type(path)[0]


def text_digest(path: str | Path) -> str:
    """A sha256 of every executable section's name and bytes and of the relocations
    applied to them (offset, type, symbol name, addend): two files with the same digest
    have the same machine code, whatever their other sections (debug information, symbol
    order) hold."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            sections = list(elf.iter_sections())
            texts = {i for i, s in enumerate(sections) if _is_text(s)}
            for i, section in enumerate(sections):
                if i in texts:
                    digest.update(section.name.encode() + b"\0" + section.data())
                elif isinstance(section, RelocationSection) and section["sh_info"] in texts:
                    symbols = elf.get_section(section["sh_link"])
                    for r in section.iter_relocations():
                        name = symbols.get_symbol(r["r_info_sym"]).name
                        addend = r.entry.get("r_addend", 0)
                        digest.update(
                            f"{r['r_offset']} {r['r_info_type']} {name} {addend}\n".encode()
                        )
    except ELFError as e:
        raise UsageError(f"{path}: not an ELF object ({e})") from e
    return digest.hexdigest()


def function_sizes(path: str | Path) -> dict[str, int]:
    """The bytes of each function PATH defines (its symbol's size, in an executable
    section): what a change of .text is made of, function by function. A local name
    defined twice counts once per definition, summed."""
    try:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            symbols = elf.get_section_by_name(".symtab")
            sizes: dict[str, int] = defaultdict(int)
            for sym in symbols.iter_symbols() if symbols is not None else ():
                index = sym["st_shndx"]
                if sym["st_info"]["type"] != "STT_FUNC" or not isinstance(index, int):
                    continue
                if _is_text(elf.get_section(index)):
                    sizes[sym.name] += sym["st_size"]
            return dict(sizes)
    except ELFError as e:
        raise UsageError(f"{path}: not an ELF object ({e})") from e


@dataclass(frozen=True)
class TextParts:
    """An object's executable bytes: its own, and those in each COMDAT group by the group's
    signature (a C++ inline or template function's copy, which the linker keeps once for
    all the objects that define it)."""

    own: int
    shared: dict[str, int]


GRP_COMDAT = 1


def text_parts(path: str | Path) -> TextParts:
    """PATH's .text split into its own bytes and its COMDAT groups' bytes."""
    with open(path, "rb") as f:
        elf = _Sections(f, path)
        group_of: dict[int, str] = {}
        for s in elf.sections:
            if s.type != SHT_GROUP:
                continue
            words = elf.words(s)
            if words and words[0] & GRP_COMDAT:
                group_of.update(dict.fromkeys(words[1:], elf.symbol_name(s.link, s.info)))
        own, shared = 0, defaultdict(int)
        for i, s in enumerate(elf.sections):
            if s.is_text:
                if i in group_of:
                    shared[group_of[i]] += s.size
                else:
                    own += s.size
        return TextParts(own, dict(shared))


def text_once(parts: TextParts, copies: Mapping[str, int]) -> float:
    """PARTS' .text with each COMDAT group's bytes divided by COPIES[group], the objects
    of its package that define it (1 where none does): summed over a package, each inline
    or template function counts about once, as the package's link keeps one copy of it."""
    return parts.own + sum(size / max(copies.get(s, 1), 1) for s, size in parts.shared.items())


# The measurement MLGO_GUARD=size compares (mlgo.serve.guard): an object's whole .text.
GUARD_METRIC = "text_size"


def text_metrics(obj: Path, _workdir: Path, copies: Mapping[str, int]) -> dict[str, float]:
    """An object's .text bytes as measurements: all of them ("text_size", what
    `mlgo corpus stats` records and the guard compares) and with its inline functions'
    copies shared out among the package's objects ("text_once", what inlining rewards)."""
    parts = text_parts(obj)
    return {
        GUARD_METRIC: float(parts.own + sum(parts.shared.values())),
        "text_once": text_once(parts, copies),
    }


@dataclass(frozen=True)
class SizeRow:
    path: str
    baseline: int
    build: int
    linked: bool = False  # a program or shared library, not an object file

    @property
    def delta_pct(self) -> float:
        return 100 * (self.build / self.baseline - 1) if self.baseline else 0.0


LINKED = ("ET_EXEC", "ET_DYN")  # programs (PIE ones are ET_DYN) and shared libraries


def elf_texts(root: Path) -> dict[str, tuple[int, bool]]:
    """Every ELF file under ROOT: its .text and whether it is linked."""
    sizes = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            with open(path, "rb") as f:
                if f.read(4) != b"\x7fELF":
                    continue
            text, kind = _text_and_type(path)
            sizes[str(path.relative_to(root))] = (text, kind in LINKED)
    return sizes


# a build system's hash of its compiler and flags in a directory name (zstd's objects are in
# obj/conf_<md5>/), which differs between two builds made with different compilers
CONFIG_HASH = re.compile(r"[0-9a-f]{16,}")


def _pair_hashed(ours: dict[str, Any], theirs: dict[str, Any]) -> None:
    """Files that only one tree has under their own path are paired under their path with
    CONFIG_HASH masked, where that names exactly one file in each tree."""

    def alone(sizes: dict[str, Any], other: dict[str, Any]) -> dict[str, str]:
        masked = defaultdict(list)
        for path in sizes.keys() - other.keys():
            masked[CONFIG_HASH.sub("*", path)].append(path)
        return {m: paths[0] for m, paths in masked.items() if len(paths) == 1}

    mine, yours = alone(ours, theirs), alone(theirs, ours)
    for m in mine.keys() & yours.keys():
        ours[m], theirs[m] = ours.pop(mine[m]), theirs.pop(yours[m])


def compare_trees(build: Path, baseline: Path) -> list[SizeRow]:
    """The .text of every ELF file (object, library, program) present in both trees; a
    directory named by a configuration hash matches its counterpart in the other tree."""
    for tree in (build, baseline):
        if not tree.is_dir():
            raise UsageError(f"{tree}: not a directory")
    ours, theirs = elf_texts(build), elf_texts(baseline)
    _pair_hashed(ours, theirs)
    common = sorted(set(ours) & set(theirs))
    if not common:
        raise UsageError(f"no ELF file is in both {build} and {baseline}")
    return [SizeRow(p, theirs[p][0], ours[p][0], theirs[p][1]) for p in common]


def linked_rows(rows: list[SizeRow]) -> list[SizeRow]:
    """The programs and shared libraries of ROWS: what ships, after the linker has merged
    the objects' duplicate template and inline functions."""
    return [r for r in rows if r.linked]


def tree_totals(rows: list[SizeRow]) -> dict[str, float]:
    """Both trees' .text summed over ROWS, and the change in percent."""
    base, build = sum(r.baseline for r in rows), sum(r.build for r in rows)
    return {"baseline": base, "build": build, "delta_pct": SizeRow("", base, build).delta_pct}


def tree_report(rows: list[SizeRow]) -> dict:
    """What `mlgo report --json` writes for two build trees."""
    return {"files": [r.__dict__ for r in rows], "total": tree_totals(rows)}
