"""A shipped policy's model card: written from what its run recorded (the training corpus,
the budget spent, and every evaluation saved next to the run: `model_card`), or, for a
policy a recipe kept of its candidates, from the recipe's record (`chosen_card`). A policy
made by a recipe file (`train.recipe`) has that recipe's lines as its "Reproduce" section
(`with_reproduce` puts them into a card already written)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from mlgo.corpus.format import CorpusError, load_corpus
from mlgo.llvm.languages import LANGUAGES, label
from mlgo.problems.policy import MLPPolicy
from mlgo.runtime.inputs import read_json
from mlgo.train import policy_dir
from mlgo.train.evaluate import Evaluation
from mlgo.train.options import declared
from mlgo.train.registry import trainers


def _evaluations(run: Path) -> list[tuple[str, Evaluation]]:
    """Every evaluation saved next to the run by `mlgo eval`, and of a guarded policy also
    as it is served (EVAL/guarded)."""
    found = []
    for path in sorted([*run.glob("eval*/eval.json"), *run.glob("eval*/guarded/eval.json")]):
        where = path.parent
        name = f"{where.parent.name}, guarded" if where.name == "guarded" else where.name
        try:
            found.append((name, Evaluation.load(path)))
        except ValueError:
            continue
    return found


def _by_language(ev: Evaluation) -> list[tuple[str, int, float]]:
    """(language, modules, change) of the evaluation's C and of its C++ modules; none when
    its corpus is gone (the languages are the modules')."""
    try:
        language = {m.name: m.language for m in load_corpus(ev.corpus).modules}
    except (OSError, CorpusError):
        return []
    m, out = ev.metric, []
    for x in LANGUAGES:
        rows = [r for name, r in ev.modules.items() if language.get(name) == x]
        default = sum(r[f"default_{m}"] for r in rows)
        if default:
            out.append((label(x), len(rows), sum(r[m] for r in rows) / default - 1))
    return out


def _profiled(corpus: str) -> bool:
    """Whether the training corpus carries measured counts; one that is gone counts as not."""
    try:
        return any(m.profiled for m in load_corpus(corpus).modules)
    except (OSError, CorpusError):
        return False


def run_card(policy: MLPPolicy, pdir: Path, reproduce: Sequence[str] | None = None) -> str:
    """The card of POLICY, as loaded from PDIR, from what its run recorded (`policy_run`)
    and its calibration, if PDIR holds one; REPRODUCE: its recipe's lines, if it has one."""
    calibrated = (pdir / "calibration.json").exists()
    return model_card(policy, policy_run(pdir), calibrated, reproduce)


def policy_run(pdir: Path) -> Path:
    """The run the policy in PDIR came from: the directory holding it, or, for a calibrated
    policy written outside its run (`mlgo calibrate --out` elsewhere), the run of the policy
    it was calibrated from, which its calibration.json names."""
    run = pdir.parent
    if (run / "state.json").exists():
        return run
    try:
        source = Path(read_json(pdir / "calibration.json")["source"])
    except (OSError, ValueError, KeyError, TypeError):
        return run
    source_run = policy_dir(source).parent
    return source_run if (source_run / "state.json").exists() else run


def _trained(run: Path) -> Evaluation | None:
    """The evaluation of the run at RUN on its training corpus (`mlgo train` writes it)."""
    try:
        return Evaluation.load(run / "eval")
    except (OSError, ValueError):
        return None


def _chain(
    run: Path, state: dict, trained: Evaluation | None
) -> list[tuple[str, dict, Evaluation | None]]:
    """The run at RUN (its STATE, its evaluation TRAINED) and each run it started from, the
    first first: (its name, its state, its evaluation on what it trained on). A start that
    is a policy, or gone, ends it."""
    chain, seen = [(run.name, state, trained)], {run.resolve()}
    while init := chain[-1][1].get("extra", {}).get("config", {}).get("init"):
        start = Path(init)
        try:
            before = read_json(start / "state.json")
        except (OSError, ValueError):  # a policy, or a run gone or unreadable
            break
        if start.resolve() in seen or not isinstance(before, dict):
            break
        seen.add(start.resolve())
        chain.append((start.name, before, _trained(start)))
    return chain[::-1]


def _train_line(name: str, state: dict, init: str, flags: str) -> str:
    """The `mlgo train` command that ran the run NAME of STATE from INIT."""
    algo, config = state.get("algo", "bc"), state.get("extra", {}).get("config", {})
    if algo == "bc":
        return f"mlgo train --algo bc --corpus data/corpus{flags} --out runs/{name}"
    trainer = trainers().get(algo)
    taken = declared(trainer.Config) if trainer else {}
    options = "".join(f" --{k.replace('_', '-')} {config[k]}" for k in taken if config.get(k))
    if config.get("max_seconds"):  # a time budget: it sized the searches too
        options += f" --minutes {config['max_seconds'] / 60:g}"
    return (
        f"mlgo train --algo {algo} --init {init} --corpus data/corpus{flags} --out runs/{name} "
        f"--steps {state.get('step', 0)}{options}"
    )


def _reproduce(
    policy: MLPPolicy, chain: list[tuple[str, dict, Evaluation | None]], calibrated: bool
) -> list[str]:
    """The commands that rebuild the corpus and retrain this policy: each run of its CHAIN
    (`_chain`), from BC or from the policy the first started from; then its calibration."""
    last = chain[-1][2]
    packages = sorted(last.per_package()) if last else []
    problem_flag = f" --problem {policy.problem.name}"
    profile_flag = " --profile" if last and _profiled(last.corpus) else ""
    lines = [
        f"mlgo corpus build {' '.join(packages) or 'PACKAGES'} --opt-level "
        f"{policy.problem.opt_level}{profile_flag} --out data/corpus",
    ]
    first = chain[0][1]
    init = first.get("extra", {}).get("config", {}).get("init") or "runs/bc"
    if first.get("algo", "bc") != "bc":
        lines.append(
            f"mlgo train --algo bc --corpus data/corpus{problem_flag} --out runs/bc"
            if init == "runs/bc"
            else f"# the run started from {init} (a run or policy of its own)"
        )
    for name, st, ev in chain:
        trained_on = sorted(ev.per_package()) if ev else packages
        subset = f" --packages {','.join(trained_on)}" if set(trained_on) < set(packages) else ""
        lines.append(_train_line(name, st, init, problem_flag + subset))
        init = f"runs/{name}"
    if calibrated:
        lines.append(
            f"mlgo calibrate --policy {init} --corpus data/corpus-validation "
            f"--out {init}-calibrated{' --guard' if policy.guard else ''}"
        )
    return _commands(lines)


def _commands(lines: Sequence[str]) -> list[str]:
    """The card's section of the shell LINES that reproduce the policy."""
    return ["", "## Reproduce", "", "```sh", *lines, "```"]


def with_reproduce(card: str, lines: Sequence[str]) -> str:
    """CARD with its "Reproduce" section's commands made LINES, nothing else changed."""
    head, found, tail = card.partition("\n## Reproduce\n")
    body, fence, rest = tail.partition("\n```\n")
    if not found or not fence:
        raise ValueError("a card without a Reproduce section")
    return "\n".join([head, *_commands(lines)[1:]]) + "\n" + rest


def reproduce_section(card: str) -> list[str]:
    """The shell lines of CARD's "Reproduce" section."""
    tail = card.partition("\n## Reproduce\n\n```sh\n")[2]
    return tail.partition("\n```\n")[0].splitlines()


def model_card(
    policy: MLPPolicy,
    run: Path,
    calibrated: bool = False,
    reproduce: Sequence[str] | None = None,
) -> str:
    """POLICY's card from what its RUN recorded; CALIBRATED adds the calibration to what
    reproduces it, unless REPRODUCE (a recipe's lines) says that."""
    state = read_json(run / "state.json") if (run / "state.json").exists() else {}
    problem = policy.problem
    lines = [
        f"# {problem.name} policy",
        "",
        f"Decides {problem.summary}.",
        "",
        policy.describe() + "Each feature is mapped to its quantile among the training decisions "
        "(q, sqrt q, q^2).",
        "",
        "## Training",
        "",
        f"- algorithm: {state.get('algo', 'unknown')}, {state.get('step', 0)} steps",
        f"- budget: {state.get('compiles', 0):,} compilations, "
        f"{state.get('seconds', 0.0) / 60:.0f} minutes on this machine",
    ]
    extra = state.get("extra", {})
    if "init_reward" in extra:
        lines.append(
            f"- training-pool {problem.reward_metric} reduction: start "
            f"{extra['init_reward']:+.2%}, best {extra['best_reward']:+.2%}"
        )
    evaluations = _evaluations(run)
    chain = _chain(run, state, dict(evaluations).get("eval"))
    if len(chain) > 1:  # what training it from scratch costs
        states = [st for _, st, _ in chain]
        lines.append(
            f"- with the runs it started from ({', '.join(n for n, _, _ in chain[:-1])}): "
            f"{sum(st.get('compiles', 0) for st in states):,} compilations, "
            f"{sum(st.get('seconds', 0.0) for st in states) / 60:.0f} minutes of training"
        )
    lines += _commands(reproduce) if reproduce else _reproduce(policy, chain, calibrated)
    lines += [
        "",
        "## Measured",
        "",
        f"| evaluation | corpus | modules | {problem.reward_metric} vs default |",
        "|---|---|---|---|",
    ]
    for name, ev in evaluations:
        t = ev.totals()
        lines.append(f"| {name} | {Path(ev.corpus).name} | {t['modules']} | {t['delta']:+.2%} |")
        for language, modules, change in _by_language(ev):
            lines.append(f"| | all {language} modules | {modules} | {change:+.2%} |")
        for pkg, p in sorted(ev.per_package().items()):
            lines.append(f"| | {pkg} | {int(p['modules'])} | {p['delta']:+.2%} |")
    lines += [
        "",
        f"A negative change is a lower {problem.reward_metric} than clang's own heuristic "
        f"at the same optimization level ({problem.opt_level}).",
        "",
    ]
    return "\n".join(lines)


def _rows(judgement: dict) -> list[str]:
    """A judgement's total, each language's, and each package's, as table rows."""
    rows = [f"| all | {judgement['change_pct']:+.3f}% |"]
    rows += [f"| all {x} | {v:+.3f}% |" for x, v in judgement["by_language_pct"].items()]
    return rows + [f"| {p} | {v:+.3f}% |" for p, v in judgement["packages"].items()]


def chosen_card(policy: MLPPolicy, result: dict, how: str, reproduce: Sequence[str]) -> str:
    """The card of POLICY, which a recipe kept of its candidates: what it is, HOW it was
    trained and judged, every candidate's judgement on validation (RESULT's, each by
    `programs.judges.judgement`, as the recipe's record holds them), its one evaluation on
    test (guarded as it is served, and the same links without the guard), and the shell
    lines that REPRODUCE it (its recipe's)."""
    lines = [
        f"# {policy.problem.name} policy",
        "",
        f"Decides {policy.problem.summary}.",
        "",
        policy.describe(),
        "",
        "## How it was chosen",
        "",
        how,
        "",
        "| candidate | validation | packages larger |",
        "|---|---|---|",
    ]
    for name, v in result["validation"].items():
        kept = " (kept)" if name == result["chosen"] else ""
        larger = ", ".join(v["packages_larger"]) or "-"
        lines.append(f"| {name}{kept} | {v['change_pct']:+.3f}% | {larger} |")
    lines += ["", "## Test split, evaluated once", "", "| package | change |", "|---|---|"]
    lines += _rows(result["test"])
    alone = result.get("test, the policy alone")
    if alone:
        larger = ", ".join(alone["packages_larger"]) or "none"
        lines += [
            "",
            f"The same links without the guard: {alone['change_pct']:+.3f}%, larger: {larger}. "
            "So it ships guarded: each program or library it links is linked a second time "
            "with lld's own inliner and the one with less `.text` kept, which doubles the "
            "link's time.",
        ]
    return "\n".join([*lines, *_commands(reproduce), ""])
