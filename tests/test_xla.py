"""XLA GEMM configs: the per-compilation route, extraction, measurement, model, tuned_jit."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

import jax
import numpy as np
import pytest

from mlgo.xla import tuned_jit
from mlgo.xla.config import compiler_options, parse_config
from mlgo.xla.dataset import DatasetError, collect, load_dataset
from mlgo.xla.extract import extract_graph, fingerprint, lower
from mlgo.xla.measure import MeasureSpec, summarize
from mlgo.xla.model import ALWAYS_DEFAULT, CostModel, Hyper, out_of_fold_scores, train
from mlgo.xla.programs import example_inputs, load_corpus, load_target
from mlgo.xla.report import MARGINS, SLOWDOWN_LIMIT, evaluate, fit_default_margin
from mlgo.xla.tune import choose, measured_choice
from tests.conftest import run_mlgo

CORPUS = Path(__file__).parent / "data" / "xla"
CONFIGS = ["default", "eigen", "4:4:1", "16:8:2"]


@pytest.fixture(scope="module")
def programs():
    return {p.name: p for p in load_corpus(CORPUS)}


@pytest.fixture(scope="module")
def dataset(programs, tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("xla") / "runs"
    results = list(collect(CORPUS, list(programs.values()), CONFIGS, out, MeasureSpec(rounds=3)))
    assert [e for _, e in results] == [None, None]
    return out


@pytest.fixture(scope="module")
def model_dir(dataset, tmp_path_factory: pytest.TempPathFactory) -> Path:
    ds = load_dataset(dataset)
    model, _ = train([r.graph for r in ds.records], [r.times() for r in ds.records],
                     ds.configs, Hyper(hidden=16, steps=30))  # fmt: skip
    out = tmp_path_factory.mktemp("model")
    model.save(out)
    return out


@pytest.mark.parametrize(
    "config, why",
    [
        ("64:8:4", "miscompiles"),
        ("32:32:2", "exceeds"),
        ("16:16:1", "exhausted"),
        ("big", "expected"),
        ("0:4:1", ">= 1"),
    ],
)
@pytest.mark.unit
def test_unsafe_or_malformed_configs_are_refused(config, why):
    with pytest.raises(ValueError, match=why):
        parse_config(config)


def test_two_tiles_in_one_process_compile_to_different_code(programs, tmp_path):
    program = programs["gemm_64x128x64"]
    lowered = lower(program)
    args = example_inputs(program)
    kernels = {}
    for tile in ("4:4:1", "16:8:2"):
        dump = tmp_path / tile.replace(":", "_")
        fn = lowered.compile(compiler_options={**compiler_options(tile), "xla_dump_to": str(dump)})
        np.testing.assert_allclose(fn(*args), jax.jit(program.fn)(*args), rtol=1e-5, atol=1e-4)
        assert f'value: "{tile}*vectwidth"' in next(dump.glob("*.debug_options")).read_text()
        (kernel,) = dump.glob("*dot*kernel_module.o")  # the tiled LLVM-IR GEMM, not a library call
        kernels[tile] = kernel.read_bytes()
    assert kernels["4:4:1"] != kernels["16:8:2"]
    # The default path keeps XLA's library GEMM: no dot kernel is generated.
    dump = tmp_path / "default"
    lowered.compile(compiler_options={"xla_dump_to": str(dump)})
    assert not list(dump.glob("*dot*kernel_module.o"))


def test_extraction_finds_the_dots(programs):
    lowered = lower(programs["mlp_32x64x48"])
    graph = extract_graph(lowered)
    assert [d.dot for d in graph.dots] == [
        {"m": 32, "k": 64, "n": 48, "batch": 1},
        {"m": 32, "k": 48, "n": 64, "batch": 1},
    ]
    assert fingerprint(lowered) == fingerprint(lower(programs["mlp_32x64x48"]))
    assert fingerprint(lowered) != fingerprint(lower(programs["gemm_64x128x64"]))


@pytest.mark.unit
def test_noisy_rounds_are_dropped():
    s = summarize([1.0, 1.1, 5.0, 1.05])
    assert s["rounds_kept"] == 3 and s["median_us"] == pytest.approx(1.05e6)
    assert s["halves_us"] == pytest.approx([1.0e6, 1.075e6])  # rounds 0, 2 and 1, 3


def test_dataset_round_trip_and_resume(dataset, programs):
    ds = load_dataset(dataset)
    assert [r.name for r in ds.records] == ["gemm_64x128x64", "mlp_32x64x48"]
    assert [r.held_out for r in ds.records] == [False, True]
    for r in ds.records:
        assert set(r.times()) == set(CONFIGS)
        assert all(run["rounds_kept"] >= 1 and run["spread"] >= 0 for run in r.runs.values())
        assert r.graph.dots and r.exhaustive_seconds() > 0
    assert list(collect(CORPUS, list(programs.values()), CONFIGS, dataset, MeasureSpec())) == []
    with pytest.raises(DatasetError, match="other configs"):
        list(collect(CORPUS, [], ["default"], dataset, MeasureSpec()))


@pytest.mark.slow
def test_training_reduces_the_ranking_loss(dataset):
    ds = load_dataset(dataset)
    graphs, times = [r.graph for r in ds.records], [r.times() for r in ds.records]
    model, losses = train(graphs, times, ds.configs, Hyper(hidden=16, steps=60, ensemble=2))
    assert losses[-1] < 0.5 * losses[0] and len(model.members) == 2
    # Out-of-fold: each program scored by the network trained on the other one only.
    oof = out_of_fold_scores(graphs, times, ds.configs, Hyper(hidden=16, steps=5), folds=2)
    assert oof.shape == (2, len(ds.configs)) and not np.allclose(oof, model.predict(graphs))
    margin = fit_default_margin(ds.records, model, oof)
    rows = evaluate(ds.records, model, "default", oof)
    assert margin in MARGINS and min(r.vs_default for r in rows) >= SLOWDOWN_LIMIT


@pytest.mark.slow  # a model trained
def test_listwise_training_reduces_its_loss_and_bad_losses_are_refused(dataset):
    ds = load_dataset(dataset)
    graphs, times = [r.graph for r in ds.records], [r.times() for r in ds.records]
    _, losses = train(graphs, times, ds.configs, Hyper(hidden=16, steps=60, loss="listwise"))
    assert losses[-1] < losses[0]
    with pytest.raises(ValueError, match="loss 'hinge'"):
        train(graphs, times, ds.configs, Hyper(hidden=16, steps=1, loss="hinge"))


@pytest.mark.unit
def test_measured_choice_keeps_the_default_unless_clearly_faster():
    def fast(x):
        return x

    def slow(x):
        time.sleep(2e-4)
        return x

    x = np.zeros(4)
    assert measured_choice({"default": fast, "4:4:1": slow}, (x,), {}, rounds=5) == "default"
    assert measured_choice({"default": slow, "4:4:1": fast}, (x,), {}, rounds=5) == "4:4:1"
    assert measured_choice({"default": fast, "4:4:1": fast}, (x,), {}, rounds=5) == "default"


def test_tuned_jit_matches_jax_jit_and_reuses_choices(model_dir, programs, tmp_path):
    program = programs["gemm_64x128x64"]
    args = example_inputs(program, seed=3)
    f = tuned_jit(program.fn, cost_model=str(model_dir), cache_dir=tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = f(*args)
        np.testing.assert_allclose(out, jax.jit(program.fn)(*args), rtol=1e-5, atol=1e-4)
        f(*args)
    (choice,) = f.choices.values()
    assert choice.config in CONFIGS and not choice.fallback and not choice.cached
    g = tuned_jit(program.fn, cost_model=CostModel.load(model_dir), cache_dir=tmp_path)
    assert g.choices == {} and g(*args).shape == out.shape
    assert list(g.choices.values()) == [choice]  # same HLO fingerprint: the choice is reused
    h = tuned_jit(program.fn, cost_model=str(model_dir), top_k=2, cache_dir=tmp_path)
    h(*args)  # another tuner (it verifies) makes its own choice
    assert not next(iter(h.choices.values())).cached


def test_calls_after_the_first_stay_in_jax_fast_path(model_dir, tmp_path):
    """Once a signature is tuned, a call runs no Python at all, as a jax.jit call."""
    f = tuned_jit(lambda x: x + 1.0, cost_model=str(model_dir), cache_dir=tmp_path)
    x = jax.numpy.zeros(4)
    f(x)
    python_calls = []

    def profile(frame, event, arg):
        if event == "call":
            python_calls.append(frame.f_code.co_qualname)

    sys.setprofile(profile)
    try:
        for _ in range(3):
            f(x)
    finally:
        sys.setprofile(None)
    assert python_calls == [] and f._cache_size() == 1
    assert f.lower(x).as_text() == jax.jit(lambda x: x + 1.0).lower(x).as_text()


def test_verified_choice_is_checked_and_timed(model_dir, programs):
    program = programs["mlp_32x64x48"]
    args = tuple(example_inputs(program))
    model = CostModel.load(model_dir)
    scores = {"4:4:1": 0.0, "16:8:2": 0.1, "default": 0.2, "eigen": 0.3}
    model.predict = lambda graphs: np.array([[scores[c] for c in model.configs]])
    lowered = lower(program)
    choice = choose(lowered, extract_graph(lowered), model, 2, args, {}, verify=True)
    assert choice.ranking == tuple(scores) and choice.config in ("4:4:1", "16:8:2", "default")


def test_tuned_jit_falls_back_with_a_warning(model_dir, programs, tmp_path):
    model = CostModel.load(model_dir)
    model.configs = ["64:8:4"] * len(model.configs)  # an unsafe config the model might name
    program = programs["mlp_32x64x48"]
    args = example_inputs(program)
    f = tuned_jit(program.fn, cost_model=model, cache_dir=tmp_path)
    with pytest.warns(UserWarning, match="tuning failed.*miscompiles.*default"):
        out = f(*args)
    np.testing.assert_allclose(out, jax.jit(program.fn)(*args), rtol=1e-5, atol=1e-4)
    assert [c.config for c in f.choices.values()] == ["default"]
    assert not list(tmp_path.rglob("*.json"))  # a failed tuning is not remembered


def test_a_model_that_never_leaves_the_default_costs_nothing(model_dir, tmp_path):
    model = CostModel.load(model_dir)
    model.info = {**model.info, "default_margin": ALWAYS_DEFAULT}
    model.predict = None  # it is never run, and nothing is compiled for it
    f = tuned_jit(lambda a, b: a @ b, cost_model=model, cache_dir=tmp_path)
    x = jax.numpy.ones((8, 8))
    np.testing.assert_allclose(f(x, x), x @ x)
    assert [c.config for c in f.choices.values()] == ["default"]


# A fresh process: tunes `gemm` of tests/data/xla/tiny.py once (verify), and reports how
# many XLA compilations the first call of jax.jit and of tuned_jit each made.
SECOND_PROCESS = """
import json, sys
import numpy as np
import jax
from jax import monitoring
from mlgo.xla import tuned_jit
from mlgo.xla.programs import load_target

