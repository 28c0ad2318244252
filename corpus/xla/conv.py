"""Convolutions written as dots: 1x1 convolutions and im2col patches times a filter matrix."""

import jax
import jax.numpy as jnp

from mlgo.xla.programs import Program, spec


def conv1x1(x, w):
    """NHWC 1x1 convolution: a GEMM over (N*H*W, C) x (C, F)."""
    n, h, wd, c = x.shape
    return jax.nn.relu((x.reshape(n * h * wd, c) @ w).reshape(n, h, wd, -1))


def conv3x3_im2col(x, w):
    """NHWC 3x3 'valid' convolution via im2col; w is (9*C, F)."""
    n, h, wd, c = x.shape
    patches = jnp.concatenate(
        [x[:, i : h - 2 + i, j : wd - 2 + j, :] for i in range(3) for j in range(3)], axis=-1
    )
    return jax.nn.relu(patches.reshape(-1, 9 * c) @ w)


# (batch, height, width, channels, filters, held out)
ONE = [
    (1, 8, 8, 32, 64, False),
    (2, 8, 8, 16, 32, False),
    (1, 16, 16, 8, 16, False),
    (4, 4, 4, 64, 64, False),
    (1, 12, 12, 24, 48, True),
]
THREE = [
    (1, 10, 10, 8, 16, False),
    (1, 18, 18, 4, 32, False),
    (2, 6, 6, 16, 32, False),
    (1, 14, 14, 8, 24, True),
]

PROGRAMS = [
    Program(f"conv1x1_{n}x{h}x{w}x{c}x{f}", "conv", conv1x1, (spec((n, h, w, c)), spec((c, f))), o)
    for n, h, w, c, f, o in ONE
] + [
    Program(
        f"conv3x3_{n}x{h}x{w}x{c}x{f}",
        "conv",
        conv3x3_im2col,
        (spec((n, h, w, c)), spec((9 * c, f))),
        o,
    )
    for n, h, w, c, f, o in THREE
]
