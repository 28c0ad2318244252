"""`mlgo xla ...`: collect measurements, train the cost model, tune a program, report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from mlgo.errors import UsageError
from mlgo.options import MOST_ROUNDS, MOST_SECONDS, MOST_STEPS, MOST_UNITS, positive, positive_up_to

MOST_ENSEMBLE = 64  # networks averaged: each trains in full
MOST_FOLDS = 100  # cross-validation folds: each trains in full

xla_app = typer.Typer(
    help="XLA:CPU GEMM configs (default path, Eigen, LLVM-IR tiles) chosen by a learned "
    "cost model.",
    no_args_is_help=True,
)
console = Console(soft_wrap=True)  # a path or a count never breaks a line
err = Console(stderr=True, soft_wrap=True)


@xla_app.command("collect")
def collect_cmd(
    programs: Annotated[Path, typer.Option(help="program corpus directory")] = Path("corpus/xla"),
    out: Annotated[Path, typer.Option(help="dataset directory (resumed if it exists)")] = Path(
        "data/xla-runs"
    ),
    configs: Annotated[str, typer.Option(help="comma-separated configs (default: all)")] = "",
    only: Annotated[str, typer.Option(help="comma-separated program names")] = "",
    rounds: Annotated[
        int, typer.Option(help="interleaved timing rounds per config", min=1, max=MOST_ROUNDS)
    ] = 20,
    timeout: Annotated[
        float, typer.Option(help="seconds per program", callback=positive_up_to(MOST_SECONDS))
    ] = 600.0,
) -> None:
    """Compile and time every program with every config, each program in its own worker."""
    from mlgo.xla.config import SEARCH_SPACE, parse_config
    from mlgo.xla.dataset import collect
    from mlgo.xla.measure import MeasureSpec
    from mlgo.xla.programs import load_corpus

    chosen = [c for c in configs.split(",") if c] or list(SEARCH_SPACE)
    for c in chosen:
        parse_config(c)
    if "default" not in chosen:
        raise UsageError("--configs must include 'default' (the baseline)")
    selected = load_corpus(programs)
    if only:
        names = set(only.split(","))
        unknown = names - {p.name for p in selected}
        if unknown:
            raise UsageError(f"--only: no program {sorted(unknown)[0]!r} in {programs}")
        selected = [p for p in selected if p.name in names]
    failed = 0
    for name, error in collect(programs, selected, chosen, out, MeasureSpec(rounds=rounds),
                               timeout):  # fmt: skip
        if error:
            failed += 1
            err.print(f"[red]failed[/red] {error}", highlight=False)
        else:
            console.print(f"measured {name}", highlight=False)
    console.print(f"{out}: {len(selected) - failed} programs x {len(chosen)} configs")
    if failed:
        raise typer.Exit(1)


@xla_app.command("train")
def train_cmd(
    data: Annotated[Path, typer.Option(help="dataset from `mlgo xla collect`")],
    out: Annotated[Path, typer.Option(help="where the model goes")],
    steps: Annotated[int, typer.Option(help="optimizer steps", min=1, max=MOST_STEPS)] = 400,
    seed: Annotated[int, typer.Option(help="initialization seed")] = 0,
    hidden: Annotated[int, typer.Option(help="hidden units", min=1, max=MOST_UNITS)] = 64,
    ensemble: Annotated[
        int,
        typer.Option(help="networks averaged (seeds seed, seed+1, ...)", min=1, max=MOST_ENSEMBLE),
    ] = 1,
    lr: Annotated[float, typer.Option(help="Adam learning rate", callback=positive)] = 3e-3,
    loss: Annotated[str, typer.Option(help="ranking loss: pairwise or listwise")] = "pairwise",
    folds: Annotated[
        int,
        typer.Option(
            help="k-fold cross-validation over the training programs (fits the default margin)",
            min=2,
            max=MOST_FOLDS,
        ),
    ] = 4,
    cv_only: Annotated[bool, typer.Option(help="print the cross-validation figures only")] = False,
) -> None:
    """Train the GNN cost model on the non-held-out programs with a ranking loss; the
    default margin is fitted on out-of-fold scores, never on held-out programs."""
    from mlgo.xla.dataset import load_dataset
    from mlgo.xla.model import CostModel, Hyper, out_of_fold_scores, train
    from mlgo.xla.report import best_fixed_config, evaluate, fit_default_margin, summary

    ds = load_dataset(data)
    train_set = ds.split(held_out=False)
    if not train_set:
        raise UsageError(f"{data}: every program is held out; nothing to train on")
    hyper = Hyper(hidden=hidden, steps=steps, lr=lr, seed=seed, ensemble=ensemble, loss=loss)
    graphs, times = [r.graph for r in train_set], [r.times() for r in train_set]
    fixed = best_fixed_config(train_set, ds.configs)
    with err.status(f"{folds}-fold cross-validation on {len(train_set)} programs"):
        oof = out_of_fold_scores(graphs, times, ds.configs, hyper, folds)
    # Picks from out-of-fold scores need only the configs and the margin, not the networks.
    picker = CostModel([], ds.configs, hyper, {})
    margin = fit_default_margin(train_set, picker, oof)
    cv_rows = evaluate(train_set, picker, fixed, oof)
    cv = summary(cv_rows)
    worst = sorted(cv_rows, key=lambda r: r.kendall_tau)[:5]
    console.print(
        "lowest out-of-fold tau (repeat tau): "
        + ", ".join(f"{r.program} {r.kendall_tau:.2f} ({r.repeat_tau:.2f})" for r in worst),
        highlight=False,
    )
    console.print(
        f"cross-validation ({folds} folds, {hyper}): Kendall tau (median) "
        f"{cv['kendall_tau_median']:.3f}, top-1 gap {cv['top1_gap_median']:+.1%}, top-5 gap "
        f"{cv['top5_gap_median']:+.1%}, pick vs default {cv['speedup_vs_default_geomean']:.3f}x "
        f"(worst {cv['worst_vs_default']:.3f}x) with default margin {margin}"
    )
    if cv_only:
        return
    with err.status(f"training on {len(train_set)} programs"):
        model, losses = train(graphs, times, ds.configs, hyper)
    model.info = {
        "default_margin": margin,
        "dataset": data.name,
        "train_programs": [r.name for r in train_set],
        "held_out_programs": [r.name for r in ds.split(held_out=True)],
        "best_fixed_config": fixed,
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "cv_folds": folds,
        "cv": cv,
    }
    model.save(out)
    console.print(
        f"{out}: ranking loss {losses[0]:.4f} -> {losses[-1]:.4f}, best fixed config {fixed}"
    )


def _rows_table(rows, title: str) -> Table:
    table = Table("program", "chosen", "vs default", "vs best", "vs fixed", "tau",
                  "exhaustive", title=title)  # fmt: skip
    for r in rows:
        table.add_row(
            r.program, r.chosen, f"{r.vs_default:.2f}x", f"{r.top1_gap:+.1%}",
            f"{r.vs_fixed:.2f}x", f"{r.kendall_tau:.2f}", f"{r.exhaustive_s:.1f} s",
        )  # fmt: skip
    return table


@xla_app.command("report")
def report_cmd(
    data: Annotated[Path, typer.Option(help="dataset from `mlgo xla collect`")],
    model: Annotated[Path, typer.Option(help="model from `mlgo xla train`")],
    split: Annotated[str, typer.Option(help="held-out, train or all")] = "held-out",
    plot: Annotated[Path | None, typer.Option(help="write a bar chart (PNG)")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="write rows and totals")] = None,
) -> None:
    """Per program: the model's pick vs default, exhaustive best and best fixed config."""
    from mlgo.runtime.files import atomic_write_text
    from mlgo.xla.dataset import load_dataset
    from mlgo.xla.model import CostModel
    from mlgo.xla.report import best_fixed_config, evaluate, summary, to_json
    from mlgo.xla.report import plot as draw

    ds = load_dataset(data)
    splits = {"held-out": ds.split(True), "train": ds.split(False), "all": ds.records}
    if split not in splits:
        raise UsageError(f"--split {split!r}: use held-out, train or all")
    if not splits[split]:
        raise UsageError(f"{data}: no {split} programs")
    cm = CostModel.load(model)
    fixed = cm.info.get("best_fixed_config") or best_fixed_config(ds.split(False), ds.configs)
    rows = evaluate(splits[split], cm, fixed)
    console.print(_rows_table(rows, f"{model} on {data} ({split}; fixed config {fixed})"))
    totals = summary(rows)
    for k, v in totals.items():
        console.print(f"{k}: {v:.4g}" if isinstance(v, float) else f"{k}: {v}")
    if plot:
        draw(rows, plot)
        console.print(f"wrote {plot}")
    if json_out:
        atomic_write_text(json_out, json.dumps({"rows": to_json(rows), "summary": totals},
                                               indent=1))  # fmt: skip
        console.print(f"wrote {json_out}")