compiles = []
monitoring.register_event_duration_secs_listener(
    lambda event, seconds, **kw: compiles.append(event)
    if event == "/jax/core/compile/backend_compile_duration" else None)
program = load_target(sys.argv[1])
args = [np.ones(a.shape, a.dtype) for a in program.args]
jax.jit(lambda *a: program.fn(*a))(*args)
jit_compiles = len(compiles)
f = tuned_jit(program.fn, cost_model=sys.argv[2], verify=True, cache_dir=sys.argv[3])
out = f(*args)
tuned_compiles = len(compiles) - jit_compiles
np.testing.assert_allclose(out, jax.jit(program.fn)(*args), rtol=1e-5, atol=1e-4)
(choice,) = f.choices.values()
print(json.dumps({"jit": jit_compiles, "tuned": tuned_compiles,
                  "cached": choice.cached, "config": choice.config}))
"""


def _second_process(model_dir: Path, cache: Path) -> tuple[dict, list[str]]:
    target = f"{CORPUS / 'tiny.py'}:gemm"
    proc = subprocess.run([sys.executable, "-c", SECOND_PROCESS, target, str(model_dir),
                           str(cache)], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if "tuned_jit" in ln or "Traceback" in ln]
    return json.loads(proc.stdout.splitlines()[-1]), lines


@pytest.fixture(scope="module")
def tuned_once(model_dir, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    """A tuning cache filled by one process that tuned with verification."""
    cache = tmp_path_factory.mktemp("cache")
    cold, _ = _second_process(model_dir, cache)
    assert not cold["cached"] and cold["tuned"] > cold["jit"]  # extraction, model, timing
    return cold, cache


def _entry(cache: Path) -> Path:
    (entry,) = [p for p in cache.rglob("*.json") if p.parent.name != "lowered"]
    return entry


@pytest.mark.slow
def test_a_second_process_reuses_the_persistent_choice(model_dir, tuned_once):
    cold, cache = tuned_once
    warm, warnings_seen = _second_process(model_dir, cache)
    assert warm["cached"] and warm["config"] == cold["config"] and warnings_seen == []
    assert warm["tuned"] <= warm["jit"]  # no model, no verification: jax.jit's compilations
    record = json.loads(_entry(cache).read_text())
    assert record["config"] == cold["config"] and record["jaxlib"] == jax.lib.__version__


@pytest.mark.slow
def test_a_corrupt_cache_file_is_ignored_with_one_warning(model_dir, tuned_once, tmp_path):
    cache = tmp_path / "cache"
    shutil.copytree(tuned_once[1], cache)
    entry = _entry(cache)
    entry.write_text('{"config": "default", "rank')  # cut short
    again, warnings_seen = _second_process(model_dir, cache)
    assert len(warnings_seen) == 1 and "ignoring unreadable tuning cache file" in warnings_seen[0]
    assert not again["cached"] and json.loads(entry.read_text())["config"] == again["config"]
    entry.write_text(json.dumps({"config": "64:8:4"}))  # a config that would miscompile
    _, warnings_seen = _second_process(model_dir, cache)
    assert len(warnings_seen) == 1 and "miscompiles" in warnings_seen[0]


@pytest.mark.unit
def test_targets_load_from_files_and_corpora():
    assert load_target(f"{CORPUS / 'tiny.py'}:gemm").args[0].shape == (64, 128)
    assert load_target(f"{CORPUS}:mlp_32x64x48").family == "mlp"
    with pytest.raises(ValueError, match="EXAMPLE_ARGS"):
        load_target(f"{CORPUS / 'tiny.py'}:mlp")


@pytest.mark.parametrize(
    "args, message",
    [
        (["xla", "tune", "nowhere.py:f"], "nowhere.py: no such program file"),
        (["xla", "tune", "tests/data/xla/tiny.py"], "expected FILE.py:FUNCTION"),
        (["xla", "train", "--data", "nowhere", "--out", "x"], "not a dataset"),
        (["xla", "collect", "--programs", "tests/data/xla", "--configs", "default,8:8:8"],
         "miscompiles"),
        (["xla", "report", "--data", "nowhere", "--model", "x"], "not a dataset"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line(args, message):
    proc = run_mlgo(*args, timeout=120)
    assert proc.returncode == 2
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
