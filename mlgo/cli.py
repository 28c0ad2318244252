"""The `mlgo` command."""

from __future__ import annotations

import sys
from contextlib import closing
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from mlgo.corpus.compile import CompileError
from mlgo.corpus.extract import BuildError
from mlgo.corpus.format import CorpusError, load_corpus
from mlgo.llvm.channel import ChannelError
from mlgo.llvm.toolchain import ToolchainError, find_toolchain
from mlgo.runtime.workers import WORKERS_HELP, make_workers
from mlgo.serve.client import ServiceError
from mlgo.ship.aot import AotError
from mlgo.traces.format import TraceError
from mlgo.xla.cli import xla_app

app = typer.Typer(
    help="ML-guided compiler heuristics: corpora, traces and policies for "
    "LLVM's inliner and register allocator.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
corpus_app = typer.Typer(
    help="Build and inspect corpora of real Debian packages.", no_args_is_help=True
)
app.add_typer(corpus_app, name="corpus")
app.add_typer(xla_app, name="xla")
console = Console()
err = Console(stderr=True, soft_wrap=True)

ClangOpt = Annotated[
    str | None, typer.Option(help="clang to use (default: $MLGO_CLANG, clang-22, clang)")
]
WorkersOpt = Annotated[str, typer.Option(help=WORKERS_HELP)]
# The errors a user can cause or fix; anything else is a bug and keeps its traceback.
USER_ERRORS = (
    ToolchainError,
    CorpusError,
    BuildError,
    TraceError,
    ChannelError,
    CompileError,
    AotError,
    ServiceError,
    KeyError,
    ValueError,
    OSError,
)


def _load_selected(corpus: Path, packages: str, problem: str):
    """The corpus at CORPUS, restricted to the comma-separated PACKAGES if any are named,
    recorded at the level PROBLEM compiles at."""
    from mlgo.problems import get_problem

    selected = load_corpus(corpus).select([p for p in packages.split(",") if p])
    return selected.require_opt_level(get_problem(problem).opt_level)


def _kb(n: float) -> str:
    return f"{n / 1024:,.1f} KiB"


@app.command()
def doctor(clang: ClangOpt = None) -> None:
    """Find clang and its LLVM tools, and check both MLGO channels answer."""
    from mlgo.llvm.toolchain import probe
    from mlgo.problems import get_problem, problem_names

    tc = find_toolchain(clang)
    table = Table("check", "result", title="mlgo toolchain")
    table.add_row("clang", tc.describe())
    for tool in ("llvm-objcopy", "llvm-size"):
        table.add_row(tool, tc.tool(tool))
    for name in problem_names():
        table.add_row(
            f"{name} channel",
            f"ok ({probe(tc, name)} decisions on the probe): {get_problem(name).summary}",
        )
    console.print(table)


@corpus_app.command("build")
def corpus_build(
    packages: Annotated[list[str], typer.Argument(help="recipe names from corpus/recipes")],
    out: Annotated[Path, typer.Option(help="corpus directory")] = Path("data/corpus"),
    work: Annotated[Path, typer.Option(help="where sources are unpacked and built")] = Path(
        "data/build"
    ),
    opt_level: Annotated[
        str,
        typer.Option(
            help="the level the problem you train compiles at: -Oz for inlining-size, "
            "-O2 for regalloc-eviction (clang's frontend already optimizes for it)"
        ),
    ] = "-Oz",
    profile: Annotated[
        bool,
        typer.Option(
            help="block counts from the package's own tests (an instrumented build runs "
            "them first) instead of static estimates, in every recorded module"
        ),
    ] = False,
    clang: ClangOpt = None,
) -> None:
    """Build Debian source packages and extract their bitcode into a corpus."""
    from mlgo.corpus.extract import combine, extract_package, load_recipe

    if opt_level not in ("-O0", "-O1", "-O2", "-O3", "-Os", "-Oz"):
        raise typer.BadParameter(
            f"{opt_level!r} is not one of -O0..-O3, -Os, -Oz", param_hint="--opt-level"
        )
    tc = find_toolchain(clang)
    out.mkdir(parents=True, exist_ok=True)
    failed = []
    for pkg in packages:
        with err.status(f"building {pkg}"):
            try:
                n = extract_package(
                    load_recipe(pkg), tc, out, work.resolve() / pkg, opt_level, profile
                )
            except BuildError as e:
                err.print(f"[red]failed[/red] {pkg}: {e}", highlight=False)
                failed.append(pkg)
                continue
        err.print(f"[green]built[/green] {pkg}: {n} modules")
    names = combine(out)
    console.print(
        f"{out}: {len(names)} modules from {len({n.split('/', 1)[0] for n in names})} packages"
    )
    if failed:
        raise typer.Exit(1)


@corpus_app.command("stats")
def corpus_stats(
    corpus: Annotated[Path, typer.Argument(help="corpus directory")],
    workers: WorkersOpt = "local",
    clang: ClangOpt = None,
) -> None:
    """Modules, call sites and .text bytes per package, at the level the corpus was recorded
    at (compiles once, then cached)."""
    from mlgo.corpus.stats import corpus_stats as compute
    from mlgo.corpus.stats import per_package

    tc = find_toolchain(clang)
    loaded = load_corpus(corpus)
    with closing(make_workers(workers)) as pool:
        stats, failures = compute(loaded, tc.describe(), tc.clang, pool)
    levels = "/".join(sorted({m.opt_level for m in loaded.modules}))
    table = Table(
        "package",
        "modules",
        "call sites",
        f".text at {levels}",
        "bitcode",
        title=f"{corpus} ({tc.describe()})",
    )
    rows = per_package(stats)
    for pkg, r in sorted(rows.items()):
        table.add_row(
            pkg,
            str(r["modules"]),
            f"{r['call_sites']:,}",
            _kb(r["text_size"]),
            _kb(r["bitcode_bytes"]),
        )
    total = {
        k: sum(r[k] for r in rows.values())
        for k in ("modules", "call_sites", "text_size", "bitcode_bytes")
    }
    table.add_row(
        "[bold]total",
        str(total["modules"]),
        f"{total['call_sites']:,}",
        _kb(total["text_size"]),
        _kb(total["bitcode_bytes"]),
    )
    console.print(table)
    for name, msg in failures.items():
        err.print(f"[red]failed[/red] {name}: {msg}", highlight=False)


@app.command()
def collect(
    problem: Annotated[str, typer.Option(help="inlining-size or regalloc-eviction")],
    corpus: Annotated[Path, typer.Option(help="corpus directory")],
    out: Annotated[Path, typer.Option(help="trace directory (resumed if it exists)")],
    packages: Annotated[str, typer.Option(help="comma-separated packages (default: all)")] = "",
    workers: WorkersOpt = "local",
    timeout: Annotated[float, typer.Option(help="seconds per module")] = 600.0,
    clang: ClangOpt = None,
) -> None:
    """Compile every module with the default heuristic and record its decisions."""
    from mlgo.traces.collect import collect as run

    tc = find_toolchain(clang)
    selected = _load_selected(corpus, packages, problem)
    with closing(make_workers(workers)) as pool:
        manifest = run(problem, selected, out, tc, pool, timeout)
    decisions = sum(m["decisions"] for m in manifest.modules.values())
    console.print(
        f"{out}: {len(manifest.modules)} modules, {decisions:,} decisions, "
        f"{len(manifest.failed)} failed"
    )
    if manifest.failed:
        raise typer.Exit(1)


def _policy_dir(path: Path) -> Path:
    """A run directory or its policy/ directory."""
    return path / "policy" if (path / "policy" / "policy.json").exists() else path


def _collect_for_bc(problem, run, corpus, tc, workers) -> None:
    """The default traces of the training corpus, collected into the run once."""
    from mlgo.traces.collect import collect as run_collect

    manifest = run_collect(problem, corpus, run.traces_dir, tc, workers)
    if manifest.failed:
        err.print(f"[yellow]{len(manifest.failed)} modules failed to compile and are left out")


@app.command()
def train(
    corpus: Annotated[Path, typer.Option(help="training corpus (held-out packages not in it)")],
    out: Annotated[Path, typer.Option(help="run directory; an existing run resumes")],
    algo: Annotated[str, typer.Option(help="bc, es or ppo")] = "bc",
    problem: Annotated[str, typer.Option(help="the decision to learn")] = "inlining-size",
    init: Annotated[Path | None, typer.Option(help="run or policy to start from (es, ppo)")] = None,
    packages: Annotated[str, typer.Option(help="comma-separated packages (default: all)")] = "",
    steps: Annotated[int, typer.Option(help="epochs (bc) or steps (es, ppo)")] = 0,
    sigma: Annotated[float, typer.Option(help="ES: perturbation scale of the weights")] = 0.05,
    derived: Annotated[bool, typer.Option(help="BC: also feed the default's cost rule")] = False,
    batch: Annotated[int, typer.Option(help="es, ppo: modules compiled per step")] = 24,
    directions: Annotated[int, typer.Option(help="ES: perturbations per step")] = 8,
    lr: Annotated[float, typer.Option(help="ES: Adam step size")] = 0.02,
    regression_penalty: Annotated[
        float, typer.Option(help="ES: reward per package, a package's loss x (1 + this)")
    ] = 0.0,
    max_module_seconds: Annotated[
        float, typer.Option(help="es, ppo: modules that compile slower stay out of batches")
    ] = 2.0,
    workers: WorkersOpt = "local",
    clang: ClangOpt = None,
) -> None:
    """Train a policy; prints its size change on the training corpus."""
    from mlgo.problems import get_problem
    from mlgo.problems.policy import MLPPolicy
    from mlgo.traces.dataset import load_decisions
    from mlgo.train import RunDir
    from mlgo.train.evaluate import evaluate

    spec = get_problem(problem)
    tc = find_toolchain(clang)
    with closing(make_workers(workers)) as pool:
        run = RunDir(out, algo)
        selected = _load_selected(corpus, packages, problem)
        if algo == "bc":
            from mlgo.train.bc import train_bc

            _collect_for_bc(problem, run, selected, tc, pool)
            data = load_decisions(run.traces_dir, spec)
            policy, acc = train_bc(data, problem, run, epochs=steps or 30, derived=derived)
            console.print(
                f"BC accuracy on {len(data.default):,} default decisions: {acc['accuracy']:.4f}"
                + "".join(f", {k} {v:.3f}" for k, v in acc.items() if k != "accuracy")
            )
        elif algo == "es":
            from mlgo.train.es import ESConfig, train_es

            if init is None:
                raise ValueError("--algo es needs --init (a BC run) as its starting point")
            cfg = ESConfig(
                steps=steps or ESConfig.steps,
                sigma=sigma,
                batch=batch,
                directions=directions,
                lr=lr,
                regression_penalty=regression_penalty,
                max_module_seconds=max_module_seconds,
                init=str(init),
            )
            start = MLPPolicy.load(_policy_dir(init))
            if start.problem != problem:
                raise ValueError(f"--init {init} is a {start.problem} policy, not {problem}")
            policy = train_es(selected, start, run, tc, pool, cfg)
        elif algo == "ppo":
            from mlgo.train.ppo import PPOConfig, train_ppo

            if init is None:
                raise ValueError("--algo ppo needs --init (a BC run) as its starting point")
            cfg = PPOConfig(
                steps=steps or PPOConfig.steps,
                batch=batch,
                max_module_seconds=max_module_seconds,
                init=str(init),
            )
            start = MLPPolicy.load(_policy_dir(init))
            if start.problem != problem:
                raise ValueError(f"--init {init} is a {start.problem} policy, not {problem}")
            policy = train_ppo(selected, start, run, tc, pool, cfg)
        else:
            raise ValueError(f"unknown --algo {algo!r}: use bc, es or ppo")
        ev = evaluate(policy, selected, tc, pool, problem)
    ev.save(out / "eval")
    t = ev.totals()
    console.print(
        f"{out / 'policy'}: training corpus {spec.reward_metric} {t['delta']:+.2%} vs "
        f"the default at {spec.opt_level} ({t['modules']} modules)"
    )


@app.command("eval")
def eval_cmd(
    policy: Annotated[Path, typer.Option(help="policy directory (or its run)")],
    corpus: Annotated[Path, typer.Option(help="corpus to compile, e.g. held-out packages")],
    out: Annotated[Path | None, typer.Option(help="where eval.json goes")] = None,
    packages: Annotated[str, typer.Option(help="comma-separated packages (default: all)")] = "",
    workers: WorkersOpt = "local",
    clang: ClangOpt = None,
) -> None:
    """Compile a corpus with a policy and with the default; per-module and total deltas."""
    from mlgo.problems.policy import MLPPolicy
    from mlgo.train.evaluate import evaluate

    tc = find_toolchain(clang)
    pdir = _policy_dir(policy)
    loaded = MLPPolicy.load(pdir)
    selected = _load_selected(corpus, packages, loaded.problem)
    with closing(make_workers(workers)) as pool:
        ev = evaluate(loaded, selected, tc, pool, loaded.problem)
    dest = out or pdir.parent / f"eval-{corpus.name}"
    ev.save(dest)
    m = ev.metric
    table = Table(
        "package", "modules", f"default {m}", f"policy {m}", "change", title=f"{pdir} on {corpus}"
    )
    for pkg, r in sorted(ev.per_package().items()):
        table.add_row(
            pkg,
            str(r["modules"]),
            f"{r[f'default_{m}']:,.0f}",
            f"{r[m]:,.0f}",
            f"{r['delta']:+.2%}",
        )
    t = ev.totals()
    table.add_row(
        "[bold]total",
        str(t["modules"]),
        f"{t[f'default_{m}']:,.0f}",
        f"{t[m]:,.0f}",
        f"[bold]{t['delta']:+.2%}",
    )
    console.print(table)
    console.print(f"wrote {dest / 'eval.json'}")
    for name, msg in ev.failed.items():
        err.print(f"[red]failed[/red] {name}: {msg}", highlight=False)


@app.command()
def export(
    policy: Annotated[Path, typer.Option(help="policy directory (or its run)")],
    out: Annotated[Path, typer.Option(help="where the shipped policy goes")],
    aot: Annotated[
        bool,
        typer.Option(
            help="also AOT-compile it (OUT/aot), build the native server and the clang plugin"
        ),
    ] = True,
) -> None:
    """Write a policy as a TF SavedModel (LLVM's feature names) beside its numpy form,
    with a model card drawn from its run (budget) and its evaluations; then AOT-compile
    it into OUT/aot (model.h + objects, what LLVM's release mode embeds)."""
    import shutil

    from mlgo.problems.policy import MLPPolicy
    from mlgo.runtime.files import atomic_write_text
    from mlgo.ship.export import export_saved_model
    from mlgo.ship.modelcard import model_card

    pdir = _policy_dir(policy)
    loaded = MLPPolicy.load(pdir)
    out.mkdir(parents=True, exist_ok=True)
    saved = export_saved_model(loaded, out)
    for name in ("policy.npz", "normalization.json", "policy.json"):
        shutil.copyfile(pdir / name, out / name)
    atomic_write_text(out / "MODEL_CARD.md", model_card(loaded, pdir.parent))
    console.print(f"wrote {saved} and {out / 'MODEL_CARD.md'}")
    if aot:
        from mlgo.ship.aot import aot_compile, native_server

        console.print(f"wrote {aot_compile(saved, out / 'aot')} (model.h and objects)")
        console.print(f"native policy server: {native_server(saved)}")
        from mlgo.ship.plugin import PLUGIN_PROBLEMS, inliner_plugin

        if loaded.problem in PLUGIN_PROBLEMS:
            plugin = inliner_plugin(out, find_toolchain())
            console.print(f"clang plugin: {plugin} (clang-22 -fpass-plugin={plugin} ...)")


@app.command()
def report(
    evaluation: Annotated[
        Path | None, typer.Argument(help="an eval directory or eval.json")
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
    """Render an evaluation (table, per-module histogram, per-package bars, JSON), or
    compare the .text of every ELF file in two build trees (--build-dir, --baseline-dir)."""
    from mlgo.runtime.files import atomic_write_text
    from mlgo.train.evaluate import Evaluation
    from mlgo.train.report import render_html, summary_json

    if build_dir or baseline_dir:
        _build_report(build_dir, baseline_dir, json_out)
        return
    if evaluation is None:
        raise ValueError("give an evaluation, or --build-dir and --baseline-dir")
    ev = Evaluation.load(evaluation)
    if html:
        atomic_write_text(html, render_html(ev, f"mlgo report: {evaluation}"))
        console.print(f"wrote {html}")
    if json_out:
        atomic_write_text(json_out, summary_json(ev))
        console.print(f"wrote {json_out}")
    if not html and not json_out:
        console.print(summary_json(ev))


def _build_report(build: Path | None, baseline: Path | None, json_out: Path | None) -> None:
    import json

    from mlgo.llvm.sizes import compare_trees
    from mlgo.runtime.files import atomic_write_text

    if build is None or baseline is None:
        raise ValueError("--build-dir and --baseline-dir go together")
    rows = compare_trees(build, baseline)
    table = Table("file", "baseline .text", "build .text", "delta", title=f"{build} vs {baseline}")
    for r in rows:
        table.add_row(r.path, f"{r.baseline:,}", f"{r.build:,}", f"{r.delta_pct:+.2f}%")
    total_base, total_build = sum(r.baseline for r in rows), sum(r.build for r in rows)
    delta = 100 * (total_build / total_base - 1) if total_base else 0.0
    table.add_row("total", f"{total_base:,}", f"{total_build:,}", f"{delta:+.2f}%", style="bold")
    console.print(table)
    if json_out:
        payload = {
            "files": [r.__dict__ for r in rows],
            "total": {"baseline": total_base, "build": total_build, "delta_pct": delta},
        }
        atomic_write_text(json_out, json.dumps(payload, indent=1))


@app.command()
def build(
    packages: Annotated[list[str], typer.Argument(help="recipes, e.g. lua sqlite3 zstd")],
    policy: Annotated[
        list[Path], typer.Option(help="policy directory; repeat for one per problem")
    ] = [Path("policies/inlining-size")],  # noqa: B006 (typer reads the default)
    out: Annotated[Path, typer.Option(help="where sources, builds and build.json go")] = Path(
        "data/programs"
    ),
    tests: Annotated[bool, typer.Option(help="run each package's own tests on both")] = True,
    backend: Annotated[
        str, typer.Option(help="service backend: auto, plugin, native or python")
    ] = "auto",
    clang: ClangOpt = None,
) -> None:
    """Build real programs from their Debian source packages twice, with plain clang and
    with mlgo-cc serving the policies (same -Oz flags), run the package's own tests on
    both, and compare the linked programs' .text."""
    import json

    from mlgo.corpus.extract import BuildError, load_recipe
    from mlgo.programs.build import (
        build_program,
        mlgo_compilers,
        plain_compilers,
        policy_service,
        pristine_source,
    )
    from mlgo.runtime.files import atomic_write_text

    tc = find_toolchain(clang)
    results: list[dict] = []
    failed: dict[str, str] = {}
    table = Table("program", "clang -Oz .text", "mlgo .text", "delta", "build s", "tests")

    def totals() -> tuple[int, int, float]:
        base = sum(sum(r["text"].values()) for r in results if r["variant"] == "plain")
        ml = sum(sum(r["text"].values()) for r in results if r["variant"] == "mlgo")
        return base, ml, 100 * (ml / base - 1) if base else 0.0

    def save() -> None:
        """Writes what is finished so far: a package that fails loses no other's result."""
        payload = {
            "policies": [str(p) for p in policy],
            "builds": results,
            "failed": failed,
            "delta_pct": totals()[2],
        }
        atomic_write_text(out / "build.json", json.dumps(payload, indent=1))

    recipes = [load_recipe(name) for name in packages]  # a misspelt name fails before any build
    with policy_service(policy, out / "service", backend) as service_env:
        for recipe in recipes:
            try:
                pristine = pristine_source(recipe, out / recipe.name)
                plain = build_program(
                    recipe,
                    pristine,
                    out / recipe.name / "plain",
                    tc,
                    "plain",
                    plain_compilers(tc),
                    run_tests=tests,
                )
                ml = build_program(
                    recipe,
                    pristine,
                    out / recipe.name / "mlgo",
                    tc,
                    "mlgo",
                    mlgo_compilers(),
                    dict(service_env, MLGO_CC=tc.clang),
                    tests,
                )
            except BuildError as e:
                failed[recipe.name] = str(e)
                console.print(f"[red]{e}")
                save()
                continue
            for prog, base in plain.text.items():
                table.add_row(
                    f"{recipe.name}: {prog}",
                    f"{base:,}",
                    f"{ml.text[prog]:,}",
                    f"{100 * (ml.text[prog] / base - 1):+.2f}%",
                    f"{plain.build_seconds:.0f} / {ml.build_seconds:.0f}",
                    f"{plain.tests} / {ml.tests}",
                )
            results += [plain.to_json(), ml.to_json()]
            save()
    base_total, ml_total, delta = totals()
    table.add_row("total", f"{base_total:,}", f"{ml_total:,}", f"{delta:+.2f}%", style="bold")
    console.print(table)
    console.print(f"wrote {out / 'build.json'}")
    if failed:
        raise BuildError(f"{len(failed)} of {len(packages)} packages failed: {', '.join(failed)}")


SocketOpt = Annotated[
    Path | None, typer.Option(help="service socket (default: $MLGO_SOCKET or the runtime dir)")
]


@app.command()
def serve(
    policy: Annotated[
        list[Path], typer.Option(help="policy directory; repeat for one per problem")
    ] = [Path("policies/inlining-size")],  # noqa: B006 (typer reads the default)
    backend: Annotated[
        str,
        typer.Option(
            help="plugin (inside clang), native (AOT policy server on a channel), python, "
            "or auto: plugin where the problem has one, native otherwise"
        ),
    ] = "auto",
    socket: SocketOpt = None,
    idle_exit: Annotated[
        float, typer.Option(help="exit after this many idle seconds (0: never)")
    ] = 0.0,
) -> None:
    """Run the policy service: one channel per compilation, many at once, until stopped."""
    from mlgo.serve.client import socket_path
    from mlgo.serve.service import Service, claim_socket, serve_forever

    path = socket or socket_path()
    claim_socket(path)  # before loading anything: a live service there is left alone
    service = Service(policy, backend, runtime=path.parent)  # channels beside the socket
    names = ", ".join(f"{p.problem.name} ({p.backend.name})" for p in service.policies)
    err.print(f"mlgo: serving {names} on {path}", highlight=False)
    serve_forever(service, path, idle_exit)


@app.command()
def status(socket: SocketOpt = None) -> None:
    """What the service serves: policies, compilations, decisions, latency percentiles."""
    from mlgo.serve.client import request

    s = request({"op": "status"}, path=socket)
    table = Table("", "", title=f"mlgo service (pid {s['pid']}, up {s['uptime_s']:.0f} s)")
    for key in ("active_leases", "compilations", "decisions", "failed_compilations"):
        table.add_row(key.replace("_", " "), f"{s[key]:,}")
    for p in s["policies"]:
        lat = p["latency"]
        pct = ", ".join(f"{k[:-3]} {v:.1f} µs" for k, v in lat.items()) if lat else "no decisions"
        if p["backend"] == "plugin":
            pct = "decided inside clang (not counted here)"
        table.add_row(f"{p['problem']} ({p['backend']})", f"{p['path']}\n{pct}")
    console.print(table)


@app.command()
def channel(
    problem: Annotated[str, typer.Option(help="the decision the channel serves")] = (
        "inlining-size"
    ),
    socket: SocketOpt = None,
    ttl: Annotated[float, typer.Option(help="seconds the channel waits for its compiler")] = 600,
) -> None:
    """Print a channel base for one compilation run by hand (-mllvm -...-channel-base=);
    starts the service (as mlgo-cc would) when none is running."""
    from mlgo.serve.cc import connect
    from mlgo.serve.client import socket_path

    with connect(socket or socket_path(), may_start=socket is None) as conn:
        conn.send({"op": "channel", "problem": problem, "ttl_s": ttl})
        print(conn.receive()["base"])


@app.command("install-wrappers")
def install_wrappers() -> None:
    """Install the native mlgo-cc/mlgo-c++ (C; no interpreter start-up per compile) over
    the Python entry points, which they hand every uncommon case to. tools/setup.sh runs it."""
    from mlgo.serve.cc import install_native_wrappers

    for path in install_native_wrappers(Path(sys.executable).parent):
        console.print(f"installed {path}")


@app.command()
def stop(socket: SocketOpt = None) -> None:
    """Stop the service; its channels are cleaned up."""
    from mlgo.serve.client import request

    request({"op": "stop"}, path=socket)
    console.print("mlgo service stopping")


@app.command()
def demo(
    out: Annotated[Path, typer.Option(help="where the demo corpus and traces go")] = Path(
        "data/demo"
    ),
    package: Annotated[str, typer.Option(help="recipe to build")] = "zlib",
) -> None:
    """The main job on a small default: build one real package's corpus, collect its
    inlining decisions, and show the corpus statistics."""
    corpus_build([package], out=out / "corpus", work=out / "build", opt_level="-Oz")
    collect("inlining-size", out / "corpus", out=out / "traces")
    corpus_stats(out / "corpus")


def main() -> None:
    try:
        app()
    except USER_ERRORS as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        err.print(f"[red]error:[/red] {msg}", highlight=False)
        sys.exit(2)


if __name__ == "__main__":
    main()
