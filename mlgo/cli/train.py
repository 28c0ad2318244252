"""`mlgo collect`, `train`, `eval`, `calibrate` and `report`: traces, policies, and their
evaluation."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from mlgo.cli.options import (
    ClangOpt,
    PackagesOpt,
    PolicyOpt,
    WorkersOpt,
    console,
    err,
    own_output,
    selected,
)
from mlgo.errors import UsageError
from mlgo.llvm.toolchain import find_toolchain
from mlgo.options import MOST_MINUTES, MOST_SECONDS, MOST_STEPS, positive_up_to
from mlgo.problems import get_problem
from mlgo.problems.policy_files import load_policy
from mlgo.runtime.workers import make_workers

if TYPE_CHECKING:
    from mlgo.train.evaluate import Evaluation


def collect(
    problem: Annotated[str, typer.Option(help="inlining-size or regalloc-eviction")],
    corpus: Annotated[Path, typer.Option(help="corpus directory")],
    out: Annotated[
        Path, typer.Option(help="trace directory (resumed if it exists)", callback=own_output)
    ],
    packages: PackagesOpt = "",
    workers: WorkersOpt = "local",
    timeout: Annotated[
        float, typer.Option(help="seconds per module", callback=positive_up_to(MOST_SECONDS))
    ] = 600.0,
    clang: ClangOpt = None,
) -> None:
    """Compile every module with the default heuristic and record its decisions."""
    from mlgo.traces.collect import collect as run

    spec = get_problem(problem)
    tc = find_toolchain(clang)
    chosen = selected(corpus, packages, spec)
    with closing(make_workers(workers)) as pool:
        manifest = run(spec, chosen, out, tc, pool, timeout)
    decisions = sum(m["decisions"] for m in manifest.modules.values())
    console.print(
        f"{out}: {len(manifest.modules)} modules, {decisions:,} decisions, "
        f"{len(manifest.failed)} failed"
    )
    if manifest.failed:
        raise typer.Exit(1)


def train(
    corpus: Annotated[Path, typer.Option(help="training corpus (held-out packages not in it)")],
    out: Annotated[
        Path, typer.Option(help="run directory; an existing run resumes", callback=own_output)
    ],
    algo: str = "bc",  # its help names the registered trainers (`train_command`)
    problem: Annotated[str, typer.Option(help="the decision to learn")] = "inlining-size",
    init: Annotated[
        Path | None, typer.Option(help="run or policy a search (every trainer but bc) starts from")
    ] = None,
    packages: PackagesOpt = "",
    steps: Annotated[
        int,
        typer.Option(
            help="the trainer's steps (bc: epochs, bcmax: iterations); 0: its own number, or "
            "with --minutes as many as the time allows",
            min=0,
            max=MOST_STEPS,
        ),
    ] = 0,
    minutes: Annotated[
        float,
        typer.Option(
            help="a search's budget: stop between steps after this much training, over all "
            "resumes (0: no limit), or before a BC-Max search that would end past it; the "
            "best policy so far is kept",
            callback=positive_up_to(MOST_MINUTES, zero=True),
        ),
    ] = 0.0,
    workers: WorkersOpt = "local",
    clang: ClangOpt = None,
    **trainer_options: Any,
) -> None:
    """Train a policy; prints its size change on the training corpus."""
    from mlgo.train.registry import get_trainer
    from mlgo.train.run import TrainOptions, load_start, run

    spec = get_problem(problem)
    tc = find_toolchain(clang)
    chosen = selected(corpus, packages, spec)  # every input is checked before OUT is made
    # the start is read once, here: the run trains from it as loaded
    start = load_start(init, spec) if init and get_trainer(algo).uses_start else None
    opts = TrainOptions(steps=steps, max_seconds=60 * minutes, init=init, trainer=trainer_options)
    with closing(make_workers(workers)) as pool:
        result = run(algo, chosen, spec, out, tc, pool, opts, start=start)
    if result.left_out:
        err.print(f"[yellow]{result.left_out} modules failed to compile and are left out")
    if result.accuracy:
        acc = result.accuracy
        console.print(
            f"BC accuracy on {result.decisions:,} default decisions: {acc['accuracy']:.4f}"
            + "".join(f", {k} {v:.3f}" for k, v in acc.items() if k != "accuracy")
        )
    t = result.evaluation.totals()
    console.print(
        f"{out / 'policy'}: training corpus {spec.reward_metric} {t['delta']:+.2%} vs "
        f"the default at {spec.opt_level} ({t['modules']} modules)"
    )


def train_command() -> Callable[..., None]:
    """`train` with a flag for each registered trainer's option (`registry.options`), after
    the run's own: a new trainer brings its flags with it."""
    from mlgo.train.registry import options, trainers

    *others, last = trainers()
    algo = Annotated[str, typer.Option(help=f"{', '.join(others)} or {last}")]
    own = inspect.signature(train, eval_str=True).parameters.values()
    fixed = [
        p.replace(annotation=algo) if p.name == "algo" else p
        for p in own
        if p.kind is not inspect.Parameter.VAR_KEYWORD
    ]
    at = [p.name for p in fixed].index("workers")
    derived = [
        inspect.Parameter(
            o.name,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            default=o.default,
            annotation=Annotated[
                o.type, typer.Option(help=o.help, min=o.min, max=o.max, callback=o.check)
            ],
        )
        for o in options().values()
    ]

    def command(**given: Any) -> None:
        train(**given)

    functools.update_wrapper(command, train)
    command.__signature__ = inspect.Signature([*fixed[:at], *derived, *fixed[at:]])  # type: ignore[attr-defined]
    return command


