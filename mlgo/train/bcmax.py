"""BC-Max, MLGO's method since its inlining-Oz-v1.2 model (arXiv 2403.19462): search every
training module for a cheaper decision trajectory than the policy's own, keep the best one
ever found per module, clone the best trajectories of the whole pool into the policy
(behavioral cloning, warm-started from it), and repeat with the cloned policy.

The search (`search_module`) is one task per module, run in the workers; it is also how
tools/headroom_inlining.py measures what per-module search can reach. It starts from the
policy's greedy trajectory (and from the default heuristic's, the first time a module is
searched: the best kept is never worse than either), and each round, from the best
trajectory so far:

- sets every decision of a group (for inlining, every call site of one callee) to the
  same answer, largest groups first: inlining all of a function's call sites can delete
  it, which no single flip shows;
- flips single decisions not yet tried from the best trajectory so far: those the
  policy is least sure of first (the smallest gap between its two logits), then the
  others in a seeded random order, so that later rounds and iterations reach other
  decisions (with no policy, every decision in order); a flip moves with it every
  decision the policy cannot tell from it (the same features, normalized), as a policy
  can only answer them alike: a trajectory it cannot represent is one its clone misses;
- samples whole trajectories from the policy at a temperature;
- makes all the helpful moves at once and, when that is not better than the best of
  them, adds them to it one at a time, best first, each kept only if a compile of the
  whole set confirms it.

Every cost is measured by a real compile, and every compile counts against the budget.
A module searched before starts from the best trajectory kept for it too, so that the
search goes on from there instead of from the clone's approximation of it.

A module slower to compile than `max_module_seconds` is not searched, only compiled with
the policy (and the default, the first time), and cloned at the better of the two: a unity
build or an amalgamation, thousands of call sites, is where an answer the clone learned on
small modules, repeated everywhere, grows code most, and the clone has to see it.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import TypeAlias

import numpy as np

from mlgo.corpus.compile import CompileError, compile_module
from mlgo.corpus.format import Module
from mlgo.corpus.stats import corpus_stats
from mlgo.errors import UsageError
from mlgo.llvm.log_format import Observation
from mlgo.options import MOST_PER_STEP, MOST_STEPS, positive
from mlgo.problems import Problem
from mlgo.problems.policy import MLPPolicy, policy_class
from mlgo.problems.profile_inputs import feature_column
from mlgo.records import Decisions, ModuleRun
from mlgo.runtime.inputs import read_json
from mlgo.runtime.workers import Failed
from mlgo.train import RunDir
from mlgo.train.bc import train_bc
from mlgo.train.loop import Candidate, Session, Step, Trainer, require_compiled
from mlgo.train.options import option
from mlgo.train.plugin_compile import compile_in_plugin, search_plugin
from mlgo.train.rollouts import scored_pool

Group = tuple[int, ...]  # a decision's values of its problem's group_features
GroupMove = tuple[Group, int]  # every decision of the group given this answer
Move: TypeAlias = int | GroupMove  # an int: flip the decision at that index


@dataclass(frozen=True)
class Answerer:
    """A reproducible trajectory: a base's answers (the compiler's default, or a policy's,
    greedy or sampled at its temperature from `seed`), set per group, then flipped at
    decision indices. On the same module it asks the same questions and gets the same
    object every time."""

    problem: Problem
    policy: MLPPolicy | None = None
    seed: tuple[int, ...] = ()
    flips: frozenset[int] = frozenset()
    groups: frozenset[GroupMove] = frozenset()  # at most one answer per group

    def __call__(self, obs: Observation) -> int:
        if self.policy is None:
            answer = self.problem.default_advice(obs)
        else:
            scores = self.policy.logits(self.policy.raw_features(obs))[0]
            # one stream per decision: a flip upstream does not reshuffle the draws
            rng = None
            if self.policy.temperature > 0:
                rng = np.random.default_rng((*self.seed, obs.index))
            answer = self.policy.pick(scores, rng)
        if self.groups:
            answer = self._group_answers.get(self.problem.group_of(obs), answer)
        return 1 - answer if obs.index in self.flips else answer

    @cached_property
    def _group_answers(self) -> dict[Group, int]:
        """`groups` to look a decision's group up in, made once, not at every decision."""
        return dict(self.groups)

    def flipped(self, indices: Iterable[int]) -> Answerer:
        return replace(self, flips=self.flips ^ frozenset(indices))

    def moved(self, moves: Iterable[Move]) -> Answerer:
        flips: list[int] = []
        groups = dict(self.groups)
        for m in moves:
            if isinstance(m, int):
                flips.append(m)
            else:
                groups[m[0]] = m[1]
        return replace(self.flipped(flips), groups=frozenset(groups.items()))


