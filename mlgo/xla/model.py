"""The learned cost model: a graph neural network over the HLO graph, in plain JAX + optax.

Node features are embedded and refined by a few rounds of message passing along operand
edges in both directions. Then, as for TpuGraphs' configurable nodes, every dot node's
embedding meets the config's features and how its tile fits that dot, and a small network
gives the dot's time; a readout of the pooled graph (mean and max) with the config gives
the time of everything else. The score is the log of the sum, and the model is trained with
a pairwise ranking loss within each program: it learns which config is faster, not
absolute times. The graph is embedded once per program, however many configs are scored.
An ensemble of such networks (different seeds) averages their scores, which steadies the
order of near-tied configs.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from mlgo.errors import UsageError
from mlgo.runtime.files import atomic_path, atomic_write_text
from mlgo.runtime.inputs import read_arrays, read_json
from mlgo.xla.config import DEFAULT
from mlgo.xla.extract import HloGraph
from mlgo.xla.features import (
    CONFIG_FEATURES,
    CROSS_FEATURES,
    NODE_FEATURES,
    config_features,
    cross_features,
    edges,
    node_features,
)

FORMAT = "mlgo-xla-cost-model"
VERSION = 2
# Runtimes closer than this ratio are within the measurement noise: no pair to rank.
TIE = math.log(1.03)


@dataclass(frozen=True)
class Hyper:
    hidden: int = 64
    layers: int = 3
    steps: int = 400
    lr: float = 3e-3
    seed: int = 0
    ensemble: int = 1  # networks trained with seeds seed, seed + 1, ...
    loss: str = "pairwise"  # or "listwise" (see LOSSES)


@dataclass
class Batch:
    """Graphs padded to common sizes, each with every config's features."""

    nodes: np.ndarray  # (P, N, NODE_FEATURES)
    node_mask: np.ndarray  # (P, N)
    src: np.ndarray  # (P, E)
    dst: np.ndarray  # (P, E)
    edge_mask: np.ndarray  # (P, E)
    dot_mask: np.ndarray  # (P, N)
    cross: np.ndarray  # (P, C, N, CROSS_FEATURES)
    configs: np.ndarray  # (C, CONFIG_FEATURES)


def _pad(n: int, least: int) -> int:
    """Padded size: a power of two, at least `least`, so that the jitted model compiles
    once for most graphs instead of once per graph size."""
    return max(least, 1 << max(n - 1, 1).bit_length())


def make_batch(graphs: list[HloGraph], configs: list[str]) -> Batch:
    n_max = _pad(max(len(g.nodes) for g in graphs), 128)
    e_all = [edges(g) for g in graphs]
    e_max = _pad(max(len(e) for e in e_all), 256)
    p, c = len(graphs), len(configs)
    b = Batch(
        np.zeros((p, n_max, NODE_FEATURES), np.float32),
        np.zeros((p, n_max), np.float32),
        np.zeros((p, e_max), np.int32),
        np.zeros((p, e_max), np.int32),
        np.zeros((p, e_max), np.float32),
        np.zeros((p, n_max), np.float32),
        np.zeros((p, c, n_max, CROSS_FEATURES), np.float32),
        np.stack([config_features(x) for x in configs]),
    )
    for i, (g, e) in enumerate(zip(graphs, e_all, strict=True)):
        n = len(g.nodes)
        b.nodes[i, :n] = node_features(g)
        b.node_mask[i, :n] = 1
        b.dot_mask[i, :n] = [bool(x.dot) for x in g.nodes]
        b.src[i, : len(e)], b.dst[i, : len(e)] = e[:, 0], e[:, 1]
        b.edge_mask[i, : len(e)] = 1
        for j, config in enumerate(configs):
            b.cross[i, j, :n] = cross_features(g, config)
    return b


def _dense(key, n_in: int, n_out: int) -> dict:
    return {
        "w": jax.random.normal(key, (n_in, n_out)) * math.sqrt(2.0 / n_in),
        "b": jnp.zeros(n_out),
    }


def init_params(hyper: Hyper, seed: int) -> dict:
    keys = jax.random.split(jax.random.PRNGKey(seed), hyper.layers + 5)
    h = hyper.hidden
    return {
        "embed": _dense(keys[0], NODE_FEATURES, h),
        "layers": [_dense(keys[1 + i], 3 * h, h) for i in range(hyper.layers)],
        "dot1": _dense(keys[-4], h + CONFIG_FEATURES + CROSS_FEATURES, h),
        "dot2": _dense(keys[-3], h, 1),
        "graph1": _dense(keys[-2], 2 * h + CONFIG_FEATURES, h),
        "graph2": _dense(keys[-1], h, 1),
        # A per-config term: the program-independent order of the configs, which the
        # rest of the network corrects per program.
        "config_bias": {"w": jnp.zeros((CONFIG_FEATURES, 1)), "b": jnp.zeros(1)},
    }


