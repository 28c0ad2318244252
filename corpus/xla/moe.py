"""Mixture-of-experts layers: a router and grouped (per-expert batched) matmuls."""

import jax
import jax.numpy as jnp

from mlgo.xla.programs import Program, spec


def moe_layer(x, router, w1, w2):
    """Dense MoE: every expert sees every token, outputs weighted by the router."""
    gates = jax.nn.softmax(x @ router, axis=-1)  # (t, e)
    h = jax.nn.relu(jnp.einsum("td,edf->etf", x, w1))
    y = jnp.einsum("etf,efd->etd", h, w2)
    return jnp.einsum("etd,te->td", y, gates)


def grouped_matmul(x, w):
    """Tokens already grouped by expert: (e, t, d) x (e, d, f)."""
    return jax.nn.relu(jnp.einsum("etd,edf->etf", x, w))


# (tokens, model dim, hidden dim, experts, held out)
MOE = [
    (16, 32, 64, 4, False),
    (32, 16, 32, 8, False),
    (8, 64, 128, 2, False),
    (24, 24, 48, 4, True),
]
GROUPED = [
    (4, 16, 64, 64, False),
    (8, 8, 32, 128, False),
    (2, 64, 32, 32, False),
    (4, 32, 128, 16, False),
    (6, 20, 40, 60, True),
]

PROGRAMS = [
    Program(
        f"moe_{t}x{d}x{f}x{e}",
        "moe",
        moe_layer,
        (spec((t, d)), spec((d, e)), spec((e, d, f)), spec((e, f, d))),
        h,
    )
    for t, d, f, e, h in MOE
] + [
    Program(
        f"grouped_{e}x{t}x{d}x{f}", "moe", grouped_matmul, (spec((e, t, d)), spec((e, d, f))), h
    )
    for e, t, d, f, h in GROUPED
]
