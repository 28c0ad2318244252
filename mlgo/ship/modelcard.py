"""A shipped policy's model card, written from what its run recorded: the training
corpus, the budget spent, and every evaluation saved next to the run."""

from __future__ import annotations

import json
from pathlib import Path

from mlgo.corpus.format import CorpusError, load_corpus
from mlgo.llvm.languages import LANGUAGES, label
from mlgo.problems.policy import MLPPolicy
from mlgo.train.evaluate import Evaluation


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


def _reproduce(
    policy: MLPPolicy, state: dict, evaluations: list[tuple[str, Evaluation]], calibrated: bool
) -> list[str]:
    """The commands that rebuild the corpus and retrain this policy: from BC, or from the
    run or policy the run was started from, when it recorded one; then its calibration."""
    train = dict(evaluations).get("eval")
    packages = " ".join(sorted(train.per_package())) if train else "PACKAGES"
    algo, steps = state.get("algo", "bc"), state.get("step", 0)
    config = state.get("extra", {}).get("config", {})
    options = {
        "es": ("sigma", "lr", "batch", "directions", "regression_penalty", "max_module_seconds"),
        "ppo": ("batch", "max_module_seconds"),
        "bcmax": ("search_budget", "max_module_seconds", "clone_epochs", "clone_lr"),
    }
    flags = "".join(
        f" --{k.replace('_', '-')} {config[k]}" for k in options.get(algo, ()) if config.get(k)
    )
    if config.get("max_seconds"):  # a time budget: it sized the searches too
        flags += f" --minutes {config['max_seconds'] / 60:g}"
    problem_flag = f" --problem {policy.problem.name}"
    profile_flag = " --profile" if train and _profiled(train.corpus) else ""
    lines = [
        "",
        "## Reproduce",
        "",
        "```sh",
        f"mlgo corpus build {packages} --opt-level {policy.problem.opt_level}"
        f"{profile_flag} --out data/corpus",
    ]
    start = config.get("init") or "runs/bc"
    if algo == "bc" or start == "runs/bc":
        lines.append(f"mlgo train --algo bc --corpus data/corpus{problem_flag} --out runs/bc")
    else:
        lines.append(f"# the run started from {start} (a run or policy of its own)")
    if algo != "bc":
        lines.append(
            f"mlgo train --algo {algo} --init {start} --corpus data/corpus{problem_flag} "
            f"--out runs/{algo} --steps {steps}{flags}"
        )
    if calibrated:
        lines.append(
            f"mlgo calibrate --policy runs/{algo} --corpus data/corpus-validation "
            f"--out runs/{algo}-calibrated{' --guard' if policy.guard else ''}"
        )
    return [*lines, "```"]


def model_card(policy: MLPPolicy, run: Path) -> str:
    state = json.loads((run / "state.json").read_text()) if (run / "state.json").exists() else {}
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
    calibrated = (run / "policy" / "calibration.json").exists()
    lines += _reproduce(policy, state, evaluations, calibrated)
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
