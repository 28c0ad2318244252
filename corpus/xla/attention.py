"""Scaled dot-product attention with projections: batched matmuls and a softmax."""

import jax
import jax.numpy as jnp

from mlgo.xla.programs import Program, spec


def attention(x, wq, wk, wv, wo):
    q, k, v = x @ wq, x @ wk, x @ wv
    scores = jnp.einsum("bqd,bkd->bqk", q, k) / jnp.sqrt(q.shape[-1])
    return jnp.einsum("bqk,bkd->bqd", jax.nn.softmax(scores, axis=-1), v) @ wo


def scores_only(q, k):
    return jax.nn.softmax(q @ k.T / jnp.sqrt(q.shape[-1]), axis=-1)


# (batch, sequence, model dim, held out)
SHAPES = [
    (1, 64, 64, False),
    (2, 32, 32, False),
    (4, 16, 64, False),
    (1, 128, 32, False),
    (2, 48, 48, True),
    (1, 96, 24, True),
]

PROGRAMS = [
    Program(
        f"attn_{b}x{s}x{d}",
        "attention",
        attention,
        (spec((b, s, d)), spec((d, d)), spec((d, d)), spec((d, d)), spec((d, d))),
        h,
    )
    for b, s, d, h in SHAPES
] + [
    Program(f"scores_{s}x{d}", "attention", scores_only, (spec((s, d)), spec((s, d))), h)
    for s, d, h in [(64, 32, False), (128, 64, False), (32, 128, False), (80, 40, True)]
]