@dataclass
class Trajectory:
    cost: float  # the problem's reward metric, measured
    actions: np.ndarray  # [decisions] the answers given
    x: np.ndarray  # [decisions, features] the features of each decision, raw
    answerer: Answerer  # how to compile it again
    groups: list[Group] = field(default_factory=list)  # of each decision


@dataclass(frozen=True)
class SearchConfig:
    budget: int = 24  # compiles per module, the starting ones included (0: no limit)
    singles: int = 8  # single flips per round, least sure first (0: every decision)
    groups: int = 8  # group moves per round, largest groups first (0: every group)
    move_groups: bool = True  # False: single flips alone, as before group moves existed
    samples: int = 2  # trajectories sampled from the policy per round
    temperature: float = 1.0
    max_confirm: int = 8  # helpful moves combined per round
    rounds: int = 0  # 0: until the budget is spent or no single flip is left to try
    twins: bool = True  # False: a flip moves its decision alone, as before twins moved too
    greedy: bool = False  # True: a helpful move is kept at once, the next measured from it
    in_plugin: bool = True  # False: every compile through the channel (`plugin_compile`)


@dataclass(frozen=True)
class SearchTask:
    problem: Problem
    module: Module
    clang: str
    policy: MLPPolicy | None  # None: search around the default heuristic alone
    cfg: SearchConfig
    with_default: bool = True  # also start from the default's trajectory
    seed: int = 0
    resume: Answerer | None = None  # also start from this one: the best kept so far


@dataclass
class SearchResult:
    best: Trajectory
    starts: dict[str, float]  # the cost of each starting trajectory: default, policy
    compiles: int
    failed: int  # compiles that failed: counted, and no improvement
    curve: list[float] = field(default_factory=list)  # the best cost after each compile