def _apply(layer: dict, x: jax.Array) -> jax.Array:
    return x @ layer["w"] + layer["b"]


def _embed(params, nodes, node_mask, src, dst, edge_mask):
    """Node embeddings of one graph after message passing along operand edges."""
    n = nodes.shape[0]
    h = jax.nn.relu(_apply(params["embed"], nodes)) * node_mask[:, None]
    w = edge_mask[:, None]
    deg_in = jax.ops.segment_sum(edge_mask, dst, n)[:, None] + 1
    deg_out = jax.ops.segment_sum(edge_mask, src, n)[:, None] + 1
    for layer in params["layers"]:
        from_operands = jax.ops.segment_sum(h[src] * w, dst, n) / deg_in
        from_users = jax.ops.segment_sum(h[dst] * w, src, n) / deg_out
        upd = jax.nn.relu(_apply(layer, jnp.concatenate([h, from_operands, from_users], -1)))
        h = (h + upd) * node_mask[:, None]
    return h


def _score(params, h, node_mask, dot_mask, cross, config):
    """Predicted log runtime of one graph under one config: the log of the sum of a time
    per dot (from its embedding, the config and the tile's fit) and one for the rest, plus
    the config's own term."""
    n = h.shape[0]
    per_dot = jnp.concatenate([h, jnp.broadcast_to(config, (n, config.shape[0])), cross], -1)
    dot_t = jax.nn.softplus(_apply(params["dot2"], jax.nn.relu(_apply(params["dot1"], per_dot))))
    mean = h.sum(0) / node_mask.sum()
    peak = jnp.max(jnp.where(node_mask[:, None] > 0, h, -1e9), axis=0)
    g = jax.nn.relu(_apply(params["graph1"], jnp.concatenate([mean, peak, config])))
    rest_t = jax.nn.softplus(_apply(params["graph2"], g))[0]
    bias = _apply(params["config_bias"], config)[0]
    return jnp.log((dot_t[:, 0] * dot_mask).sum() + rest_t + 1e-6) + bias


def _program_scores(params, nodes, node_mask, src, dst, edge_mask, dot_mask, cross, configs):
    """(C,) scores of one program: the graph is embedded once, then every config scored."""
    h = _embed(params, nodes, node_mask, src, dst, edge_mask)
    per_config = jax.vmap(_score, in_axes=(None, None, None, None, 0, 0))
    return per_config(params, h, node_mask, dot_mask, cross, configs)


_per_program = jax.vmap(_program_scores, in_axes=(None, 0, 0, 0, 0, 0, 0, 0, None))


@jax.jit
def predict_batch(params: dict, b: Batch) -> jax.Array:
    """(P programs, C configs) predicted log runtimes."""
    return _per_program(
        params, b.nodes, b.node_mask, b.src, b.dst, b.edge_mask, b.dot_mask, b.cross, b.configs
    )


jax.tree_util.register_pytree_node(
    Batch,
    lambda b: (
        (b.nodes, b.node_mask, b.src, b.dst, b.edge_mask, b.dot_mask, b.cross, b.configs),
        None,
    ),
    lambda _, xs: Batch(*xs),
)


def ranking_loss(scores: jax.Array, log_times: jax.Array, valid: jax.Array) -> jax.Array:
    """Pairwise logistic loss over config pairs of the same program that differ beyond TIE,
    weighted by how much they differ (a wrong order of a 2x gap costs more than of 5%)."""
    diff_t = log_times[:, :, None] - log_times[:, None, :]
    diff_s = scores[:, :, None] - scores[:, None, :]
    pair = valid[:, :, None] * valid[:, None, :] * (diff_t > TIE)
    loss = jax.nn.softplus(-diff_s) * jnp.minimum(diff_t, 2.0)
    return (loss * pair).sum() / jnp.maximum(pair.sum(), 1.0)


def listwise_loss(scores: jax.Array, log_times: jax.Array, valid: jax.Array) -> jax.Array:
    """ListNet: cross-entropy between the softmax of the negated scores and of the negated
    measured log times (temperature LIST_TEMPERATURE), over each program's valid configs:
    every config counts, weighted by how close it is to the fastest."""
    neg = jnp.where(valid > 0, 0.0, -1e9)
    target = jax.nn.softmax(-log_times / LIST_TEMPERATURE + neg, axis=-1)
    logq = jax.nn.log_softmax(-scores + neg, axis=-1)
    return -(target * logq * valid).sum(-1).mean()


LIST_TEMPERATURE = 0.1
LOSSES = {"pairwise": ranking_loss, "listwise": listwise_loss}