@xla_app.command("tune")
def tune_cmd(
    target: Annotated[str, typer.Argument(help="FILE.py:FUNCTION (or CORPUS_DIR:PROGRAM)")],
    model: Annotated[Path, typer.Option(help="cost model directory")] = Path(
        "policies/xla-gemm-tile"
    ),
    top_k: Annotated[
        int,
        typer.Option(
            help="candidates from the model (> 1 implies --verify)", min=1, max=MOST_ROUNDS
        ),
    ] = 1,
    verify: Annotated[
        bool, typer.Option(help="time the candidates against the default before choosing")
    ] = False,
    measure: Annotated[bool, typer.Option(help="time the pick against default")] = True,
) -> None:
    """Pick the config for one program with the model; report it against XLA's default."""
    import time

    from mlgo.xla.config import DEFAULT
    from mlgo.xla.measure import MeasureSpec, measure_isolated
    from mlgo.xla.model import CostModel
    from mlgo.xla.programs import example_inputs, load_target
    from mlgo.xla.tune import choose

    program = load_target(target)
    cm = CostModel.load(model)
    start = time.perf_counter()
    from mlgo.xla.extract import extract_graph, lower

    lowered = lower(program)
    args = tuple(example_inputs(program))
    choice = choose(lowered, extract_graph(lowered), cm, top_k, args, {}, verify)
    tuning_s = time.perf_counter() - start
    console.print(f"{program.name}: chose {choice.config} in {tuning_s:.2f} s "
                  f"(model's order: {', '.join(choice.ranking[:5])}, ...)")  # fmt: skip
    if measure:
        configs = list(dict.fromkeys([DEFAULT, choice.config]))
        result = measure_isolated(target, configs, MeasureSpec(), 600.0)
        runs = result["runs"]
        d, c = runs[DEFAULT]["median_us"], runs[choice.config]["median_us"]
        console.print(
            f"default {d:.1f} us (spread {runs[DEFAULT]['spread']:.1%}), "
            f"{choice.config} {c:.1f} us (spread {runs[choice.config]['spread']:.1%}): "
            f"{d / c:.2f}x"
        )
