"""Plain GEMMs with an epilogue, relu(a @ b): the kernel the tile decision acts on directly."""

import jax

from mlgo.xla.programs import Program, spec


def gemm_relu(a, b):
    return jax.nn.relu(a @ b)


def gemm_bias_tanh(a, b, bias):
    return jax.numpy.tanh(a @ b + bias)


# (m, k, n, dtype, held out)
SHAPES = [
    (16, 128, 16, "float32", False),
    (32, 256, 64, "float32", False),
    (64, 64, 64, "float32", False),
    (128, 128, 128, "float32", False),
    (8, 512, 64, "float32", False),
    (4, 64, 256, "float32", False),
    (256, 64, 32, "float32", False),
    (48, 96, 80, "float32", True),
    (24, 192, 40, "float32", True),
    (96, 32, 160, "float32", True),
    (64, 128, 32, "bfloat16", False),
    (32, 64, 96, "bfloat16", True),
    # Large enough that the GEMM, not the call, is the time (0.2-0.5 ms per call).
    (256, 256, 256, "float32", False),
    (32, 2048, 512, "float32", False),
    (128, 1024, 128, "float32", True),
    (64, 512, 512, "float32", True),
]

PROGRAMS = [
    Program(f"gemm_{m}x{k}x{n}_{dt}", "gemm", gemm_relu, (spec((m, k), dt), spec((k, n), dt)), h)
    for m, k, n, dt, h in SHAPES
] + [
    Program(
        f"gemm_bias_{m}x{k}x{n}",
        "gemm",
        gemm_bias_tanh,
        (spec((m, k)), spec((k, n)), spec((n,))),
        h,
    )
    for m, k, n, h in [(32, 128, 32, False), (16, 64, 128, False), (40, 80, 24, True)]
]
