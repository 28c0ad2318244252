"""Numbers the cost model reads: node features of an HLO graph and features of a config.

Config features are attached to the dot nodes (the configurable nodes, as in TpuGraphs'
layout collection), together with how well the tile fits the dot: the fraction of the
padded tile grid that is wasted in M, K and N, and how many tiles the dot spans.
"""

from __future__ import annotations

import math

import numpy as np

from mlgo.xla.config import DEFAULT, EIGEN, parse_config
from mlgo.xla.extract import HloGraph

OPS = (
    "parameter", "constant", "dot", "fusion", "add", "multiply", "subtract", "divide",
    "maximum", "exponential", "tanh", "reduce", "broadcast", "reshape", "transpose",
    "convert", "concatenate", "slice", "select", "compare", "rsqrt", "tuple",
    "get-tuple-element", "custom-call", "copy", "bitcast", "iota", "erf", "negate",
)  # fmt: skip
DTYPES = ("f32", "bf16", "f16", "s32", "pred")
VECTOR_WIDTH = 8  # f32 lanes of an AVX2 register; N tiles are in vector widths
NODE_FEATURES = len(OPS) + 1 + len(DTYPES) + 1 + 4 + 5
CONFIG_FEATURES = 7
CROSS_FEATURES = 6


def _log2(x: float) -> float:
    return math.log2(max(x, 1.0))


def node_features(graph: HloGraph) -> np.ndarray:
    rows = []
    for node in graph.nodes:
        op = np.zeros(len(OPS) + 1)
        op[OPS.index(node.op) if node.op in OPS else len(OPS)] = 1
        dt = np.zeros(len(DTYPES) + 1)
        dt[DTYPES.index(node.dtype) if node.dtype in DTYPES else len(DTYPES)] = 1
        elements = math.prod(node.dims) if node.dims else 1
        shape = [_log2(elements) / 20, len(node.dims) / 6, float(node.entry), float(node.root)]
        d = node.dot
        dot = [float(bool(d))] + [_log2(d.get(k, 1)) / 10 for k in ("m", "k", "n", "batch")]
        rows.append(np.concatenate([op, dt, shape, dot]))
    return np.asarray(rows, dtype=np.float32)


def config_features(config: str) -> np.ndarray:
    tile = parse_config(config)
    if tile is None:
        return np.asarray([config == DEFAULT, config == EIGEN, 0, 0, 0, 0, 0], np.float32)
    return np.asarray(
        [0, 0, 1, _log2(tile.m) / 6, _log2(tile.k) / 6, _log2(tile.n) / 3,
         _log2(tile.m * tile.k * tile.n) / 8],
        np.float32,
    )  # fmt: skip


def cross_features(graph: HloGraph, config: str) -> np.ndarray:
    """Per node: how the config's tile fits the dot (zeros for other nodes and paths)."""
    out = np.zeros((len(graph.nodes), CROSS_FEATURES), np.float32)
    tile = parse_config(config)
    if tile is None:
        return out
    for i, node in enumerate(graph.nodes):
        if not node.dot:
            continue
        m, k, n = node.dot["m"], node.dot["k"], node.dot["n"]
        tn = tile.n * VECTOR_WIDTH
        out[i] = [
            math.ceil(m / tile.m) * tile.m / m - 1,
            math.ceil(k / tile.k) * tile.k / k - 1,
            math.ceil(n / tn) * tn / n - 1,
            _log2(m / tile.m) / 8,
            _log2(k / tile.k) / 8,
            _log2(n / tn) / 8,
        ]
    return out


def edges(graph: HloGraph) -> np.ndarray:
    """(E, 2) operand -> user pairs."""
    pairs = [(o, i) for i, n in enumerate(graph.nodes) for o in n.operands]
    return np.asarray(pairs, np.int32).reshape(-1, 2)
