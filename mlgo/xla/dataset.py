"""The measured dataset: one JSON file per program plus a manifest, versioned.

Layout of a dataset directory:
    manifest.json        {"format": "mlgo-xla-runs", "version": 1, "configs": [...],
                          "jax": "...", "measure": {...}, "failed": {name: reason}}
    programs/NAME.json   graph, fingerprint, family, held_out, runs[config] with
                         median_us, spread, rounds_kept, halves_us, compile_s, measure_s
                         (or an error)

Every file is written atomically; `collect` skips programs already measured with the same
configs, so an interrupted collection resumes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import jax
from rich.progress import Progress

from mlgo.errors import MlgoError
from mlgo.runtime.files import atomic_write_text
from mlgo.runtime.inputs import read_json
from mlgo.xla.config import parse_config
from mlgo.xla.extract import HloGraph
from mlgo.xla.measure import MeasureSpec, measure_isolated
from mlgo.xla.programs import Program

FORMAT = "mlgo-xla-runs"
VERSION = 1


class DatasetError(MlgoError, ValueError):
    pass


@dataclass
class Record:
    name: str
    family: str
    held_out: bool
    fingerprint: str
    graph: HloGraph
    runs: dict[str, dict]

    def times(self) -> dict[str, float]:
        """Median runtime (µs) of every config that compiled and ran."""
        return {c: r["median_us"] for c, r in self.runs.items() if r.get("status") == "ok"}

    def halves(self) -> tuple[dict[str, float], dict[str, float]] | None:
        """Two independent medians per config (even and odd rounds), if measured."""
        ok = {c: r["halves_us"] for c, r in self.runs.items() if "halves_us" in r}
        if not ok or set(ok) != set(self.times()):
            return None
        return {c: h[0] for c, h in ok.items()}, {c: h[1] for c, h in ok.items()}

    def exhaustive_seconds(self) -> float:
        """What exhaustive autotuning cost: every config compiled and measured."""
        return sum(r.get("compile_s", 0.0) + r.get("measure_s", 0.0) for r in self.runs.values())

    def to_json(self) -> dict:
        d = asdict(self)
        d["graph"] = self.graph.to_json()
        return d


def _record(data: dict, where: Path) -> Record:
    try:
        return Record(
            data["name"],
            data["family"],
            bool(data["held_out"]),
            data["fingerprint"],
            HloGraph.from_json(data["graph"]),
            data["runs"],
        )
    except (KeyError, TypeError) as e:
        raise DatasetError(f"{where}: not a program record ({e})") from e


@dataclass
class Dataset:
    root: Path
    configs: list[str]
    records: list[Record]

    def split(self, held_out: bool) -> list[Record]:
        return [r for r in self.records if r.held_out == held_out]


def load_dataset(root: Path) -> Dataset:
    manifest_path = root / "manifest.json"
    if not manifest_path.is_file():
        raise DatasetError(f"{root}: not a dataset (no manifest.json; run `mlgo xla collect`)")
    manifest = read_json(manifest_path, DatasetError)
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise DatasetError(
            f"{manifest_path}: format {manifest.get('format')} v{manifest.get('version')}, "
            f"expected {FORMAT} v{VERSION}"
        )
    records = [
        _record(read_json(p, DatasetError), p) for p in sorted((root / "programs").glob("*.json"))
    ]
    if not records:
        raise DatasetError(f"{root}: no measured programs")
    configs = [c for c in manifest["configs"] if _usable(c)]
    for r in records:
        r.runs = {c: run for c, run in r.runs.items() if c in configs}
    return Dataset(root, configs, records)


def _usable(config: str) -> bool:
    """Configs measured earlier that validation now refuses are left out of the dataset."""
    try:
        parse_config(config)
    except ValueError:
        return False
    return True


def collect(
    corpus: Path,
    programs: list[Program],
    configs: list[str],
    out: Path,
    spec: MeasureSpec,
    timeout: float = 600.0,
) -> Iterator[tuple[str, str | None]]:
    """Measures every program not yet in `out`; yields (name, error or None) as it goes."""
    manifest_path = out / "manifest.json"
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "configs": configs,
        "jax": jax.__version__,
        "measure": asdict(spec),
        "failed": {},
    }
    if manifest_path.exists():
        old = read_json(manifest_path, DatasetError)
        if old.get("configs") != configs or old.get("version") != VERSION:
            raise DatasetError(f"{out}: measured with other configs; use a new --out")
        manifest["failed"] = old.get("failed", {})
    atomic_write_text(manifest_path, json.dumps(manifest, indent=1))
    todo = [p for p in programs if not (out / "programs" / f"{p.name}.json").exists()]
    with Progress(transient=True) as progress:
        task = progress.add_task("measuring", total=len(todo))
        for p in todo:
            progress.update(task, description=f"measuring {p.name}")
            try:
                data = measure_isolated(f"{corpus}:{p.name}", configs, spec, timeout)
            except RuntimeError as e:
                manifest["failed"][p.name] = str(e)
                atomic_write_text(manifest_path, json.dumps(manifest, indent=1))
                yield p.name, str(e)
            else:
                manifest["failed"].pop(p.name, None)
                atomic_write_text(out / "programs" / f"{p.name}.json", json.dumps(data))
                atomic_write_text(manifest_path, json.dumps(manifest, indent=1))
                yield p.name, None
            progress.advance(task)
