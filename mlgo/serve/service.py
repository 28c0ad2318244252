"""The policy service: a long-lived daemon that answers many compilations at once.

It loads each policy once and hands every compilation the compiler flags that bring it
the policies (a lease). `auto` (the default backend, mlgo/serve/backends.py) takes the
plugin for the problems that have one, native otherwise. The daemon only does the control
plane: leases, cleanup, error events and statistics; mlgo/serve/server.py puts it on a socket.

A channel that fails raises an error event on its lease at once, so `mlgo-cc` can kill the
stuck compiler and fall back to the default heuristic.

A policy answers only compiles at the -O level its problem was trained for: a -Oz inlining
policy would shrink -O3 code the user wants fast. A policy calibrated for some languages only
(policy.json's `languages`) answers only compiles in those. Other compiles get no flags, and
the first one of each level (and language, where that is why) carries a note saying so,
once in the service's lifetime (about a build).

A compilation run by hand may ask for a channel whatever backend serves its problem: a policy
served by the plugin then also gets a channel backend for the same policy (native, else
python), started on the first such request, so `mlgo channel` works against the default service.
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mlgo.errors import UsageError
from mlgo.llvm.languages import label
from mlgo.problems import STAGES, Problem
from mlgo.problems.policy import MLPPolicy
from mlgo.problems.policy_files import load_policy
from mlgo.problems.profile_inputs import ONLY_THE_PLUGIN, reads_profile
from mlgo.serve.backends import (
    Backend,
    ChannelBackend,
    NativeBackend,
    PluginBackend,
    PythonBackend,
)
from mlgo.serve.client import runtime_dir


@dataclass
class ServedPolicy:
    policy: MLPPolicy  # loaded and checked once, here, for every backend that serves it
    path: Path
    backend: Backend
    by_hand: ChannelBackend | None = None  # the channel backend of a plugin-served policy

    @property
    def problem(self) -> Problem:
        return self.policy.problem

    @property
    def gated(self) -> bool:
        """It follows the compiler's own answer unless confident: the channel must send it."""
        return self.policy.departure_threshold is not None

    @property
    def languages(self) -> tuple[str, ...] | None:
        """Those it answers compiles in (None: all)."""
        return self.policy.languages

    def channel_flags(self, base: str) -> list[str]:
        """The compiler's flags for its channel at BASE: the compiler's own answer where
        it is gated, and its base (`MLPPolicy.base`)."""
        return [*self.problem.flags_for_serving(base, default=self.gated), *self.policy.base_flags]

    def why_not(self, level: str, language: str | None, stage: str = "compile") -> str | None:
        """Why it leaves a compile (or a link: STAGE) at LEVEL in LANGUAGE to clang's default
        (None: it serves)."""
        if self.problem.stage != stage:
            return f"trained for the {self.problem.stage} step"
        if stage != "compile" and not isinstance(self.backend, PluginBackend):
            # lld's full-LTO inliner takes its advisor from a plugin only: it ignores
            # -enable-ml-inliner, so a channel is never opened there; ThinLTO's backends run
            # side by side, and would share one.
            return "served on a channel, which lld's LTO does not open (serve its plugin)"
        if self.problem.opt_level != level:
            return f"trained for {self.problem.opt_level}"
        if stage == "compile" and self.languages is not None and language not in self.languages:
            return f"calibrated for {' and '.join(label(x) for x in self.languages)} only"
        return None


@dataclass
class Lease:
    id: str
    channels: dict[str, tuple[ServedPolicy, ChannelBackend, str]]  # channel id -> its FIFO base
    plugin_flags: list[str] = field(default_factory=list)
    notify: Callable[[dict], None] | None = None  # events to the client holding the lease
    detached: bool = False
    decisions: int = 0
    sessions: int = 0
    errors: list[str] = field(default_factory=list)
    ended: threading.Event = field(default_factory=threading.Event)
    guard: str | None = None  # the guard a policy it serves must be served under
    level: str | None = None  # what it serves: the compile's level, and its stage
    stage: str = "compile"

    @property
    def flags(self) -> list[str]:
        channels = [f for p, _, base in self.channels.values() for f in p.channel_flags(base)]
        return channels + self.plugin_flags


