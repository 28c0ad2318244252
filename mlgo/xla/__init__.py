"""XLA:CPU GEMM configs chosen by a learned cost model; `tuned_jit` is the entry point."""

from typing import Any


def __getattr__(name: str) -> Any:
    # Lazy, so that `mlgo --help` does not import jax.
    if name == "tuned_jit":
        from mlgo.xla.tune import tuned_jit

        return tuned_jit
    raise AttributeError(name)
