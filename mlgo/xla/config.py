"""The decision: which GEMM code path XLA:CPU uses, chosen per compilation.

A config is `default` (XLA's own choice: YNNPACK fusions for dots), `eigen` (no YNNPACK,
single-threaded Eigen) or a tile `M:K:N` for the tiled LLVM-IR GEMM emitter (N in vector
widths). The emitter is reached only when YNNPACK is off and Eigen is single-threaded
(`CanEmitTiledLlvmIrGemm` refuses multi-threaded Eigen), and its tile reaches XLA through
`DebugOptions.xla_backend_extra_options` as `xla_llvm_ir_gemm_tile_size=M:K:N*vectwidth`.

jax passes `compiler_options` as string overrides, which cannot encode that map field. So
`compiler_options(config)` carries the map under our own key, and a small hook around
jax's `get_compile_options` writes it into the CompileOptions proto of that one compilation
(field 500 of DebugOptions). The key is part of jax's compilation cache key, so two configs
never share an executable, and nothing is process-global.

XLA CHECK-fails (aborts the process) on a malformed tile, very large tiles make LLVM use
tens of GB, and N = 4 vector widths miscompiles when N does not divide the dot's columns
(wrong results, heap corruption seen with jaxlib 0.10.2), so tiles are validated here
before they reach the compiler.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mlgo.errors import UsageError

DEFAULT = "default"
EIGEN = "eigen"
HOOK_KEY = "mlgo_backend_extra_options"
# Above this M*K*N the emitter's unrolled tile made LLVM use >10 GB on a 128^3 GEMM.
MAX_TILE_PRODUCT = 256
MAX_TILE_N = 2
_TILE = re.compile(r"^(\d+):(\d+):(\d+)$")

# The search space: the default path, Eigen, and a grid of tiles within the safe product,
# including XLA's own built-in tile (11:9:1). Also tried, and left out because they never
# beat both default and Eigen: XNNPACK dot fusions (within 1% of Eigen), YNNPACK with dot
# fusions only, and oneDNN (its compilation fails on these programs).
SEARCH_SPACE = (
    DEFAULT,
    EIGEN,
    "4:4:1",
    "8:8:1",
    "16:8:1",
    "11:9:1",
    "4:8:2",
    "8:4:2",
    "8:8:2",
    "16:4:2",
    "16:8:2",
    "32:4:1",
    "4:16:2",
    "2:16:2",
    "4:32:2",
    "32:8:1",
)
# Tiles within the product that still took LLVM past the 12 GB limit (std::bad_alloc).
CRASHED = {"16:16:1": "a grouped matmul (moe_24x24x48x4)"}


@dataclass(frozen=True)
class Tile:
    m: int
    k: int
    n: int  # in vector widths


def parse_config(config: str) -> Tile | None:
    """The tile of a config (None for default/eigen); ValueError names what is wrong."""
    if config in (DEFAULT, EIGEN):
        return None
    match = _TILE.match(config)
    if not match:
        raise UsageError(f"config {config!r}: expected 'default', 'eigen' or a tile M:K:N")
    tile = Tile(*(int(g) for g in match.groups()))
    if min(tile.m, tile.k, tile.n) < 1:
        raise UsageError(f"config {config!r}: tile sizes must be >= 1")
    if tile.n > MAX_TILE_N:
        raise UsageError(
            f"config {config!r}: N = {tile.n} vector widths miscompiles; use N <= {MAX_TILE_N}"
        )
    if config in CRASHED:
        raise UsageError(f"config {config!r}: exhausted LLVM's memory on {CRASHED[config]}")
    if tile.m * tile.k * tile.n > MAX_TILE_PRODUCT:
        raise UsageError(
            f"config {config!r}: M*K*N = {tile.m * tile.k * tile.n} exceeds "
            f"{MAX_TILE_PRODUCT} (larger tiles exhaust memory in LLVM)"
        )
    return tile


def compiler_options(config: str) -> dict[str, str | bool]:
    """`compiler_options` for `jax.jit(...).lower(...).compile()` that select `config`."""
    tile = parse_config(config)
    if config == DEFAULT:
        return {}
    install_hook()
    opts: dict[str, str | bool] = {
        "xla_cpu_experimental_ynn_fusion_type": "",
        "xla_cpu_multi_thread_eigen": False,
    }
    if tile is not None:
        opts[HOOK_KEY] = (
            "xla_force_enable_experimental_llvm_ir_gemm=,"
            f"xla_llvm_ir_gemm_tile_size={tile.m}:{tile.k}:{tile.n}*vectwidth"
        )
    return opts


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def backend_extra_options_patch(options: dict[str, str]) -> bytes:
    """Serialized CompileOptionsProto fragment setting DebugOptions.xla_backend_extra_options.

    CompileOptionsProto.executable_build_options = 3, ExecutableBuildOptionsProto.debug_options
    = 3, DebugOptions.xla_backend_extra_options = 500 (map entries: key 1, value 2). Appending
    it to a serialized proto merges it in.
    """
    entries = b"".join(
        _field(500, _field(1, k.encode()) + _field(2, v.encode())) for k, v in options.items()
    )
    return _field(3, _field(3, entries))


def _parse_extra(spec: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in spec.split(","))


_installed = False


def install_hook() -> None:
    """Wraps jax's get_compile_options once so HOOK_KEY lands in the proto (idempotent)."""
    global _installed
    if _installed:
        return
    from jax._src import compiler

    original = compiler.get_compile_options

    def get_compile_options(*args, env_options_overrides=None, **kwargs):
        extra = None
        if env_options_overrides:
            env_options_overrides = dict(env_options_overrides)
            extra = env_options_overrides.pop(HOOK_KEY, None)
        options = original(*args, env_options_overrides=env_options_overrides, **kwargs)
        if extra:
            patched = options.SerializeAsString() + backend_extra_options_patch(_parse_extra(extra))
            # ParseFromString builds a new CompileOptions; it does not update in place.
            options = type(options).ParseFromString(patched)
        return options

    compiler.get_compile_options = get_compile_options
    _installed = True