class _Search:
    def __init__(self, task: SearchTask):
        self.task = task
        self.names = task.policy.normalizer.features if task.policy else task.problem.feature_names
        self.compiles = self.failed = 0
        self.best: Trajectory | None = None
        self.rng = np.random.default_rng(task.seed)
        self.queued_for: Trajectory | None = None  # the incumbent whose flips `queue` holds
        self.queue: list[int] = []  # its single flips not measured yet, in order
        self.twins: dict[int, tuple[int, ...]] = {}  # of the incumbent's decisions
        self.tried_groups: set[GroupMove] = set()  # from any incumbent
        self.tried_flips: set[int] = set()  # from any incumbent, when greedy
        self.curve: list[float] = []  # the best cost after each compile: what more buys

    @property
    def spent(self) -> bool:
        return 0 < self.task.cfg.budget <= self.compiles

    def start(self, answerer: Answerer) -> Trajectory:
        """A starting trajectory: its compile must succeed, budget or not."""
        self.compiles += 1
        t = self.task
        plugin = search_plugin(t.problem, answerer.policy, t.clang) if t.cfg.in_plugin else None
        if plugin is not None:
            run = compile_in_plugin(t.module, t.clang, answerer, plugin)
        else:
            run = compile_module(t.problem, t.module, t.clang, answerer)
        cost = run.metrics[t.problem.reward_metric]
        traj = Trajectory(cost, run.advice, self._rows(run), answerer, self._groups(run))
        if self.best is None or traj.cost < self.best.cost:
            self.best = traj
        self.curve.append(self.best.cost)
        return traj

    def measure(self, answerer: Answerer) -> Trajectory | None:
        """A candidate: None once the budget is spent, or if its compile fails (no
        improvement, and counted)."""
        if self.spent:
            return None
        try:
            return self.start(answerer)
        except CompileError:
            self.failed += 1
            self.curve.append(self.best.cost if self.best else math.inf)
            return None

    @staticmethod
    def _columns(run: ModuleRun, names: tuple[str, ...]) -> np.ndarray:
        """[decisions, names] the first value of each named feature; a module with no
        decisions sends no features."""
        n = run.num_decisions
        if n == 0:
            return np.zeros((0, len(names)))
        return np.stack([feature_column(run.features, f, n) for f in names], 1)

    def _rows(self, run: ModuleRun) -> np.ndarray:
        return self._columns(run, tuple(self.names))

    def _groups(self, run: ModuleRun) -> list[Group]:
        names = self.task.problem.group_features
        if not names:
            return []
        return [tuple(int(v) for v in row) for row in self._columns(run, names)]

    def untried_groups(self, inc: Trajectory) -> list[GroupMove]:
        """The next group moves of the incumbent INC: groups of two decisions or more not all
        answered alike, to one answer, largest first; `groups` of them (0: all)."""
        if not self.task.cfg.move_groups:
            return []
        sizes: dict[Group, int] = {}
        answers: dict[Group, set[int]] = {}
        for g, a in zip(inc.groups, inc.actions, strict=True):
            sizes[g] = sizes.get(g, 0) + 1
            answers.setdefault(g, set()).add(int(a))
        moves = [
            (g, answer)
            for g in sorted(sizes, key=lambda g: -sizes[g])
            if sizes[g] > 1
            for answer in (1, 0)
            if answers[g] != {answer} and (g, answer) not in self.tried_groups
        ]
        k = self.task.cfg.groups or len(moves)
        self.tried_groups.update(moves[:k])
        return moves[:k]

    def least_sure_first(self, traj: Trajectory) -> list[int]:
        """The decisions of TRAJ to flip, in order: the policy's `singles` least sure first,
        then the others in an order of this task's seed (each BC-Max iteration's search
        reaches other decisions); with no policy, every decision in order."""
        if self.task.policy is None or not len(traj.actions):
            return list(range(len(traj.actions)))
        top2 = np.sort(self.task.policy.logits(traj.x), 1)[:, -2:]
        order = [int(i) for i in np.argsort(top2[:, 1] - top2[:, 0], kind="stable")]
        k = self.task.cfg.singles
        return order[:k] + [int(i) for i in self.rng.permutation(order[k:])] if k else order

    def twins_of(self, traj: Trajectory) -> dict[int, tuple[int, ...]]:
        """Each decision of TRAJ that the policy cannot tell from others (the same
        normalized features), with all of them; none without a policy or with twins off."""
        if self.task.policy is None or not self.task.cfg.twins or not len(traj.actions):
            return {}
        rows = self.task.policy.normalizer.transform(traj.x)
        alike: dict[bytes, list[int]] = {}
        for i, row in enumerate(rows):
            alike.setdefault(row.tobytes(), []).append(i)
        return {i: tuple(same) for same in alike.values() if len(same) > 1 for i in same}

    def untried_flips(self, inc: Trajectory) -> list[int]:
        """The next single flips of the incumbent INC not measured yet: `singles` of them
        (0: all), one for each set of twins."""
        if self.queued_for is not inc:
            self.twins = self.twins_of(inc)
            order = self.least_sure_first(inc)
            rank = {i: k for k, i in enumerate(order)}
            first = {i: min(self.twins.get(i, (i,)), key=rank.__getitem__) for i in order}
            self.queued_for = inc
            self.queue = [i for i in order if first[i] == i and i not in self.tried_flips]
        k = self.task.cfg.singles or len(self.queue)
        picked, self.queue = self.queue[:k], self.queue[k:]
        if self.task.cfg.greedy:
            self.tried_flips.update(picked)
        return picked

    def moved(self, answerer: Answerer, moves: list[Move]) -> Answerer:
        """ANSWERER with MOVES made, each single flip with its twins in the incumbent."""
        flips = [j for m in moves if isinstance(m, int) for j in self.twins.get(m, (m,))]
        return answerer.moved([*flips, *(m for m in moves if not isinstance(m, int))])

    def round(self, r: int) -> bool:
        """One round from the best trajectory so far; False if it had nothing left to try."""
        cfg, inc = self.task.cfg, self.best
        assert inc is not None
        moves: list[Move] = [*self.untried_groups(inc), *self.untried_flips(inc)]
        if not moves:
            return False
        if cfg.greedy:
            for m in moves:
                t = self.measure(self.moved(inc.answerer, [m]))
                if t is not None and t.cost < inc.cost:
                    inc = t
            return True
        better: dict[Move, Trajectory] = {}
        for m in moves:
            t = self.measure(self.moved(inc.answerer, [m]))
            if t is not None and t.cost < inc.cost:
                better[m] = t
        if self.task.policy is not None:
            sampler = replace(self.task.policy, temperature=cfg.temperature)
            for k in range(cfg.samples):
                self.measure(Answerer(self.task.problem, sampler, (self.task.seed, r, k)))
        helpful: list[Move] = []
        for m in sorted(better, key=lambda m: better[m].cost):
            # one answer per group: the better of its two moves
            if isinstance(m, int) or all(h[0] != m[0] for h in helpful if isinstance(h, tuple)):
                helpful.append(m)
        helpful = helpful[: cfg.max_confirm]
        if len(helpful) < 2:
            return True
        current = better[helpful[0]]
        together = self.measure(self.moved(inc.answerer, helpful))
        if together is not None and together.cost < current.cost:
            return True
        for m in helpful[1:]:
            t = self.measure(self.moved(current.answerer, [m]))
            if t is not None and t.cost < current.cost:
                current = t
        return True


