"""The rules both wrappers hold a lease to before any of its flags reaches the compiler:
whatever answers on the socket must not get to choose what the compiler runs. The native
wrapper is built with the same allow-list (mlgo.serve.native_wrapper).
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

from mlgo.runtime.files import cache_dir
from mlgo.runtime.trust import UntrustedPathError, path_problem
from mlgo.serve.client import ServiceError, UntrustedError

# What a lease may carry: the -mllvm switches and channel options of the registered problems'
# serving flags (`lease_allow_list`; a channel's FIFO base must lie in the runtime directory's
# channels/), their base switches with a number, and -fpass-plugin= (a plugin in the cache of
# built ones, trusted).
PLUGIN_FLAG = "-fpass-plugin="


def at_link(flags: list[str]) -> list[str]:
    """A link lease's flags (checked) as clang hands them to lld: the plugin as
    --load-pass-plugin, through -Xlinker, which splits no commas (unlike -Wl). A link is
    served by a plugin only (`ServedPolicy.why_not`): lld's full-LTO inliner opens no
    channel, and its ThinLTO backends would share one."""
    if not all(f.startswith(PLUGIN_FLAG) for f in flags):
        raise ServiceError(f"a link's lease carries a flag lld cannot take: {flags}")
    return [a for f in flags for a in ("-Xlinker", f"--load-pass-plugin={f[len(PLUGIN_FLAG) :]}")]


@cache
def lease_allow_list() -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
    """The -mllvm switches, channel options (names, without `=BASE`) and numbered switches
    (names, without `=N`: a policy's base, `MLPPolicy.base`) that a lease may carry:
    exactly what the registered problems serve with, with and without the compiler's own
    decision. The one source of them: the native wrapper is built with the same lists
    (`build_native_wrapper`). Read only for a lease with -mllvm flags: the problems' modules
    cost this process about 0.1 s to import."""
    from mlgo.problems import problems

    mark = "/\0base"  # no real option ends so
    switches: set[str] = set()
    channels: set[str] = set()
    for problem in problems():
        for default in (False, True):
            flags = problem.flags_for_serving(mark, default)
            if flags[0::2] != ["-mllvm"] * (len(flags) // 2) or len(flags) % 2:
                raise ValueError(f"{problem.name}: serving flags must be -mllvm pairs: {flags}")
            for option in flags[1::2]:
                if option.endswith("=" + mark):
                    channels.add(option.removesuffix("=" + mark))
                else:
                    switches.add(option)
    numbered = frozenset(p.base_switch for p in problems() if p.base_switch)
    return frozenset(switches), frozenset(channels), numbered


def check_lease_flags(flags: list[str], runtime: Path) -> list[str]:
    """FLAGS as the compiler gets them, each plugin by its resolved path (the one checked:
    a link on the way could be pointed elsewhere after the check). Refuses any flag a lease
    may not carry (see lease_allow_list), saying which rule it breaks: whatever answers on
    the socket must not get to choose what the compiler runs; nor a plugin that another user
    could have written (mlgo.runtime.trust)."""
    channels = (runtime / "channels").resolve()
    try:
        plugins = cache_dir() / "plugin"  # resolved: mlgo.runtime.files.cache_dir
    except UntrustedPathError as e:  # nothing from that cache is loaded
        raise UntrustedError(str(e)) from e
    checked = []
    rest = iter(flags)
    for flag in rest:
        if flag == "-mllvm":
            option = next(rest, "")
            name, eq, base = option.partition("=")
            fifo = Path(base)
            switches, channel_options, numbered = lease_allow_list()
            if (
                option in switches
                or (eq and name in numbered and base.isascii() and base.isdigit())
                or (
                    eq
                    and name in channel_options
                    and fifo.name not in ("", ".", "..")
                    and fifo.parent.resolve() == channels
                )
            ):
                checked += [flag, option]
                continue
            if eq and name in channel_options:
                why = f"a channel must be a FIFO directly in {channels}"
            elif eq and name in numbered:
                why = "a policy's base must be digits alone"
            else:
                why = "not one of the served problems' options"
            raise ServiceError(f"the lease carries -mllvm {option[:160]!r}: {why}")
        if not flag.startswith(PLUGIN_FLAG):
            raise ServiceError(
                f"the lease carries {flag[:160]!r}: a lease may carry only the served "
                f"problems' -mllvm options and {PLUGIN_FLAG} with a plugin mlgo built"
            )
        plugin = Path(os.path.realpath(flag.removeprefix(PLUGIN_FLAG)))
        if plugins not in plugin.parents:
            raise ServiceError(
                f"the lease carries {flag[:160]!r}: {plugin} is not in {plugins}, "
                "and a lease may load only a plugin mlgo built there"
            )
        if problem := path_problem(plugin):  # checked as it is loaded, not only as built
            raise UntrustedError(f"refusing the plugin {plugin}: {problem}")
        checked.append(PLUGIN_FLAG + str(plugin))
    return checked
