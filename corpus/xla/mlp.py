"""Transformer MLP blocks: layer norm, up-projection, GELU, down-projection, residual."""

import jax
import jax.numpy as jnp

from mlgo.xla.programs import Program, spec


def mlp_block(x, w1, b1, w2, b2):
    h = (x - x.mean(-1, keepdims=True)) / jnp.sqrt(x.var(-1, keepdims=True) + 1e-5)
    h = jax.nn.gelu(h @ w1 + b1)
    return x + h @ w2 + b2


def mlp2(x, w1, w2):
    return jax.nn.relu(jax.nn.relu(x @ w1) @ w2)


# (tokens, model dim, hidden dim, held out)
SHAPES = [
    (16, 64, 256, False),
    (32, 32, 128, False),
    (64, 64, 128, False),
    (8, 128, 512, False),
    (128, 32, 64, False),
    (24, 48, 192, True),
    (40, 96, 96, True),
]

PROGRAMS = [
    Program(
        f"mlp_{t}x{d}x{f}",
        "mlp",
        mlp_block,
        (spec((t, d)), spec((d, f)), spec((f,)), spec((f, d)), spec((d,))),
        h,
    )
    for t, d, f, h in SHAPES
] + [
    Program(f"mlp2_{t}x{d}x{f}", "mlp", mlp2, (spec((t, d)), spec((d, f)), spec((f, d))), h)
    for t, d, f, h in [(32, 64, 64, False), (16, 128, 32, False), (48, 64, 48, True)]
]