def search_module(task: SearchTask) -> SearchResult:
    """The cheapest trajectory the search finds for one module within the budget."""
    s = _Search(task)
    starts: dict[str, float] = {}
    if task.with_default or task.policy is None:
        starts["default"] = s.start(Answerer(task.problem)).cost
    if task.policy is not None:
        greedy = Answerer(task.problem, replace(task.policy, temperature=0.0))
        starts["policy"] = s.start(greedy).cost
    if task.resume is not None and (kept := s.measure(task.resume)) is not None:
        starts["kept"] = kept.cost
    r = 0
    while not s.spent and (task.cfg.rounds == 0 or r < task.cfg.rounds):
        if not s.round(r):  # every single flip of the best so far is measured
            break
        r += 1
    assert s.best is not None
    return SearchResult(s.best, starts, s.compiles, s.failed, s.curve)


@dataclass(frozen=True)
class BCMaxConfig:
    steps: int = 3  # iterations: search every pool module, then clone
    search_budget: int = field(
        default=24,
        metadata=option("compiles per module per iteration's search", min=2, max=MOST_PER_STEP),
    )
    temperature: float = 1.0  # of the trajectories sampled from the policy
    clone_epochs: int = field(
        default=10,
        metadata=option("behavioral cloning epochs per iteration", min=1, max=MOST_STEPS),
    )
    clone_lr: float = field(
        default=1e-3, metadata=option("behavioral cloning step size", check=positive)
    )
    max_module_seconds: float = field(
        default=2.0,
        metadata=option(
            "modules that compile slower are compiled with the policy each iteration, not searched",
            check=positive,
        ),
    )
    seed: int = 0
    init: str = ""  # the --init run or policy, as given: its model card's starting point
    max_seconds: float = 0.0  # training time budget over all resumes (0: none)


def encode_answerers(answerers: list[Answerer | None]) -> dict[str, np.ndarray]:
    """Checkpoint arrays of ANSWERERS (None: none yet): each policy they use once, and
    per answerer, as JSON, which of them, its temperature, seed, flips and group moves."""
    thetas: dict[bytes, int] = {}
    rows: list[np.ndarray] = []
    records: list[dict | None] = []
    for a in answerers:
        if a is None:
            records.append(None)
            continue
        index = -1
        if a.policy is not None:
            theta = a.policy.flat()
            index = thetas.setdefault(theta.tobytes(), len(thetas))
            if index == len(rows):
                rows.append(theta)
        records.append(
            {
                "policy": index,
                "temperature": a.policy.temperature if a.policy else 0.0,
                "seed": [int(v) for v in a.seed],
                "flips": sorted(int(i) for i in a.flips),
                "groups": [[*g, answer] for g, answer in sorted(a.groups)],
            }
        )
    return {
        "kept_policies": np.stack(rows) if rows else np.zeros((0, 0), np.float32),
        "kept_answerers": np.array(json.dumps(records)),
    }


