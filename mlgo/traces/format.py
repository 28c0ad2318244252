"""The on-disk trace format (version 1): what `mlgo collect` writes and trainers read.

    OUT/manifest.json             format, version, problem (and whether its default decision
                                  is the compiler's own), toolchain, feature specs, and per
                                  module: its trace file, decision count, metrics, seconds;
                                  modules that failed, with the one-line reason
    OUT/modules/NAME.tfrecord     one tf.train.SequenceExample per context (per function for
                                  regalloc, one per module for inlining); its feature_lists
                                  hold every LLVM feature under LLVM's name (values
                                  flattened per step), the advice given under the problem's
                                  advice name, and `default_decision`

This is the SequenceExample layout of ml-compiler-opt's log_reader, so its trainers can
read the files. Every file is written to a temp name and renamed, so a killed collection
leaves only whole files; the manifest is rewritten as modules finish.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mlgo.errors import MlgoError, UsageError
from mlgo.llvm.log_format import TensorSpec
from mlgo.problems import Problem, get_problem
from mlgo.records import ModuleRun
from mlgo.runtime.files import atomic_path, atomic_write_text
from mlgo.runtime.inputs import read_json
from mlgo.runtime.tfutil import import_tf

FORMAT = "mlgo-traces"
VERSION = 1
DEFAULT_DECISION = "default_decision"


class TraceError(MlgoError, ValueError):
    """A trace directory or file is malformed or from another format version."""


@dataclass
class Manifest:
    problem: Problem
    toolchain: str
    corpus: str
    specs: list[dict] = field(default_factory=list)
    modules: dict[str, dict] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "format": FORMAT,
            "version": VERSION,
            "problem": self.problem.name,
            # Whether `default_decision` is the compiler's own choice or the problem's
            # documented baseline rule (regalloc: LLVM does not send its default).
            "default_is_observed": self.problem.default_is_observed,
            "feature_digest": self.problem.feature_digest,
            "toolchain": self.toolchain,
            "corpus": self.corpus,
            "features": self.specs,
            "modules": self.modules,
            "failed": self.failed,
        }

    def save(self, out: Path) -> None:
        try:
            atomic_write_text(out / "manifest.json", json.dumps(self.to_json(), indent=1))
        except OSError as e:  # the previous manifest stays whole: a rerun resumes from it
            raise TraceError(f"{out / 'manifest.json'}: cannot write ({e.strerror})") from e

    @classmethod
    def load(cls, out: Path) -> Manifest:
        path = out / "manifest.json"
        try:
            d = read_json(path, TraceError)
        except OSError as e:
            raise TraceError(f"{path}: cannot read ({e})") from e
        if not isinstance(d, dict) or d.get("format") != FORMAT or d.get("version") != VERSION:
            raise TraceError(f"{path}: not an {FORMAT} v{VERSION} manifest")
        try:
            problem = get_problem(d["problem"])
        except (KeyError, UsageError) as e:  # no problem named, or one not registered
            raise TraceError(f"{path}: {e.args[0]}") from e
        if why := problem.other_features(d.get("feature_digest")):
            raise TraceError(f"{path}: {why}")
        return cls(
            problem,
            d["toolchain"],
            d["corpus"],
            d["features"],
            d["modules"],
            d.get("failed", {}),
        )


def trace_file(name: str) -> str:
    return f"modules/{name}.tfrecord"


def write_module_trace(path: Path, run: ModuleRun, advice_name: str) -> None:
    tf = import_tf()

    examples: dict[str, tf.train.SequenceExample] = {}
    for step, context in enumerate(run.contexts):
        se = examples.get(context)
        if se is None:
            se = examples[context] = tf.train.SequenceExample()
            se.context.feature["module"].bytes_list.value.append(run.module.encode())
            se.context.feature["context"].bytes_list.value.append(context.encode())
        lists = se.feature_lists.feature_list
        for spec in run.specs:
            values = run.features[spec.name][step].reshape(-1)
            feature = lists[spec.name].feature.add()
            if spec.dtype.kind == "f":
                feature.float_list.value.extend(values.tolist())
            else:
                feature.int64_list.value.extend(values.tolist())
        lists[advice_name].feature.add().int64_list.value.append(int(run.advice[step]))
        lists[DEFAULT_DECISION].feature.add().int64_list.value.append(int(run.default[step]))
    try:
        with atomic_path(path) as tmp, tf.io.TFRecordWriter(str(tmp)) as writer:
            for se in examples.values():
                # Map order follows the process's string hashing unless made deterministic;
                # the same decisions must give the same bytes wherever they were collected.
                writer.write(se.SerializeToString(deterministic=True))
    except tf.errors.OpError as e:  # a full disk, say: the message ends with why
        raise TraceError(f"{path}: cannot write ({e.message.split('; ')[-1]})") from e


def read_module_trace(
    path: Path, specs: list[TensorSpec], advice_name: str
) -> dict[str, np.ndarray]:
    """All steps of a module's trace, concatenated over contexts: name -> [steps, ...]."""
    tf = import_tf()

    columns: dict[str, list] = {s.name: [] for s in specs}
    columns[advice_name] = []
    columns[DEFAULT_DECISION] = []
    try:
        for raw in tf.compat.v1.io.tf_record_iterator(str(path)):
            se = tf.train.SequenceExample.FromString(raw)
            lists = se.feature_lists.feature_list
            for name, column in columns.items():
                for f in lists[name].feature:
                    column.append(list(f.float_list.value) or list(f.int64_list.value))
    except tf.errors.OpError as e:
        raise TraceError(f"{path}: corrupt trace ({e.message})") from e
    out = {}
    for s in specs:
        out[s.name] = np.array(columns[s.name], dtype=s.dtype).reshape(-1, *s.shape)
    out[advice_name] = np.array(columns[advice_name], np.int64).reshape(-1)
    out[DEFAULT_DECISION] = np.array(columns[DEFAULT_DECISION], np.int64).reshape(-1)
    return out
