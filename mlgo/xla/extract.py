"""From a program to the graph the cost model reads: XLA's optimized HLO, parsed.

The program is compiled on the LLVM-IR path (the `eigen` config: the same optimized HLO as
every tile config; LLVM at -O0, since only the HLO is wanted) and `Compiled.as_text()` is
parsed into instructions with their opcode, result shape and operands, across all
computations, so fusion bodies are part of the graph.
Dots are the nodes the tile decision acts on; their M, K, N and batch sizes are kept.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import asdict, dataclass, field

import jax

from mlgo.errors import UsageError
from mlgo.xla.config import EIGEN, compiler_options
from mlgo.xla.programs import Program

_INSTR = re.compile(
    r"^\s*(?P<root>ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<shape>\([^=]*?\)|\S+)\s+"
    r"(?P<op>[\w\-]+)\((?P<rest>.*)$"
)
_COMP = re.compile(r"^\s*(?P<entry>ENTRY\s+)?%?(?P<name>[\w.\-]+)\s.*\{\s*$")
_ARRAY = re.compile(r"(?P<dtype>[a-z]+\d*)\[(?P<dims>[\d,]*)\]")
_DIMS = re.compile(r"(lhs_batch_dims|lhs_contracting_dims|rhs_contracting_dims)=\{([\d,]*)\}")


@dataclass
class Node:
    name: str
    op: str
    dtype: str
    dims: list[int]
    operands: list[int]
    computation: str
    entry: bool
    root: bool
    dot: dict[str, int] = field(default_factory=dict)  # m, k, n, batch for dots


@dataclass
class HloGraph:
    module: str
    nodes: list[Node]

    def to_json(self) -> dict:
        return {"module": self.module, "nodes": [asdict(n) for n in self.nodes]}

    @classmethod
    def from_json(cls, data: dict) -> HloGraph:
        return cls(data["module"], [Node(**n) for n in data["nodes"]])

    @property
    def dots(self) -> list[Node]:
        return [n for n in self.nodes if n.op == "dot"]


def _shape(text: str) -> tuple[str, list[int]]:
    """dtype and dims of an array shape; a tuple's first element stands for it."""
    m = _ARRAY.search(text)
    if not m:
        return "token", []
    return m["dtype"], [int(d) for d in m["dims"].split(",") if d]


def _dot_sizes(node_dims: list[int], lhs: list[int], rest: str) -> dict[str, int]:
    attrs = {k: [int(x) for x in v.split(",") if x] for k, v in _DIMS.findall(rest)}
    batch = math.prod(lhs[d] for d in attrs.get("lhs_batch_dims", []))
    k = math.prod(lhs[d] for d in attrs.get("lhs_contracting_dims", []))
    out = math.prod(node_dims) // max(batch, 1)
    n_batch = len(attrs.get("lhs_batch_dims", []))
    m = math.prod(
        lhs[d]
        for d in range(len(lhs))
        if d >= n_batch and d not in attrs.get("lhs_contracting_dims", [])
    )
    return {"m": max(m, 1), "k": max(k, 1), "n": max(out // max(m, 1), 1), "batch": max(batch, 1)}


def parse_hlo(text: str) -> HloGraph:
    """Instructions of every computation of an HLO module's text, operands as node indices."""
    nodes: list[Node] = []
    module = "module"
    comp, entry = "", False
    index: dict[tuple[str, str], int] = {}
    for line in text.splitlines():
        if line.startswith("HloModule"):
            module = line.split()[1].rstrip(",")
            continue
        inst = _INSTR.match(line)
        if inst is None:
            c = _COMP.match(line)
            if c and "=" not in line.split("{")[0]:
                comp, entry = c["name"], bool(c["entry"])
            continue
        dtype, dims = _shape(inst["shape"])
        operand_text = inst["rest"].split("),", 1)[0]
        operands = [
            index[(comp, o)] for o in re.findall(r"%([\w.\-]+)", operand_text) if (comp, o) in index
        ]
        node = Node(
            inst["name"], inst["op"], dtype, dims, operands, comp, entry, bool(inst["root"])
        )
        if node.op == "dot" and operands:
            node.dot = _dot_sizes(dims, nodes[operands[0]].dims, inst["rest"])
        index[(comp, node.name)] = len(nodes)
        nodes.append(node)
    if not nodes:
        raise UsageError("no HLO instructions found in the module text")
    return HloGraph(module, nodes)


def lower(program: Program) -> jax.stages.Lowered:
    return jax.jit(program.fn).lower(*program.args)


def fingerprint(lowered: jax.stages.Lowered) -> str:
    """A stable key for a computation: the hash of its StableHLO text."""
    return hashlib.sha256(lowered.as_text().encode()).hexdigest()[:16]


def optimized_hlo(lowered: jax.stages.Lowered) -> str:
    """The optimized HLO's text. LLVM runs at -O0 here: the HLO passes, and so the graph,
    are the same, and the compilation takes a fraction of a real one."""
    options = {**compiler_options(EIGEN), "xla_backend_optimization_level": 0}
    return lowered.compile(compiler_options=options).as_text()


def extract_graph(lowered: jax.stages.Lowered) -> HloGraph:
    return parse_hlo(optimized_hlo(lowered))


_METADATA = re.compile(r", metadata=\{[^{}]*\}")


def hlo_fingerprint(text: str) -> str:
    """A key for what XLA will compile: the optimized HLO's computations, without the
    module's name and source locations, so the same program written twice shares it."""
    lines = text.splitlines()
    kept = [_METADATA.sub("", ln) for ln in lines if ln.startswith(("%", "ENTRY", "}", " "))]
    return hashlib.sha256("\n".join(kept).encode()).hexdigest()[:16]
