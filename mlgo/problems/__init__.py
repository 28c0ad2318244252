"""Problems: one compiler decision point each, declared in one small module.

A problem names the clang flags that open its channel, the features and advice LLVM uses,
the compiler's default answer, how a compiled object is measured and how a measurement
becomes a reward, and the shape of the policy that decides it. Collection, training,
export and serving only ever use this interface, and pass the `Problem` itself: a name
becomes a `Problem` once, where it is read (a command-line option, policy.json, a trace
manifest, an evaluation). A new problem is one module here and one line in `MODULES`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from importlib import import_module
from pathlib import Path

import numpy as np

from mlgo.errors import UsageError
from mlgo.llvm.log_format import Observation

# The modules that declare a problem as their PROBLEM, one line each.
MODULES = (
    "mlgo.problems.inlining_size",
    "mlgo.problems.inlining_size_ir2vec",
    "mlgo.problems.inlining_size_link",
    "mlgo.problems.inlining_size_thin",
    "mlgo.problems.inlining_speed",
    "mlgo.problems.regalloc_eviction",
)
# A per-candidate column holding the live range's own value of a feature (the last slot's),
# so that a derived input can compare each candidate with it: "self:use_def_density".
SELF = "self:"
# Where a decision is made: in each file's compile; in the link of a full-LTO build, where
# the program's merged module is optimized once more (lld's LTO backend); or in the link of
# a ThinLTO build, whose backends optimize each file's module again after importing what
# it calls from the others.
STAGES = ("compile", "link", "thin-link")
# What a build adds to every compiler call for a stage (after its own flags): a link-time
# decision needs the program's bitcode at the link, and lld, whose LTO backends load a pass
# plugin (GNU ld's LLVM gold plugin cannot).
STAGE_FLAGS = {
    "compile": (),
    "link": ("-flto=full", "-fuse-ld=lld"),
    "thin-link": ("-flto=thin", "-fuse-ld=lld"),
}
AIMS = ("size", "speed")
# The stage each `--lto` mode tunes, records or builds for.
LTO_STAGES = {"full": "link", "thin": "thin-link"}


@dataclass(frozen=True)
class Derived:
    """A feature computed from two of LLVM's: `left - right`, or `left < right` as 0/1.

    Quantiles are taken per feature, so a comparison between two features (the default
    inliner's `cost_estimate < threshold`) is hard for the network to recover; giving it
    explicitly keeps the model exportable, since the graph computes it from LLVM's inputs.
    """

    name: str
    left: str
    op: str  # "-" or "<"
    right: str

    def __post_init__(self) -> None:
        if self.op not in ("-", "<"):
            raise UsageError(f"derived feature {self.name}: unknown op {self.op!r}")


@dataclass(frozen=True)
class Problem:
    name: str
    summary: str
    opt_level: str  # the optimization level the decision is trained for
    channel_flags: Callable[[str], list[str]]  # channel base path -> compiler flags
    feature_names: tuple[str, ...]  # LLVM's feature names, in LLVM's spelling
    advice_name: str
    # The compiler's own decision (inlining sends it) or, where the compiler does not
    # reveal it, the documented baseline answer used to walk the default trajectory.
    default_advice: Callable[[Observation], int]
    # The feature that carries the compiler's own answer when the channel sends it (None
    # where it never does): a policy's departure gate reads it in every backend.
    default_feature: str | None
    validate: Callable[[Observation, np.ndarray], None]  # raises ValueError on illegal advice
    measure_flags: Callable[[Path], list[str]]  # cc1 flags that make the compiler report costs
    # (object, work dir, how many objects of its package define each COMDAT group at the
    # default: `Module.copies`) -> metrics
    measure: Callable[[Path, Path, Mapping[str, int]], dict[str, float]]
    reward_metric: str  # the metric a policy should lower, relative to the default
    derived: tuple[Derived, ...] = ()  # extra inputs computed from LLVM's features
    # The network that decides, by its `kind` (`policy.policy_class` finds the class):
    # "mlp", one network over all features (a yes/no decision), or a subclass of MLPPolicy
    # with another shape that the problem's module defines (regalloc's per-candidate scorer).
    policy_kind: str = "mlp"
    # LLVM's input tensors as (name, dtype, shape), for an exported model to take them as
    # the compiler sends them; any other is an int64 scalar. A tensor whose elements are
    # features (`tensor.i`, IR2Vec's embeddings) is declared here under its own name.
    input_specs: tuple[tuple[str, str, tuple[int, ...]], ...] = ()
    # The flags for serving a trained policy, where they are cheaper than channel_flags:
    # the compiler's own decision costs it one more cost analysis per call site, and
    # only training looks at it.
    serving_flags: Callable[[str], list[str]] | None = None
    # Whether clang's pass plugin (mlgo/ship/native) can run this problem's policy inside
    # clang: it takes int64 and float features and gives a yes/no advice.
    plugin: bool = False
    # Flags LLVM's ML inliner needs beyond its mode, whatever serves it (IR2Vec's vocabulary,
    # inlining-speed's lifted growth cap): part of its channel and serving flags, and given
    # with the plugin too (`with_advisor_flags`).
    advisor_flags: tuple[str, ...] = ()
    # A digest of what beyond the compiler decides the features' values (IR2Vec: its
    # vocabulary). Policies and traces keep it, and one made under another is refused:
    # its embeddings would be other numbers under the same names.
    feature_digest: str | None = None
    # Whether the reward metric is one `mlgo corpus stats` caches per module, under the
    # same name, from the plain compile at the corpus's level: then a baseline reads it
    # from there instead of compiling the corpus again.
    reward_in_stats: bool = False
    # The features that tell which decisions a search should also move together (inlining:
    # the callee's, as LLVM sends no names): decisions equal in all of them form a group.
    group_features: tuple[str, ...] = ()
    # The step of a build it decides in (STAGES): a corpus is recorded at one, and a policy
    # serves only there, as it serves only its -O level.
    stage: str = "compile"
    # A problem whose policies this one's training may start from, and whose shipped
    # policy is its start where it has none of its own: the same features, advice and
    # network, another stage (the link's inliner starts from the per-file one).
    starts_from: str | None = None
    # What its policies are for (AIMS): smaller code, judged on the corpus (or the link);
    # or faster code, where a tune given a workload judges its candidates by their builds'
    # cost on it (mlgo.programs.speed) and reports the workload's time first.
    aim: str = "size"
    # A speed problem whose corpus holds no cost of its speed (its reward metric is the size
    # beside it): trained only on a workload (`mlgo tune --bench`), refused without one.
    needs_workload: bool = False
    # An integer switch of clang's own heuristic (inlining-speed: -inline-threshold) that a
    # policy may carry a value of (`MLPPolicy.base`): the heuristic its gate departs from,
    # passed wherever it is served. A tune given a workload judges clang's own decisions at
    # each of `base_grid` beside the policies it trains.
    base_switch: str | None = None
    base_grid: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.stage not in STAGES:
            raise UsageError(f"problem {self.name}: stage {self.stage!r} is not one of {STAGES}")
        if self.aim not in AIMS:
            raise UsageError(f"problem {self.name}: aim {self.aim!r} is not one of {AIMS}")
        if self.needs_workload and self.aim != "speed":
            raise UsageError(f"problem {self.name}: only a speed problem needs a workload")
        if bool(self.base_switch) != bool(self.base_grid):
            raise UsageError(f"problem {self.name}: a base switch comes with its grid")

    @property
    def default_is_observed(self) -> bool:
        return self.default_feature is not None

    def flags_for_serving(self, base: str, default: bool = False) -> list[str]:
        """The serving flags; the channel's (which send the default) if DEFAULT."""
        return (self.channel_flags if default else self.serving_flags or self.channel_flags)(base)

    def other_features(self, kept: object) -> str | None:
        """Why what KEPT that feature digest (a policy, traces) was made under another
        vocabulary than this problem's; None if it was not."""
        if self.feature_digest is None or kept == self.feature_digest:
            return None
        return (
            f"made with other {self.name} features than this mlgo's "
            f"(digest {kept or 'none'}, here {self.feature_digest}); make it again"
        )

    def group_of(self, obs: Observation) -> tuple[int, ...]:
        """The decision's group: its values of `group_features` (() where none are set)."""
        return tuple(int(obs.features[f].reshape(-1)[0]) for f in self.group_features)

    @property
    def input_names(self) -> frozenset[str]:
        """What a policy's inputs may name: LLVM's features, the compiler's own decision,
        a candidate's own value of a feature (`SELF` columns), and where the clang plugin
        serves it, the profile's inputs it computes."""
        from mlgo.problems.profile_inputs import PROFILE_INPUTS

        names = {*self.feature_names, *(f"{SELF}{f}" for f in self.feature_names)}
        names |= set(PROFILE_INPUTS) if self.plugin else set()
        return frozenset(names | ({self.default_feature} if self.default_feature else set()))

    @property
    def slots(self) -> int:
        """Candidates per decision: the largest input LLVM sends that is a feature whole (1
        for a scalar decision; a vector whose elements are features is not candidates)."""
        whole = (shape for name, _, shape in self.input_specs if name in self.feature_names)
        return max((int(np.prod(shape)) for shape in whole), default=1)

    def __reduce__(self) -> tuple:
        """Pickled by name (it holds functions): a worker gets its own registered copy."""
        return get_problem, (self.name,)


def with_advisor_flags(problem: Problem, flags: tuple[str, ...], **changes: object) -> Problem:
    """PROBLEM with CHANGES, whose ML inliner is given FLAGS too, however it is served: after
    its channel's and serving's flags, and with the plugin (`advisor_flags`)."""
    return replace(
        problem,
        channel_flags=lambda base: [*problem.channel_flags(base), *flags],
        serving_flags=lambda base: [*problem.flags_for_serving(base), *flags],
        advisor_flags=(*problem.advisor_flags, *flags),
        **changes,
    )


def _registry() -> dict[str, Problem]:
    problems = (import_module(m).PROBLEM for m in MODULES)
    return {p.name: p for p in problems}


def get_problem(name: str) -> Problem:
    problems = _registry()
    if name not in problems:
        raise UsageError(f"unknown problem {name!r}; known: {', '.join(sorted(problems))}")
    return problems[name]


def at_link(name: str, mode: str) -> Problem:
    """The problem that makes problem NAME's decision in the link of an `--lto MODE` build
    (NAME may be that one already)."""
    stage = LTO_STAGES[mode]
    for p in problems():
        if p.stage == stage and name in (p.name, p.starts_from):
            return p
    raise UsageError(f"--lto {mode} tunes the inliner of the link, not {name}")


def problems() -> list[Problem]:
    """Every registered problem, by name."""
    return [p for _, p in sorted(_registry().items())]
