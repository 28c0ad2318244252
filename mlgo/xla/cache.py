"""The persistent tuning cache: a config chosen once is reused by every later process.

As XLA's own autotuning cache, a choice is keyed by what is compiled and where: the
optimized HLO's fingerprint, the jaxlib version and the CPU (its model name and the cores
this process may use, since XLA's default spreads over them), and by the tuner that chose
it (the cost model and the verification mode). Finding the optimized HLO takes a
compilation, so each lowered program (StableHLO fingerprint) also records which optimized
HLO it became: a later process goes from the lowering that jax.jit does anyway to the
choice without compiling anything.

Layout, under `$XDG_CACHE_HOME/mlgo` or `~/.cache/mlgo` unless another root is given:
    xla-tuning/MACHINE/lowered/STABLEHLO.json   {"hlo": OPTIMIZED}
    xla-tuning/MACHINE/OPTIMIZED-TUNER.json     {"config": ..., "ranking": [...], ...}
Every file is written atomically; an unreadable one is ignored with one warning line (and
replaced when the program is tuned again). A key that is not a fingerprint as `digest()` makes
them (16 lowercase hex digits) is refused the same way, so a crafted entry such as
`{"hlo": "../../x"}` can never name a file outside the cache.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import re
from pathlib import Path
from typing import Any

from mlgo.runtime.files import atomic_write_text
from mlgo.runtime.inputs import read_json
from mlgo.xla.config import parse_config

log = logging.getLogger(__name__)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def digest(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


_FINGERPRINT = re.compile(f"[0-9a-f]{{{len(digest(None))}}}")


def is_fingerprint(key: object) -> bool:
    """Whether a key may become part of a cache file's name: only what digest() produces."""
    return isinstance(key, str) and _FINGERPRINT.fullmatch(key) is not None


class TuningCache:
    def __init__(self, root: Path) -> None:
        import jaxlib

        self.machine = {
            "jaxlib": jaxlib.__version__,
            "cpu": cpu_model(),
            "cores": len(os.sched_getaffinity(0)),
        }
        self.dir = root / "xla-tuning" / digest(self.machine)

    def _read(self, path: Path) -> dict | None:
        try:
            data = read_json(path)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            log.warning("tuned_jit: ignoring unreadable tuning cache file %s (%s)", path, e)
            return None
        if not isinstance(data, dict):
            log.warning("tuned_jit: ignoring unreadable tuning cache file %s (not an object)", path)
            return None
        return data

    def _write(self, path: Path, data: dict) -> None:
        try:
            atomic_write_text(path, json.dumps(data, indent=1))
        except OSError as e:  # a read-only or full cache costs a re-tune, not the call
            log.warning("tuned_jit: cannot write the tuning cache file %s (%s)", path, e)

    def _keys_ok(self, what: str, **keys: str) -> bool:
        """Whether every key is a fingerprint; if not, one warning line says which."""
        bad = [f"{name} {key!r}" for name, key in keys.items() if not is_fingerprint(key)]
        if bad:
            log.warning("tuned_jit: %s (%s is not a fingerprint)", what, ", ".join(bad))
        return not bad

    def optimized(self, lowered: str) -> str | None:
        """The optimized HLO fingerprint a lowered program was found to have, if known."""
        if not self._keys_ok("ignoring a tuning cache lookup", lowered=lowered):
            return None
        path = self.dir / "lowered" / f"{lowered}.json"
        data = self._read(path)
        hlo = data.get("hlo") if data else None
        if hlo is None:
            return None
        if not self._keys_ok(f"ignoring unreadable tuning cache file {path}", hlo=hlo):
            return None
        return hlo

    def choice(self, hlo: str, tuner: str) -> dict | None:
        """The choice made for this optimized HLO by this tuner, if any (and well-formed)."""
        if not self._keys_ok("ignoring a tuning cache lookup", hlo=hlo, tuner=tuner):
            return None
        path = self.dir / f"{hlo}-{tuner}.json"
        data = self._read(path)
        if data is None:
            return None
        try:
            if not isinstance(data.get("config"), str):
                raise ValueError("no config")
            parse_config(data["config"])
        except ValueError as e:
            log.warning("tuned_jit: ignoring unreadable tuning cache file %s (%s)", path, e)
            return None
        return data

    def store(self, lowered: str, hlo: str, tuner: str, choice: dict) -> None:
        keys = {"lowered": lowered, "hlo": hlo, "tuner": tuner}
        if not self._keys_ok("cannot write the tuning cache", **keys):
            return
        self._write(self.dir / f"{hlo}-{tuner}.json", {**choice, **self.machine, "hlo": hlo})
        self._write(self.dir / "lowered" / f"{lowered}.json", {"hlo": hlo})
