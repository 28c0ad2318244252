"""Numbers the cost model reads: node features of an HLO graph and features of a config.

Config features are attached to the dot nodes (the configurable nodes, as in TpuGraphs'
layout collection), together with how well the tile fits the dot: the fraction of the
padded tile grid that is wasted in M, K and N and in all, how many tiles the dot spans, and
the roofline estimate of the dot under that tile (see report.roofline_scores), so the
network learns a correction to the analytical model rather than the model itself.
"""

from __future__ import annotations

import math

import numpy as np

from mlgo.xla.config import DEFAULT, EIGEN, SEARCH_SPACE, parse_config
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
CONFIG_FEATURES = 7 + len(SEARCH_SPACE)
CROSS_FEATURES = 9
# One core's peak and memory bandwidth, for the roofline estimate.
PEAK_FLOPS_PER_NS, BYTES_PER_NS = 32.0, 8.0


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
    """Kind of path, tile sizes, and a one-hot of the config within SEARCH_SPACE."""
    tile = parse_config(config)
    one_hot = np.zeros(len(SEARCH_SPACE), np.float32)
    if config in SEARCH_SPACE:
        one_hot[SEARCH_SPACE.index(config)] = 1
    if tile is None:
        head = [config == DEFAULT, config == EIGEN, 0, 0, 0, 0, 0]
    else:
        head = [0, 0, 1, _log2(tile.m) / 6, _log2(tile.k) / 6, _log2(tile.n) / 3,
                _log2(tile.m * tile.k * tile.n) / 8]  # fmt: skip
    return np.concatenate([np.asarray(head, np.float32), one_hot])


def dot_roofline_ns(dot: dict[str, int], config: str) -> float:
    """max(FLOPs / (peak * tile efficiency), bytes / bandwidth) of one dot. A tile's
    efficiency is the share of its padded work that is useful times the share of the 16
    vector registers its M x N accumulators keep busy; library paths run at peak."""
    m, k, n, b = dot["m"], dot["k"], dot["n"], dot["batch"]
    tile = parse_config(config)
    eff = 1.0
    if tile is not None:
        tn = tile.n * VECTOR_WIDTH
        padded = math.ceil(m / tile.m) * tile.m * math.ceil(k / tile.k) * tile.k
        padded *= math.ceil(n / tn) * tn
        eff = min(1.0, tile.m * tile.n / 16) * m * k * n / padded
    flops = 2.0 * m * k * n * b
    return max(flops / (PEAK_FLOPS_PER_NS * eff), 4.0 * b * (m * k + k * n + m * n) / BYTES_PER_NS)


def cross_features(graph: HloGraph, config: str) -> np.ndarray:
    """Per node: how the config's tile fits the dot and the dot's roofline time under it
    (zeros for other nodes; only the roofline for library paths)."""
    out = np.zeros((len(graph.nodes), CROSS_FEATURES), np.float32)
    tile = parse_config(config)
    for i, node in enumerate(graph.nodes):
        if not node.dot:
            continue
        out[i, 8] = _log2(dot_roofline_ns(node.dot, config)) / 16
        if tile is None:
            continue
        m, k, n = node.dot["m"], node.dot["k"], node.dot["n"]
        tn = tile.n * VECTOR_WIDTH
        waste = [math.ceil(m / tile.m) * tile.m / m, math.ceil(k / tile.k) * tile.k / k,
                 math.ceil(n / tn) * tn / n]  # fmt: skip
        out[i, :8] = [
            waste[0] - 1,
            waste[1] - 1,
            waste[2] - 1,
            math.log(waste[0] * waste[1] * waste[2]),
            _log2(m / tile.m) / 8,
            _log2(k / tile.k) / 8,
            _log2(n / tn) / 8,
            min(1.0, tile.m * tile.n / 16),
        ]
    return out


def edges(graph: HloGraph) -> np.ndarray:
    """(E, 2) operand -> user pairs."""
    pairs = [(o, i) for i, n in enumerate(graph.nodes) for o in n.operands]
    return np.asarray(pairs, np.int32).reshape(-1, 2)
