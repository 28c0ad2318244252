"""An IR2Vec vocabulary trained on a corpus: a vector for each opcode, type, operand kind
and comparison predicate of LLVM IR, in the JSON that clang reads with -ir2vec-vocab-path.

IR2Vec embeds a function as a weighted sum of its instructions' entity vectors; clang's
ML inliner can send the caller's and the callee's embeddings beside its scalar features.
The vectors come from a knowledge graph of the corpus's IR: `llvm-ir2vec triplets` writes
(head, tail, relation) ids, where an opcode has a type (relation 0), a next opcode (1) and
an i-th operand of some kind (2 + i), and TransE learns vectors with head + relation close
to tail, corrupted triplets kept at least a margin farther. LLVM trains its own seed
vocabulary so (with OpenKE); Debian's llvm ships the tool, not the vocabulary.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mlgo.corpus.format import Corpus
from mlgo.errors import MlgoError
from mlgo.llvm.toolchain import Toolchain
from mlgo.runtime.files import atomic_write_text

# The vocabulary file's sections, in the order llvm-ir2vec numbers the entities.
SECTIONS = ("Opcodes", "Types", "Arguments", "Predicates")


class VocabularyError(MlgoError):
    """llvm-ir2vec failed or wrote what this module cannot read."""


@dataclass(frozen=True)
class Graph:
    """The corpus's IR as a knowledge graph: distinct triplets and how often each occurs."""

    entities: tuple[str, ...]  # by id
    relations: int
    triplets: np.ndarray  # [n, 3] (head, tail, relation), distinct
    counts: np.ndarray  # [n] occurrences in the corpus