def eval_cmd(
    policy: PolicyOpt,
    corpus: Annotated[Path, typer.Option(help="corpus to compile, e.g. held-out packages")],
    out: Annotated[
        Path | None, typer.Option(help="where eval.json goes", callback=own_output)
    ] = None,
    packages: PackagesOpt = "",
    allow_failures: Annotated[
        bool, typer.Option(help="exit 0 even when some modules failed to compile")
    ] = False,
    workers: WorkersOpt = "local",
    clang: ClangOpt = None,
) -> None:
    """Compile a corpus with a policy and with the default; per-module and total deltas.
    Exits 1 when any module failed (its total leaves it out), unless --allow-failures."""
    from mlgo.ship.plugin import inliner_plugin
    from mlgo.train import policy_dir
    from mlgo.train.evaluate import evaluate, linked_evaluation

    tc = find_toolchain(clang)
    pdir = policy_dir(policy)
    loaded = load_policy(pdir)
    chosen = selected(corpus, packages, loaded.problem)
    with closing(make_workers(workers)) as pool:
        ev = evaluate(loaded, chosen, tc, pool, loaded.problem)
    dest, title = out or pdir.parent / f"eval-{corpus.name}", f"{pdir} on {corpus}"
    _saved(ev, dest, title, "modules")
    if loaded.guard:  # as it is served: each object the smaller of the two
        _saved(ev.guarded(), dest / "guarded", f"{title}, as the size guard serves it", "modules")
    if chosen.stage != "compile":  # what the link keeps, as lld's LTO makes it
        linked = linked_evaluation(loaded.problem, inliner_plugin(loaded, tc), chosen, tc)
        _saved(linked, dest / "linked", f"{title}, linked by lld's LTO", "programs")
    for name, msg in ev.failed.items():
        err.print(f"[red]failed[/red] {name}: {msg}", highlight=False)
    if ev.failed:
        err.print(f"{len(ev.failed)} of {len(chosen.modules)} modules failed", highlight=False)
        if not allow_failures:
            raise typer.Exit(1)


def _saved(ev: Evaluation, dest: Path, title: str, counted: str) -> None:
    """EV written to DEST/eval.json and shown (`_eval_table`)."""
    ev.save(dest)
    console.print(_eval_table(ev, title, counted))
    console.print(f"wrote {dest / 'eval.json'}")


def _eval_table(ev: Evaluation, title: str, counted: str) -> Table:
    """EV per package and in total: the default's metric, the policy's, the change; and the
    change in every other metric both sides measured (inlining: the objects' whole .text)."""
    m, others = ev.metric, ev.metrics[1:]
    table = Table(
        "package", counted, f"default {m}", f"policy {m}", "change",
        *(f"change, {o}" for o in others), title=title,
    )  # fmt: skip
    total = "[bold]total"
    rows = {o: {**ev.per_package(o), total: ev.totals(o)} for o in (m, *others)}
    for pkg in [*sorted(rows[m].keys() - {total}), total]:
        r, bold = rows[m][pkg], "[bold]" if pkg == total else ""
        table.add_row(
            pkg, str(r["modules"]), f"{r[f'default_{m}']:,.0f}", f"{r[m]:,.0f}",
            f"{bold}{r['delta']:+.2%}", *(f"{rows[o][pkg]['delta']:+.2%}" for o in others),
        )  # fmt: skip
    return table


