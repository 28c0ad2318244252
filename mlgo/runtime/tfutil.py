"""Importing TensorFlow (and tf-agents) quietly. TF 2.21 logs through absl before any log
level applies (oneDNN and CUDA notices on every start), and gym, which tf-agents imports,
prints a deprecation banner; their start-up stderr is silenced. A failed import still
raises."""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType


def import_quietly(name: str) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # errors still raise in Python
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # tf-agents needs Keras 2
    # The policies are small: CPU only, which also spares a cuInit error on GPU-less hosts.
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "-1")
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        module = importlib.import_module(name)
        sys.stderr.flush()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
    if name == "tensorflow":
        module.get_logger().setLevel("ERROR")
    return module


def import_tf() -> ModuleType:
    return import_quietly("tensorflow")