@dataclass
class CostModel:
    members: list[dict]  # parameters of each network of the ensemble
    configs: list[str]
    hyper: Hyper
    info: dict

    def predict(self, graphs: list[HloGraph]) -> np.ndarray:
        """(programs, configs) predicted log runtimes (ensemble mean); lower is faster."""
        batch = make_batch(graphs, self.configs)
        return np.mean([np.asarray(predict_batch(p, batch)) for p in self.members], axis=0)

    def pick(self, scores: np.ndarray) -> str:
        """The best-scored config, unless XLA's default scores within `default_margin` of
        it: a predicted gain that small is not worth leaving the default path for."""
        return pick(scores, self.configs, self.info.get("default_margin", 0.0))

    def save(self, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        leaves, _ = jax.tree_util.tree_flatten(self.members)
        with atomic_path(out / "params.npz") as tmp, open(tmp, "wb") as f:
            np.savez(f, *[np.asarray(x) for x in leaves])
        meta = {
            "format": FORMAT,
            "version": VERSION,
            "configs": self.configs,
            "hyper": self.hyper.__dict__,
            "info": self.info,
        }
        atomic_write_text(out / "model.json", json.dumps(meta, indent=1))

    @classmethod
    def load(cls, root: Path) -> CostModel:
        meta_path = root / "model.json"
        if not meta_path.is_file():
            raise FileNotFoundError(f"{root}: not a cost model (no model.json)")
        meta = read_json(meta_path)
        if meta.get("format") != FORMAT or meta.get("version") != VERSION:
            raise UsageError(f"{meta_path}: not a {FORMAT} v{VERSION} model")
        hyper = Hyper(**meta["hyper"])
        init = [init_params(hyper, hyper.seed + i) for i in range(hyper.ensemble)]
        _, tree = jax.tree_util.tree_flatten(init)
        expected = sum(math.prod(leaf.shape) for leaf in jax.tree_util.tree_leaves(init))
        leaves = [jnp.asarray(a) for a in read_arrays(root / "params.npz", expected)]
        return cls(jax.tree_util.tree_unflatten(tree, leaves), meta["configs"], hyper, meta["info"])


ALWAYS_DEFAULT = 1e9  # a margin no predicted gain reaches


def pick(scores: np.ndarray, configs: list[str], default_margin: float) -> str:
    """See CostModel.pick."""
    best = configs[int(np.argmin(scores))]
    if DEFAULT in configs and scores[configs.index(DEFAULT)] - scores.min() < default_margin:
        return DEFAULT
    return best


def train(
    graphs: list[HloGraph], times: list[dict[str, float]], configs: list[str], hyper: Hyper
) -> tuple[CostModel, list[float]]:
    """Fits the ensemble on measured programs; returns it and the mean loss curve."""
    if not graphs:
        raise UsageError("no training programs")
    if hyper.loss not in LOSSES:
        raise UsageError(f"loss {hyper.loss!r}: expected one of {', '.join(LOSSES)}")
    loss_fn = LOSSES[hyper.loss]
    batch = make_batch(graphs, configs)
    log_t = np.array([[math.log(t.get(c, 1.0)) for c in configs] for t in times], np.float32)
    valid = np.array([[c in t for c in configs] for t in times], np.float32)
    opt = optax.adam(hyper.lr)

    @jax.jit
    def step(params, state):
        loss, grads = jax.value_and_grad(lambda p: loss_fn(predict_batch(p, batch), log_t, valid))(
            params
        )
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    members, curves = [], []
    for i in range(hyper.ensemble):
        params = init_params(hyper, hyper.seed + i)
        state = opt.init(params)
        curve = []
        for _ in range(hyper.steps):
            params, state, loss = step(params, state)
            curve.append(float(loss))
        members.append(params)
        curves.append(curve)
    return CostModel(members, list(configs), hyper, {}), list(np.mean(curves, axis=0))


def out_of_fold_scores(
    graphs: list[HloGraph],
    times: list[dict[str, float]],
    configs: list[str],
    hyper: Hyper,
    folds: int,
) -> np.ndarray:
    """(programs, configs) scores, each program scored by a model trained without it
    (k-fold over programs): the honest ground for choosing hyper-parameters and the
    default margin without touching the held-out programs."""
    if not 2 <= folds <= len(graphs):
        raise UsageError(f"folds must be between 2 and {len(graphs)}, got {folds}")
    fold_of = np.random.default_rng(hyper.seed).permutation(len(graphs)) % folds
    scores = np.zeros((len(graphs), len(configs)), np.float32)
    for f in range(folds):
        inside = [i for i in range(len(graphs)) if fold_of[i] != f]
        outside = [i for i in range(len(graphs)) if fold_of[i] == f]
        model, _ = train([graphs[i] for i in inside], [times[i] for i in inside], configs, hyper)
        scores[outside] = model.predict([graphs[i] for i in outside])
    return scores