class Service:
    """The daemon's state: policies, leases and counters."""

    def __init__(self, policy_dirs: list[Path], backend: str, runtime: Path | None = None):
        self.runtime = runtime or runtime_dir()
        self.channel_dir = self.runtime / "channels"
        self.channel_dir.mkdir(mode=0o700, exist_ok=True)
        self.started = time.time()
        self.leases: dict[str, Lease] = {}
        self._by_channel: dict[str, Lease] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._by_hand_lock = threading.Lock()  # held while a channel backend starts
        self.compilations = self.decisions = self.failed = 0
        # stage -> -O level -> compiles (or links) served / left to clang's default
        self.counts: dict[str, dict[str, dict[str, int]]] = {s: {} for s in STAGES}
        self._noted: set[str | None] = set()  # the notes said already
        self.last_activity = time.monotonic()
        self.policies = [self._load(Path(d), backend) for d in policy_dirs]
        if len({p.problem.name for p in self.policies}) != len(self.policies):
            raise UsageError("two policies for the same problem; serve one per problem")

    def _load(self, directory: Path, backend: str) -> ServedPolicy:
        policy = load_policy(directory)  # checked whole before any backend builds from it
        problem = policy.problem
        if backend in ("auto", "plugin"):
            if problem.plugin:
                return ServedPolicy(policy, directory.resolve(), PluginBackend(policy))
            if backend == "plugin":
                raise UsageError(f"{directory}: {problem.name} has no plugin; use --backend native")
            backend = "native"
        if backend not in ("native", "python"):
            raise UsageError(f"unknown backend {backend!r}; use auto, plugin, native or python")
        if reads_profile(policy.normalizer.features):
            raise UsageError(f"{directory}: {ONLY_THE_PLUGIN}; serve it with --backend plugin")
        served = self._channel_backend(policy, backend)
        return ServedPolicy(policy, directory.resolve(), served)

    def _channel_backend(self, policy: MLPPolicy, backend: str) -> ChannelBackend:
        if backend == "python":
            return PythonBackend(policy, self)
        from mlgo.ship.aot import native_server

        log = self.runtime / f"policy-server-{policy.problem.name}.log"
        return NativeBackend(native_server(policy), log, self)

    def _by_hand(self, p: ServedPolicy) -> ChannelBackend:
        """The backend that answers P's channels by hand: its own, or for a plugin the native
        server of the same policy (python where that cannot be built), started once."""
        from mlgo.ship.aot import AotError

        if not isinstance(p.backend, PluginBackend):
            return p.backend
        with self._by_hand_lock:
            if p.by_hand is None:
                try:
                    p.by_hand = self._channel_backend(p.policy, "native")
                except (AotError, OSError) as e:
                    print(f"mlgo: channels by hand from the python policy: {e}", file=sys.stderr)
                    p.by_hand = self._channel_backend(p.policy, "python")
            return p.by_hand

    # -- events from backends -------------------------------------------------------
    def on_session(self, cid: str, decisions: int) -> None:
        with self._lock:
            lease = self._by_channel.get(cid)
            if lease is None:
                return
            lease.decisions += decisions
            lease.sessions += 1
            done = lease.sessions >= len(lease.channels)
        if lease.detached and done:  # by hand: one compilation, a session on each channel
            threading.Thread(target=self.end_lease, args=(lease,), daemon=True).start()

    def on_error(self, cid: str, message: str) -> None:
        with self._lock:
            lease = self._by_channel.get(cid)
            if lease is None:
                return
            lease.errors.append(message)
        if lease.notify is not None:
            lease.notify({"event": "error", "message": message})
        if lease.detached:
            threading.Thread(target=self.end_lease, args=(lease,), daemon=True).start()

    # -- leases ----------------------------------------------------------------------
    def level_note(
        self,
        level: str,
        problem: str | None = None,
        language: str | None = None,
        stage: str = "compile",
    ) -> tuple[bool, str | None]:
        """Does any policy (for PROBLEM, if named) answer a compile (or a link: STAGE) at LEVEL
        in LANGUAGE, and the note when that leaves some of them to clang's default (None when
        none is). Policies of the other stage are not named: they never answer here."""
        pool = [p for p in self.policies if problem in (None, p.problem.name)]
        if not pool:
            raise UsageError(f"this service serves no policy for {problem!r}")
        what = "compiles" if stage == "compile" else "links"
        if all(p.problem.stage != stage for p in pool):
            why = f"no served policy is trained for the {stage} step"
            return False, f"{level} {what} are left to clang's default: {why}"
        pool = [p for p in pool if p.problem.stage == stage]
        left = [(p, why) for p in pool if (why := p.why_not(level, language, stage))]
        if not left:
            return True, None
        by_level = all(p.problem.opt_level != level for p, _ in left)
        by_language = not by_level and stage == "compile"  # a link has no one language
        kind = f"{level} {label(language)} {what}" if by_language else f"{level} {what}"
        if len(left) < len(pool):
            names = ", ".join(f"{p.problem.name} ({why})" for p, why in left)
            return True, f"{kind} are left to clang's default for {names}"
        if by_level:
            levels = " and ".join(sorted({p.problem.opt_level for p in pool}))
            why = f"the served policies are for {levels}"
        else:
            why = ", ".join(f"{p.problem.name} is {why}" for p, why in left)
        return False, f"{kind} are left to clang's default: {why}"

    def serving(
        self, level: str, language: str | None = None, stage: str = "compile"
    ) -> tuple[bool, str | None]:
        """level_note for a compile or a link: counted by stage and level, and each note
        said once."""
        served, note = self.level_note(level, language=language, stage=stage)
        with self._lock:
            counts = self.counts[stage].setdefault(level, {"served": 0, "default": 0})
            counts["served" if served else "default"] += 1
        return served, self.once(note)

    def once(self, note: str | None) -> str | None:
        """NOTE the first time it is given, None after."""
        with self._lock:
            first = note not in self._noted
            self._noted.add(note)
        return note if first else None

    def open_lease(
        self,
        problem: str | None = None,
        notify: Callable[[dict], None] | None = None,
        level: str | None = None,
        channel: bool = False,
        language: str | None = None,
        stage: str = "compile",
    ) -> Lease:
        """A lease for one compilation (at LEVEL in LANGUAGE, at STAGE: only the policies
        that serve such a compile or link), each policy by its backend, or with CHANNEL on a
        channel whatever its backend. NOTIFY gets its error events as they happen; a lease
        without one is detached: a compilation by hand, which ends after one session (one
        without channels is over at once)."""
        chosen = [
            p
            for p in self.policies
            if problem in (None, p.problem.name)
            and (level is None or p.why_not(level, language, stage) is None)
        ]
        if not chosen:
            raise UsageError(f"this service serves no policy for {problem!r}")
        backends = [(p, self._by_hand(p) if channel else p.backend) for p in chosen]
        lease = Lease(f"{os.getpid()}-{next(self._ids)}", {}, notify=notify, detached=not notify)
        lease.level, lease.stage = level, stage
        lease.guard = next((p.policy.guard for p in chosen if p.policy.guard), None)
        plugins = [b for _, b in backends if isinstance(b, PluginBackend)]
        lease.plugin_flags = [f for b in plugins for f in b.flags]
        if lease.detached and len(plugins) == len(backends):  # flags by hand: nothing to end
            return lease
        with self._lock:
            self.leases[lease.id] = lease
            self.last_activity = time.monotonic()
        for p, backend in backends:
            if isinstance(backend, PluginBackend):  # no channel: a flag is all it takes
                continue
            cid = f"{lease.id}-{p.problem.name}"
            base = str(self.channel_dir / cid)
            os.mkfifo(base + ".in", 0o600)
            os.mkfifo(base + ".out", 0o600)
            lease.channels[cid] = (p, backend, base)
            with self._lock:
                self._by_channel[cid] = lease
            backend.start(cid, base, p.problem)
        return lease

    def end_lease(
        self, lease: Lease, returncode: int | None = None, handed_over: bool = False
    ) -> dict:
        """Ends LEASE and counts its compilation, unless it was HANDED_OVER: the native
        wrapper gave it to the Python one, which asks again and is counted then."""
        with self._lock:
            if lease.ended.is_set():
                return self._tally(lease)
            lease.ended.set()
        for cid, (_, backend, base) in lease.channels.items():
            backend.stop(cid, base)
            for suffix in (".in", ".out"):
                Path(base + suffix).unlink(missing_ok=True)
        with self._lock:
            for cid in lease.channels:
                self._by_channel.pop(cid, None)
            self.leases.pop(lease.id, None)
            counts = self.counts[lease.stage].get(lease.level or "")
            if handed_over and counts and counts["served"] > 0:
                counts["served"] -= 1
            self.compilations += not handed_over
            self.decisions += lease.decisions
            self.failed += bool(lease.errors) or bool(returncode)
            self.last_activity = time.monotonic()
        return self._tally(lease)

    @staticmethod
    def _tally(lease: Lease) -> dict:
        return {"decisions": lease.decisions, "sessions": lease.sessions, "errors": lease.errors}

    def status(self) -> dict:
        with self._lock:
            counters = {
                "pid": os.getpid(),
                "uptime_s": time.time() - self.started,
                "active_leases": len(self.leases),
                "compilations": self.compilations,
                "decisions": self.decisions,
                "failed_compilations": self.failed,
                "levels": {lv: dict(n) for lv, n in self.counts["compile"].items()},
                "links": {lv: dict(n) for lv, n in self.counts["link"].items()},
                "thin_links": {lv: dict(n) for lv, n in self.counts["thin-link"].items()},
            }
        counters["policies"] = [
            {
                "problem": p.problem.name,
                "path": str(p.path),
                "backend": p.backend.name,
                "by_hand": p.by_hand and p.by_hand.name,  # a plugin's channels, once asked for
                "latency": p.backend.latency(),
            }
            for p in self.policies
        ]
        return counters

    def clear_stale_channels(self) -> None:
        """Removes the FIFOs of a service that was killed: only once no service is live."""
        for stale in self.channel_dir.iterdir():
            stale.unlink()

    def close(self) -> None:
        for lease in list(self.leases.values()):
            self.end_lease(lease)
        for p in self.policies:
            p.backend.close()
            if p.by_hand is not None:
                p.by_hand.close()