def _run(tool: str, args: list[str], what: str) -> str:
    """TOOL's output; a failure as one line that starts with WHAT it was run on."""
    try:
        out = subprocess.run([tool, *args], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as e:
        raise VocabularyError(f"{what}: {tool}: {e}") from e
    if out.returncode != 0:
        message = " ".join(out.stderr.split())[:200]
        raise VocabularyError(f"{what}: llvm-ir2vec {args[0]} failed: {message}")
    return out.stdout


def entities(tool: str) -> tuple[str, ...]:
    """The entity names by id: the first line counts them, then `name<TAB>id` each."""
    lines = _run(tool, ["entities", "-o", "-"], tool).splitlines()
    names = {int(i): n for n, i in (line.split("\t") for line in lines[1:])}
    if len(names) != int(lines[0]) or sorted(names) != list(range(len(names))):
        raise VocabularyError(f"{tool} entities: ids are not 0..{int(lines[0]) - 1}")
    return tuple(names[i] for i in range(len(names)))


def sections(names: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """The entities by vocabulary section: the opcodes run up to the first type (`...Ty`),
    the operand kinds from the last type to the first predicate (`ICMP_...`, `FCMP_...`)."""
    types = [i for i, n in enumerate(names) if n.endswith("Ty")]
    predicates = [i for i, n in enumerate(names) if n[1:].startswith("CMP_")]
    if not types or not predicates or types[-1] - types[0] + 1 != len(types):
        raise VocabularyError("llvm-ir2vec's entities are not opcodes, types, kinds, predicates")
    bounds = (0, types[0], types[-1] + 1, predicates[0], len(names))
    return {s: names[a:b] for s, a, b in zip(SECTIONS, bounds[:-1], bounds[1:], strict=True)}


def module_triplets(tool: str, bitcode: Path) -> tuple[int, np.ndarray]:
    """One module's (highest relation id, [n, 3] triplets)."""
    lines = _run(tool, ["triplets", str(bitcode), "-o", "-"], str(bitcode)).splitlines()
    if not lines or not lines[0].startswith("MAX_RELATION="):
        raise VocabularyError(f"{bitcode}: llvm-ir2vec wrote no MAX_RELATION header")
    rows = np.array([line.split("\t") for line in lines[1:]], np.int64).reshape(-1, 3)
    return int(lines[0].split("=")[1]), rows


def corpus_graph(tc: Toolchain, corpus: Corpus) -> Graph:
    tool = tc.tool("llvm-ir2vec")
    names = entities(tool)
    relations, parts = 0, []
    for m in corpus.modules:
        top, rows = module_triplets(tool, m.bitcode)
        relations = max(relations, top)
        parts.append(rows)
    triplets, counts = np.unique(np.concatenate(parts), axis=0, return_counts=True)
    if len(triplets) == 0 or triplets[:, :2].max() >= len(names):
        raise VocabularyError("the corpus gave no triplets over llvm-ir2vec's entities")
    return Graph(names, relations + 1, triplets, counts)


@dataclass(frozen=True)
class TransE:
    dim: int = 16
    margin: float = 1.0
    steps: int = 4000
    batch: int = 1024
    learning_rate: float = 0.01
    seed: int = 0


def train_transe(graph: Graph, cfg: TransE) -> tuple[np.ndarray, np.ndarray]:
    """[entities, dim] unit vectors and [relations, dim] vectors: head + relation near
    tail (L1), by a margin nearer than the same triplet with its head or tail replaced by a
    random entity. Triplets are drawn by how often they occur, as if trained on every
    occurrence."""
    import jax
    import jax.numpy as jnp
    import optax

    n_entities = len(graph.entities)
    key = jax.random.PRNGKey(cfg.seed)
    k_ent, k_rel, key = jax.random.split(key, 3)
    bound = 6 / np.sqrt(cfg.dim)
    params = {
        name: jax.random.uniform(k, (rows, cfg.dim), minval=-bound, maxval=bound)
        for name, k, rows in (("entity", k_ent, n_entities), ("relation", k_rel, graph.relations))
    }
    triplets = jnp.asarray(graph.triplets)
    p = jnp.asarray(graph.counts / graph.counts.sum())
    opt = optax.adam(cfg.learning_rate)

    def unit(e: jax.Array) -> jax.Array:
        return e / jnp.maximum(jnp.linalg.norm(e, axis=1, keepdims=True), 1e-9)

    def distance(params: dict, h: jax.Array, t: jax.Array, r: jax.Array) -> jax.Array:
        e = unit(params["entity"])
        return jnp.abs(e[h] + params["relation"][r] - e[t]).sum(-1)

    def loss(params: dict, batch: jax.Array, corrupt: jax.Array, head: jax.Array) -> jax.Array:
        h, t, r = batch[:, 0], batch[:, 1], batch[:, 2]
        bad_h, bad_t = jnp.where(head, corrupt, h), jnp.where(head, t, corrupt)
        pos, neg = distance(params, h, t, r), distance(params, bad_h, bad_t, r)
        return jnp.maximum(0.0, cfg.margin + pos - neg).mean()

    @jax.jit
    def step(params: dict, state: optax.OptState, key: jax.Array) -> tuple:
        k_pick, k_bad, k_side = jax.random.split(key, 3)
        batch = triplets[jax.random.choice(k_pick, len(p), (cfg.batch,), p=p)]
        corrupt = jax.random.randint(k_bad, (cfg.batch,), 0, n_entities)
        head = jax.random.bernoulli(k_side, 0.5, (cfg.batch,))
        grads = jax.grad(loss)(params, batch, corrupt, head)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    state = opt.init(params)
    for k in jax.random.split(key, cfg.steps):
        params, state = step(params, state, k)
    return np.asarray(unit(params["entity"]), np.float64), np.asarray(params["relation"])


def tail_hits(graph: Graph, entity: np.ndarray, relation: np.ndarray, k: int = 1) -> float:
    """How often, over the corpus's triplets, the true tail is among the K entities
    nearest to head + relation: how much of the graph the vectors keep."""
    h, t, r = graph.triplets.T
    guess = entity[h] + relation[r]
    distances = np.abs(guess[:, None, :] - entity[None, :, :]).sum(-1)
    nearer = (distances < distances[np.arange(len(t)), t][:, None]).sum(1)
    return float((graph.counts * (nearer < k)).sum() / graph.counts.sum())


def vocabulary_json(names: Iterable[str], vectors: np.ndarray) -> dict[str, dict[str, list[float]]]:
    by_name = dict(zip(names, vectors, strict=True))
    return {
        section: {n: [round(float(v), 6) for v in by_name[n]] for n in members}
        for section, members in sections(tuple(by_name)).items()
    }


def train_vocabulary(
    tc: Toolchain, corpus: Corpus, out: Path, cfg: TransE
) -> tuple[Graph, np.ndarray, np.ndarray]:
    """Trains a vocabulary on CORPUS's bitcode and writes it to OUT (whole or not at all):
    the graph, and the entity and relation vectors."""
    graph = corpus_graph(tc, corpus)
    entity, relation = train_transe(graph, cfg)
    atomic_write_text(out, json.dumps(vocabulary_json(graph.entities, entity)) + "\n")
    return graph, entity, relation