def decode_answerers(arrays: dict[str, np.ndarray], init: MLPPolicy) -> list[Answerer | None]:
    """`encode_answerers` undone, each policy rebuilt on INIT's network; [] from a
    checkpoint written before answerers were kept."""
    if "kept_answerers" not in arrays:
        return []
    thetas = arrays["kept_policies"]

    def answerer(r: dict) -> Answerer:
        policy = None
        if r["policy"] >= 0:
            policy = replace(init.with_flat(thetas[r["policy"]]), temperature=r["temperature"])
        groups = frozenset((tuple(g[:-1]), g[-1]) for g in r["groups"])
        return Answerer(init.problem, policy, tuple(r["seed"]), frozenset(r["flips"]), groups)

    records = json.loads(str(arrays["kept_answerers"]))
    return [None if r is None else answerer(r) for r in records]


def per_module(arrays: dict[str, np.ndarray], key: str) -> list[np.ndarray]:
    """A checkpoint's array KEY of every module's best trajectory, concatenated, split
    back into one a module by their lengths (`_Best.arrays`)."""
    return np.split(arrays[key], np.cumsum(arrays["traj_len"])[:-1])


class _Best:
    """The best trajectory found per pool module, as checkpoint arrays and as BC data, and
    how to compile it again (the next search starts from it)."""

    def __init__(
        self, modules: list[str], init: MLPPolicy, arrays: dict[str, np.ndarray] | None = None
    ):
        self.modules = modules
        self.cost = np.full(len(modules), np.nan)
        self.actions: list[np.ndarray] = [np.zeros(0, np.int64)] * len(modules)
        # a module none found (its search failed) has no rows, of the features' width
        self.x: list[np.ndarray] = [np.zeros((0, len(init.normalizer.features)))] * len(modules)
        self.answerers: list[Answerer | None] = [None] * len(modules)
        if arrays is not None:
            self.cost = arrays["traj_cost"]
            self.actions = per_module(arrays, "traj_actions")
            self.x = per_module(arrays, "traj_x")
            self.answerers = decode_answerers(arrays, init) or self.answerers

    def known(self, i: int) -> bool:
        return not np.isnan(self.cost[i])

    def offer(self, i: int, t: Trajectory) -> None:
        if not self.known(i) or t.cost < self.cost[i]:
            self.cost[i], self.actions[i], self.x[i] = t.cost, t.actions, t.x
            self.answerers[i] = t.answerer

    def arrays(self) -> dict[str, np.ndarray]:
        return {
            "traj_cost": self.cost,
            "traj_len": np.array([len(a) for a in self.actions]),
            "traj_actions": np.concatenate(self.actions),
            "traj_x": np.concatenate(self.x),
            **encode_answerers(self.answerers),
        }

    def decisions(self, features: tuple[str, ...]) -> Decisions:
        owner = np.concatenate([np.full(len(a), i) for i, a in enumerate(self.actions)])
        return Decisions(
            features,
            np.concatenate(self.x),
            np.concatenate(self.actions).astype(np.int64),
            owner,
            self.modules,
        )


MIN_BUDGET = 4  # compiles per module: its starting trajectories and a couple of flips
SHARE_OF_TIME_LEFT = 0.25  # an iteration's search, so that several iterations fit
# A slow module's search: its starting trajectories alone (they are compiled whatever the
# budget), so that the clone learns what its answers do there at a compile or two.
SLOW_SEARCH = SearchConfig(budget=1)
# An iteration's cloning stops at this many decisions fitted (epochs times the decisions it
# clones), so that on a large code base the clone does not take the time the search needs:
# on CMake's 585,708 decisions, 400 epochs took 40 of a 60-minute tune's minutes, and the
# clone's accuracy was 0.9826 after 100 epochs against 0.9844 after 317. Counted, not timed,
# so that a run decides the same on any machine.
MOST_DECISIONS_CLONED = 50_000_000


