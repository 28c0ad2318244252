"""Two small real programs for the XLA tests: a GEMM with an epilogue and a 2-layer MLP."""

import jax

from mlgo.xla.programs import Program, spec


def gemm(a, b):
    return jax.nn.relu(a @ b)


def mlp(x, w1, w2):
    return jax.nn.relu(x @ w1) @ w2


PROGRAMS = [
    Program("gemm_64x128x64", "gemm", gemm, (spec((64, 128)), spec((128, 64)))),
    Program("mlp_32x64x48", "mlp", mlp, (spec((32, 64)), spec((64, 48)), spec((48, 64))), True),
]

EXAMPLE_ARGS = {"gemm": (spec((64, 128)), spec((128, 64)))}
