"""The peak resident memory of a running tune, by stage (issue 74's "large projects hold").

  .venv/bin/python -m tools.bench_memory watch --pid PID --out samples.jsonl [--every 1]
  .venv/bin/python -m tools.bench_memory report --samples samples.jsonl --stages OUT/stages.json

`watch` samples the resident memory of process PID and all its descendants (`mlgo tune`,
or the `tools.bench_tune` that runs it: its workers, clang, the build) from /proc every
EVERY seconds until PID exits, a JSON line a sample. `report` gives each stage's peak, of
the whole tree and of its largest process, a sample counted in the first stage that
ended after it (`stages.json`'s `ended`).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from tools.lab.memory import Sample, peaks_by_stage, sample

app = typer.Typer(add_completion=False)
console = Console(width=120)


@app.command()
def watch(
    pid: Annotated[int, typer.Option(help="the process whose tree to sample")],
    out: Annotated[Path, typer.Option(help="append the samples here, a JSON line each")],
    every: Annotated[float, typer.Option(help="seconds between samples")] = 1.0,
) -> None:
    with out.open("a") as f:
        while Path(f"/proc/{pid}").exists():
            f.write(json.dumps(asdict(sample(pid, time.time()))) + "\n")
            f.flush()
            time.sleep(every)
    console.print(f"{pid} exited; samples in {out}")


@app.command()
def report(
    samples: Annotated[Path, typer.Option(help="what `watch` wrote")],
    stages: Annotated[Path, typer.Option(help="the tune's OUT/stages.json")],
) -> None:
    taken = [Sample(**json.loads(line)) for line in samples.read_text().splitlines() if line]
    ended = json.loads(stages.read_text()).get("ended", {})
    table = Table("stage", "samples from", "peak, whole tree (MB)", "largest process (MB)")
    for stage, s in peaks_by_stage(taken, ended).items():
        at = time.strftime("%H:%M:%S", time.localtime(s.at))
        table.add_row(stage, at, f"{s.total / 2**20:,.0f}", f"{s.largest / 2**20:,.0f}")
    console.print(table)
    console.print(f"{len(taken)} samples, {os.path.basename(samples)}")


if __name__ == "__main__":
    app()