def clone_epochs(configured: int, decisions: int) -> int:
    """The epochs an iteration clones DECISIONS for: the configured number, fewer where
    that would fit more than MOST_DECISIONS_CLONED; at least one."""
    return max(1, min(configured, MOST_DECISIONS_CLONED // max(decisions, 1)))


def iteration_budget(
    cfg: BCMaxConfig, seconds_left: float, searched_pass: float, slow_pass: float = 0.0
) -> int:
    """Compiles per searched module for this iteration: the configured budget, or with a
    time budget what a quarter of the time left affords, given the wall time of one compile
    of every searched module (SEARCHED_PASS) and of every slow one (SLOW_PASS, compiled once
    each), as the last search measured the machine; never fewer than MIN_BUDGET."""
    if not cfg.max_seconds or searched_pass <= 0:
        return cfg.search_budget
    fits = int((SHARE_OF_TIME_LEFT * seconds_left - slow_pass) / searched_pass)
    return max(MIN_BUDGET, min(cfg.search_budget, fits))


class BCMax(Trainer[BCMaxConfig]):
    """BC-Max as the module doc says: each step searches every pool module from the current
    policy (once: a kill while cloning does not search again) and clones the best
    trajectories into it; the best policy on the pool so far is the run's, each step's clone
    is in OUT/clone-N/policy. Its checkpoint: the current weights and the best trajectories."""

    name = "bcmax"
    title = "BC-Max"
    Config = BCMaxConfig

    @classmethod
    def refuses(cls, problem: Problem) -> str | None:
        """BC-Max flips yes/no answers: a problem whose answer is a candidate slot is not one."""
        if policy_class(problem) is not MLPPolicy or MLPPolicy.outputs != 2:
            return f"--algo bcmax searches yes/no decisions; {problem.name}'s are not"
        return None

    def start(
        self, run: Session, init: MLPPolicy, arrays: dict[str, np.ndarray] | None
    ) -> float | None:
        extra = run.state.extra
        self.init = init
        self.scorer, self.pool = scored_pool(run, init.problem, math.inf)
        names = [m.name for m in self.pool]
        if arrays is not None and extra["modules"] != names:
            raise UsageError(f"{run.run_dir.root}: its training pool differs from this corpus's")
        extra["modules"] = names
        extra.setdefault("searched", 0)  # steps whose search is done
        if "wall_per_second" not in extra:  # until a search measures the machine
            # the wall time a second of compiling (as the corpus stats measured it) takes
            extra["wall_per_second"] = 1 / getattr(run.workers, "processes", 1)  # Ray's: 1
        stats, _ = corpus_stats(run.corpus, run.tc.describe(), run.tc.clang, run.workers)
        self.seconds = np.array([stats[n].get("seconds", 0.0) for n in names])
        self.slow = self.seconds > self.config.max_module_seconds
        costs = self.scorer.default_costs()
        self.base = np.array([costs[n] for n in names])
        self.theta = init.flat()
        self.trajectories = _Best(names, init)
        if arrays is not None:
            self.theta = arrays["theta"]
            self.trajectories = _Best(names, init, arrays)
        return None  # the first search scores the start

    def step(self, run: Session) -> Step:
        extra = run.state.extra
        current = self.init.with_flat(self.theta)
        if extra["searched"] <= run.state.step:
            extra["search_metrics"] = self._search(run, current)
            extra["searched"] = run.state.step + 1
            run.checkpoint()
        searched = extra.pop("search_metrics")
        data = self.trajectories.decisions(tuple(self.init.normalizer.features))
        clone, acc = train_bc(
            data,
            self.init.problem,
            RunDir(run.run_dir.root / f"clone-{run.state.step + 1}", "bc"),
            clone_epochs(self.config.clone_epochs, len(data.default)),
            self.config.clone_lr,
            seed=self.config.seed,
            init=current,
        )
        self.theta = clone.flat()
        metrics = {**searched, "bcmax/clone_accuracy": acc["accuracy"]}
        return Step(metrics, Candidate(current, searched["bcmax/pool_reward"]))

    def next_step_seconds(self, run: Session, steps_done: int) -> float:
        """The search of that step at the least budget, as the last search measured the
        machine (none left to do if a kill came while cloning after it)."""
        if run.state.extra["searched"] > steps_done:
            return 0.0
        searched_pass, slow_pass = self._passes(run)
        return MIN_BUDGET * searched_pass + slow_pass

    def _passes(self, run: Session) -> tuple[float, float]:
        """The wall time of one compile of every searched module and of every slow one, as
        the last search measured the machine."""
        pace = run.state.extra["wall_per_second"]
        return pace * self.seconds[~self.slow].sum(), pace * self.seconds[self.slow].sum()

    def _search(self, run: Session, current: MLPPolicy) -> dict[str, float]:
        """Every pool module searched from CURRENT, within a budget the time left affords;
        the best trajectories kept, and what the search found."""
        cfg, extra = self.config, run.state.extra
        budget = iteration_budget(cfg, cfg.max_seconds - run.elapsed(), *self._passes(run))
        search = SearchConfig(budget=budget, temperature=cfg.temperature)
        tasks = [
            SearchTask(
                self.init.problem,
                m,
                run.tc.clang,
                current,
                SLOW_SEARCH if self.slow[i] else search,
                not self.trajectories.known(i),
                cfg.seed * 100003 + run.state.step * 1009 + i,
                self.trajectories.answerers[i],
            )
            for i, m in enumerate(self.pool)
        ]
        searching, compiled, policy_total = time.monotonic(), 0.0, 0.0
        modules = run.bar.add_task(f"searching {len(self.pool)} modules", total=len(tasks))
        names = extra["modules"]
        searched = np.zeros(len(names), bool)  # a module whose search failed is left out
        failures = []
        unit = "bytes" if self.init.problem.aim == "size" else self.init.problem.reward_metric
        for done, (task, r) in enumerate(run.workers.imap(search_module, tasks), 1):
            if isinstance(r, Failed):
                failures.append(r.message)
            else:
                i = names.index(task.module.name)
                searched[i] = True
                self.trajectories.offer(i, r.best)
                policy_total += r.starts["policy"]
                run.state.compiles += r.compiles
                compiled += r.compiles * self.seconds[i]
            left, found = len(tasks) - done, self.found()
            line = f"searching: {left} of {len(tasks)} modules left, {found:,.0f} {unit} found"
            run.bar.update(modules, advance=1, description=line)
        run.bar.remove_task(modules)
        if compiled > 0:
            extra["wall_per_second"] = (time.monotonic() - searching) / compiled
        run.dropped(failures)
        require_compiled(int(searched.sum()), len(names), "module searches")
        base = self.base[searched].sum()
        known = ~np.isnan(self.trajectories.cost)  # modules some search found a trajectory for
        found, known_base = float(self.trajectories.cost[known].sum()), self.base[known].sum()
        return {
            "bcmax/found": self.found(),
            "bcmax/search_budget": budget,
            "bcmax/pool_reward": (base - policy_total) / base,
            "bcmax/trajectory_reward": (known_base - found) / known_base,
        }

    def found(self) -> float:
        """What the best trajectories so far save against the default, summed over the
        modules where they save (in the reward metric's units: bytes, for size): a long
        search's progress, and the most its decisions can keep."""
        gain = self.base - self.trajectories.cost  # NaN where no search found one
        return float(np.sum(gain, where=gain > 0))

    def finish(self, run: Session) -> Candidate | None:
        """The last clone scored on the pool (the searches scored each one before it)."""
        if run.state.extra.get("evaluated") == run.state.step:
            return None
        final = self.init.with_flat(self.theta)
        reward = self.scorer.reward(final, self.pool)
        run.state.compiles += self.scorer.take_compiles()
        run.state.extra.update(evaluated=run.state.step, final_reward=reward)
        return Candidate(final, reward)

    def arrays(self) -> dict[str, np.ndarray]:
        return {"theta": self.theta, "default_cost": self.base, **self.trajectories.arrays()}


def searched_answers(root: Path) -> dict[str, str]:
    """Per module the BC-Max run at ROOT searched, the answers of the cheapest trajectory
    it measured there ('0' and '1', one a decision in the order asked), where that is
    cheaper than the default heuristic's (every module found, for a run from before the
    default's costs were kept); none for another trainer's run, or none at all. Decisions
    are data: what the search measured needs no policy to be kept."""
    state_path = root / "state.json"
    run = read_json(state_path) if state_path.is_file() else None
    if not isinstance(run, dict) or run.get("algo") != BCMax.name:  # none, or another's
        return {}
    state, arrays = RunDir(root, BCMax.name).load_state() or (None, {})
    if state is None or "traj_cost" not in arrays:
        return {}
    modules, cost, actions = (
        state.extra["modules"],
        arrays["traj_cost"],
        per_module(arrays, "traj_actions"),
    )
    base = arrays.get("default_cost", np.full(len(modules), np.inf))
    return {
        name: "".join("1" if a else "0" for a in actions[i])
        for i, name in enumerate(modules)
        if cost[i] < base[i]  # NaN, a module no search found, is never less
    }


TRAINER = BCMax