def calibrate(
    policy: PolicyOpt,
    corpus: Annotated[Path, typer.Option(help="validation corpus: packages it did not train on")],
    out: Annotated[
        Path, typer.Option(help="where the calibrated policy goes", callback=own_output)
    ],
    packages: PackagesOpt = "",
    guard: Annotated[
        bool,
        typer.Option(
            help="judge each threshold as MLGO_GUARD=size serves it (each object the smaller"
            " of the policy's and the default's); the policy then asks to be guarded"
        ),
    ] = False,
    workers: WorkersOpt = "local",
    clang: ClangOpt = None,
) -> None:
    """Sweep the policy's departure threshold on a validation corpus and keep the one that
    shrinks it most with no package larger than clang's default (1: never depart); with C and
    C++ in the corpus, also for the policy answering one language alone."""
    from mlgo.llvm.languages import label
    from mlgo.train import policy_dir
    from mlgo.train.calibrate import calibrate_policy

    tc = find_toolchain(clang)
    pdir = policy_dir(policy)
    chosen = selected(corpus, packages, load_policy(pdir).problem)
    with closing(make_workers(workers)) as pool:
        cal = calibrate_policy(pdir, chosen, tc, pool, out, guard="size" if guard else None)
    title = f"{pdir} on {corpus}" + (", as the size guard serves it" if guard else "")
    table = Table("threshold", "answers", "change", "packages larger", title=title)
    for r in cal.sweep:
        failed = f" ({len(r['failed'])} modules failed)" if r["failed"] else ""
        for who, judged in [("all", r), *r.get("by_language", {}).items()]:
            larger = ", ".join(judged["packages_larger"]) or "-"
            answers = label(who) + " alone" if who != "all" else "all"
            table.add_row(
                f"{r['threshold']:g}", answers, f"{judged['change']:+.3%}", larger + failed
            )
    console.print(table)
    if not cal.safe:
        err.print("no threshold kept every package no larger: the policy never departs (1.0)")
    answers = (
        " and ".join(label(x) for x in cal.languages) + " compiles only"
        if cal.languages
        else "every compile"
    )
    served = ", guarded (MLGO_GUARD=size)" if guard else ""
    console.print(f"{out}: departure threshold {cal.threshold:g}, answering {answers}{served}")


def report(
    evaluation: Annotated[
        Path | None,
        typer.Argument(help="a report.json, an eval.json, or a directory holding one"),
    ] = None,
    html: Annotated[Path | None, typer.Option(help="write a self-contained HTML report")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="write a JSON summary")] = None,
    build_dir: Annotated[
        Path | None, typer.Option(help="a build tree made with mlgo-cc (instead of an eval)")
    ] = None,
    baseline_dir: Annotated[
        Path | None, typer.Option(help="the same build made with the plain compiler")
    ] = None,
) -> None:
    """Render a program's report (as `mlgo demo`, `build` and `tune` write it: size and
    throughput table, HTML with plots, JSON) or an evaluation (table, per-module histogram,
    per-package bars, JSON), or compare the .text of every ELF file in two build trees
    (--build-dir, --baseline-dir)."""
    from mlgo.runtime.files import atomic_write_text

    if build_dir or baseline_dir:
        return _tree_report(build_dir, baseline_dir, json_out)
    if evaluation is None:
        raise UsageError("give a report or an evaluation, or --build-dir and --baseline-dir")
    page, summary = _render(evaluation, terse=bool(html or json_out))
    if html:
        atomic_write_text(html, page())
        console.print(f"wrote {html}")
    if json_out:
        atomic_write_text(json_out, summary)
        console.print(f"wrote {json_out}")


def _render(path: Path, terse: bool) -> tuple[Callable[[], str], str]:
    """The HTML page (drawn on demand) and the JSON of the program report or evaluation at
    PATH; prints a program report's table, or (unless TERSE) an evaluation's summary."""
    import json

    from mlgo.programs.report import load_report, render_html, report_table
    from mlgo.train.evaluate import Evaluation
    from mlgo.train.report import render_html as render_evaluation
    from mlgo.train.report import summary_json

    if (program := load_report(path)) is not None:
        console.print(report_table(program))
        return lambda: render_html(program), json.dumps(program, indent=1)
    if path.is_dir() and not (path / "eval.json").is_file():
        inside = ", ".join(sorted(str(p.parent) for p in path.glob("*/report.json")))
        hint = f" (mlgo build's are one per package: {inside})" if inside else ""
        raise UsageError(f"{path}: holds neither a report.json nor an eval.json{hint}")
    ev = Evaluation.load(path)
    if not terse:
        console.print(summary_json(ev))
    return lambda: render_evaluation(ev, f"mlgo report: {path}"), summary_json(ev)


def _tree_report(build: Path | None, baseline: Path | None, json_out: Path | None) -> None:
    """`mlgo report --build-dir B --baseline-dir A`: the .text of both trees' ELF files."""
    import json

    from mlgo.llvm.sizes import compare_trees, tree_report, tree_totals
    from mlgo.runtime.files import atomic_write_text

    if build is None or baseline is None:
        raise UsageError("--build-dir and --baseline-dir go together")
    rows = compare_trees(build, baseline)
    table = Table("file", "baseline .text", "build .text", "delta", title=f"{build} vs {baseline}")
    for r in rows:
        table.add_row(r.path, f"{r.baseline:,}", f"{r.build:,}", f"{r.delta_pct:+.2f}%")
    t = tree_totals(rows)
    table.add_row(
        "total", f"{t['baseline']:,}", f"{t['build']:,}", f"{t['delta_pct']:+.2f}%", style="bold"
    )
    console.print(table)
    if json_out:
        atomic_write_text(json_out, json.dumps(tree_report(rows), indent=1))
