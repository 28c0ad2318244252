"""Native code size of an object: the bytes of its executable sections."""

from __future__ import annotations

from pathlib import Path

from elftools.common.exceptions import ELFError
from elftools.elf.constants import SH_FLAGS
from elftools.elf.elffile import ELFFile


def text_size(path: str | Path) -> int:
    """Sum of SHF_ALLOC|SHF_EXECINSTR sections (.text and .text.* with -ffunction-sections)."""
    want = SH_FLAGS.SHF_ALLOC | SH_FLAGS.SHF_EXECINSTR
    try:
        with open(path, "rb") as f:
            return sum(
                s["sh_size"] for s in ELFFile(f).iter_sections() if s["sh_flags"] & want == want
            )
    except ELFError as e:
        raise ValueError(f"{path}: not an ELF object ({e})") from e
