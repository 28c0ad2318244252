"""The fast tier: pure functions on small inputs, no clang, no network, no training.

`python -m pytest -q -m unit` runs these and the other `unit` tests in seconds.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from mlgo.corpus.format import CorpusError, Module
from mlgo.data import ir2vec_vocabulary, shipped_policy
from mlgo.errors import UsageError
from mlgo.llvm.driver import opt_level
from mlgo.llvm.log_format import (
    Header,
    LogFormatError,
    LogReader,
    LogWriter,
    Observation,
    TensorSpec,
    element_column,
    stack_features,
    tensor_of,
)
from mlgo.packages.recipes import available_recipes, load_recipe
from mlgo.problems import Derived, at_link, get_problem, problems
from mlgo.problems.normalizer import Normalizer
from mlgo.problems.policy_files import load_policy
from mlgo.problems.regalloc_eviction import VIRT_REG, spill_costs
from mlgo.runtime.commands import BuildError
from mlgo.serve.guard import default_args, guarded_object
from mlgo.train import Adam
from mlgo.train.es import _ranks
from mlgo.train.evaluate import Evaluation
from mlgo.train.rollouts import penalized_reduction
from tests.cli_helpers import POLICIES

pytestmark = pytest.mark.unit

INLINING = get_problem("inlining-size")
REGALLOC = get_problem("regalloc-eviction")


# --- the training-log format -------------------------------------------------------------


def test_header_survives_a_round_trip_through_json():
    header = Header(
        (TensorSpec("a", "int64_t", (1,)), TensorSpec("b", "double", (2, 2), port=1)),
        advice=TensorSpec("out", "int64_t", (1,)),
    )
    assert Header.parse(json.dumps(header.to_json()).encode()) == header
    assert header.features[1].num_bytes == 4 * 8


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"name": "x", "type": "bool", "shape": [1]}, "unknown type 'bool'"),
        ({"name": "x", "type": "float"}, "bad tensor spec"),
        ({"name": "x", "type": "float", "shape": ["two"]}, "bad tensor spec"),
    ],
)
def test_a_bad_tensor_spec_says_which(spec, message):
    with pytest.raises(LogFormatError, match=message):
        TensorSpec.from_json(spec)


def test_contexts_switch_between_observations():
    spec = TensorSpec("a", "int32_t", (2,))
    buf = io.BytesIO()
    writer = LogWriter(buf, Header((spec,)))
    for context, value in (("f", 1), ("f", 2), ("g", 3)):
        writer.context(context)
        writer.observation({"a": np.array([value, -value], np.int32)})
    obs = list(LogReader(io.BytesIO(buf.getvalue())).observations())
    assert [(o.context, o.index) for o in obs] == [("f", 0), ("f", 1), ("g", 2)]
    stacked = stack_features((spec,), [o.features for o in obs])
    assert stacked["a"].tolist() == [[1, -1], [2, -2], [3, -3]]


def test_no_observations_stack_to_empty_arrays_of_the_right_shape():
    got = stack_features((TensorSpec("m", "float", (1, 33)),), [])
    assert got["m"].shape == (0, 1, 33) and got["m"].dtype == np.float32


# --- the normalizer ----------------------------------------------------------------------


def test_derived_columns_are_computed_from_the_named_features():
    derived = (Derived("margin", "t", "-", "c"), Derived("under", "c", "<", "t"))
    norm = Normalizer(("c", "t"), [], derived)
    got = norm.expand(np.array([[3.0, 5.0], [7.0, 5.0]]))
    assert got.tolist() == [[3.0, 5.0, 2.0, 1.0], [7.0, 5.0, -2.0, 0.0]]
    assert norm.columns == 4 and norm.width == 12


def test_an_unknown_derived_op_is_refused():
    with pytest.raises(ValueError, match="unknown op '>'"):
        Derived("x", "a", ">", "b")


def test_normalizer_json_round_trip_transforms_identically():
    rng = np.random.default_rng(0)
    x = rng.exponential(5.0, (300, 2))
    norm = Normalizer.fit(["a", "b"], x, (Derived("d", "a", "-", "b"),), n=16)
    again = Normalizer.from_json(json.loads(json.dumps(norm.to_json())))
    assert np.array_equal(again.transform(x), norm.transform(x))
    out = norm.transform(x)
    c = norm.columns
    assert np.allclose(out[:, c : 2 * c], np.sqrt(out[:, :c]))
    assert np.allclose(out[:, 2 * c :], out[:, :c] ** 2)


def test_a_constant_feature_normalizes_to_a_step():
    norm = Normalizer.fit(["k"], np.full((50, 1), 4.0))
    assert norm.transform(np.array([[3.0], [4.0], [5.0]]))[:, 0].tolist() == [0.0, 1.0, 1.0]


def test_a_policy_reads_a_decision_off_the_channel_in_one_go_as_it_reads_each_feature():
    policy = load_policy(shipped_policy("inlining-size"))
    names = policy.normalizer.features
    specs = tuple(TensorSpec(f, "int64_t", (1,)) for f in names)
    odd = (TensorSpec("wide", "int64_t", (3,)), TensorSpec("ratio", "float", (1,)))
    buf = io.BytesIO()
    w = LogWriter(buf, Header(specs + odd, advice=TensorSpec("a", "int64_t", (1,))))
    for k in range(3):
        values = {f: np.array([k * 1000 + 7 * j - 50]) for j, f in enumerate(names)}
        w.observation(values | {"wide": np.array([1, 2, 3 + k]), "ratio": np.array([0.5])})
    buf.seek(0)
    for obs in LogReader(buf).observations():
        one_by_one = np.array([float(obs.features[f][0]) for f in names])
        assert np.array_equal(policy.raw_features(obs), one_by_one)
        assert np.array_equal(obs.features.gather((("wide", 2), ("wide", 0))), [3 + obs.index, 1])
        for reads in ((("wide", 3),), (("ratio", None), ("wide", 0)), (("absent", None),)):
            assert obs.features.gather(reads) is None  # out of range, two dtypes, not sent


def column_by_column(norm: Normalizer, x: np.ndarray) -> np.ndarray:
    """The transform as it was first written, one searchsorted per column: the reference."""
    columns = norm.expand(x)
    out = np.empty((columns.shape[0], norm.width), np.float32)
    c = norm.columns
    for j, q in enumerate(norm.quantiles):
        frac = np.searchsorted(q, columns[:, j], side="right") / max(len(q), 1)
        out[:, j], out[:, c + j], out[:, 2 * c + j] = frac, np.sqrt(frac), frac * frac
    return out


def test_a_decision_normalizes_bit_for_bit_as_column_by_column_whether_alone_or_in_bulk():
    from mlgo.problems import normalizer

    norm = load_policy(shipped_policy("inlining-size")).normalizer
    # an old policy's column whose boundaries end in NaN (what `fit` now leaves out)
    norm = replace(norm, quantiles=[*norm.quantiles[:-1], np.array([1.0, 2.0, np.nan])])
    rng = np.random.default_rng(3)
    n = normalizer.AT_ONCE // sum(len(q) for q in norm.quantiles) + 50  # past the at-once rows
    x = rng.choice([-1, 0, 1, 2, 3, 7, 40, 1000, 10**6], (n, len(norm.features))).astype(float)
    on_boundaries = [q[rng.integers(len(q), size=n)] for q in norm.quantiles[: x.shape[1]]]
    x[: n // 2] = np.stack(on_boundaries, 1)[: n // 2]  # ties, where `side="right"` counts
    x[::7, 3], x[::11, 5], x[::13, 0] = np.inf, -np.inf, np.nan
    x[1::17, -1] = np.nextafter(x[1::17, -1], -np.inf)
    want = column_by_column(norm, x)
    bulk = norm.transform(x)
    assert bulk.dtype == np.float32 and bulk.tobytes() == want.tobytes()
    for i in range(0, n, 97):
        assert norm.transform(x[i]).tobytes() == want[i : i + 1].tobytes()


# --- problem declarations ----------------------------------------------------------------


def test_the_registry_knows_every_problem_and_names_them_when_asked_for_another():
    names = [
        "inlining-size",
        "inlining-size-ir2vec",
        "inlining-size-link",
        "inlining-size-thin",
        "inlining-speed",
        "regalloc-eviction",
    ]
    assert [p.name for p in problems()] == names
    with pytest.raises(UsageError, match=f"known: {', '.join(names)}"):
        get_problem("loop-unroll")
    stages = ["compile", "compile", "link", "thin-link", "compile", "compile"]
    assert [p.stage for p in problems()] == stages
    assert at_link("inlining-size", "thin").name == "inlining-size-thin"
    assert at_link("inlining-size-link", "full").name == "inlining-size-link"
    with pytest.raises(UsageError, match="--lto thin tunes the inliner of the link"):
        at_link("regalloc-eviction", "thin")
    link = get_problem("inlining-size-link")
    assert link.flags_for_serving("/b") == INLINING.flags_for_serving("/b")


def test_inlining_trains_with_the_default_and_serves_without_it():
    train, serve = INLINING.channel_flags("/b"), INLINING.flags_for_serving("/b")
    assert "-inliner-interactive-channel-base=/b" in train and serve == train[:-2]
    assert train[-1] == "-inliner-interactive-include-default"
    assert INLINING.flags_for_serving("/b", default=True) == train  # for a gated policy
    assert INLINING.opt_level == "-Oz" and INLINING.reward_metric == "text_once"
    obs = Observation("f", 0, {"inlining_default": np.array([1])})
    assert INLINING.default_advice(obs) == 1
    INLINING.validate(obs, np.array([0]))
    with pytest.raises(ValueError, match="must be 0 or 1, got 2"):
        INLINING.validate(obs, np.array([2]))


def test_the_embeddings_problem_is_inlining_with_a_vocabulary_and_vector_elements():
    ir2vec = get_problem("inlining-size-ir2vec")
    vocabulary = ["-mllvm", f"-ml-inliner-ir2vec-vocab-file={ir2vec_vocabulary()}"]
    vocabulary += ["-mllvm", f"-ir2vec-vocab-path={ir2vec_vocabulary()}"]
    assert ir2vec.channel_flags("/b") == INLINING.channel_flags("/b") + vocabulary
    assert ir2vec.flags_for_serving("/b") == INLINING.flags_for_serving("/b") + vocabulary
    dim = len(json.loads(ir2vec_vocabulary().read_text())["Opcodes"]["Add"])
    extra = ir2vec.feature_names[len(INLINING.feature_names) :]
    assert extra[0] == "callee_embedding.0" and extra[-1] == f"caller_embedding.{dim - 1}"
    assert len(extra) == 2 * dim and ir2vec.slots == 1 and ir2vec.plugin
    assert list(ir2vec.advisor_flags) == vocabulary  # the plugin's compiles get them too
    assert ir2vec.reward_metric == INLINING.reward_metric and ir2vec.opt_level == "-Oz"
    # a policy reads an element of a vector as a column, a scalar as itself
    sent = {"callee_embedding": np.arange(2 * dim).reshape(2, dim), "callee_users": np.arange(4, 6)}
    assert element_column(sent, "callee_embedding.3", 2).tolist() == [3, dim + 3]
    assert element_column(sent, "callee_users", 2).tolist() == [4, 5]
    assert tensor_of("caller_embedding.7") == "caller_embedding"


def test_inlining_for_speed_is_inlining_at_o2_without_the_advisors_growth_cap():
    """Given clang's own answers, LLVM's ML inliner builds what clang -O2 builds only with
    its growth cap lifted; and with no cost of speed on a corpus, only a workload trains it."""
    speed = get_problem("inlining-speed")
    uncapped = ["-mllvm", "-ml-advisor-size-increase-threshold=1000"]
    assert speed.channel_flags("/b") == INLINING.channel_flags("/b") + uncapped
    assert speed.flags_for_serving("/b") == INLINING.flags_for_serving("/b") + uncapped
    assert list(speed.advisor_flags) == uncapped and speed.plugin
    assert speed.feature_names == INLINING.feature_names and speed.derived == INLINING.derived
    assert (speed.opt_level, speed.aim, speed.needs_workload) == ("-O2", "speed", True)
    assert speed.starts_from is None and speed.reward_metric == "text_size"
    with pytest.raises(UsageError, match="only a speed problem needs a workload"):
        replace(INLINING, needs_workload=True)


def test_a_departure_gate_follows_the_default_unless_confident():
    """p(other) >= t, as one float32 logit margin: 0.5 is argmax, 1 is the default."""
    policy = replace(load_policy(POLICIES / "inlining-size"), departure_threshold=None)
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 3, (2000, 2)).astype(np.float32)
    default = rng.integers(0, 2, 2000)
    gated = lambda t: replace(policy, departure_threshold=t).gate(logits, default)  # noqa: E731
    assert np.array_equal(gated(0.5), np.argmax(logits, 1))
    assert np.array_equal(gated(1.0), default)
    p_other = 1 / (
        1 + np.exp(logits[np.arange(2000), default] - logits[np.arange(2000), 1 - default])
    )
    assert np.array_equal(gated(0.9) != default, p_other >= 0.9)
    assert 0 < (gated(0.9) != default).sum() < (gated(0.5) != default).sum()
    x = np.zeros((1, len(policy.normalizer.features)))
    features = {f: x[:, j] for j, f in enumerate(policy.normalizer.features)}
    answer = int(np.argmax(policy.logits(x)[0]))
    obs = Observation("f", 0, {**features, "inlining_default": np.array([1 - answer])})
    assert policy(obs) == answer and replace(policy, departure_threshold=1.0)(obs) == 1 - answer


def test_regalloc_declares_llvms_tensors_and_its_derived_inputs_name_real_features():
    assert REGALLOC.flags_for_serving("/b") == REGALLOC.channel_flags("/b")
    specs = {name: (dtype, shape) for name, dtype, shape in REGALLOC.input_specs}
    assert list(specs) == list(REGALLOC.feature_names)
    assert specs["mask"] == ("int64", (1, 33)) and specs["progress"] == ("float32", (1,))
    assert specs["liverange_size"] == ("float32", (1, 33))
    for problem in (INLINING, REGALLOC):
        known = set(problem.feature_names)
        for d in problem.derived:
            assert {d.left, d.right.removeprefix("self:")} <= known, d


def _eviction(**columns: dict[int, float]) -> Observation:
    """A regalloc observation where only the given slots of the given features are set."""
    feats = {f: np.zeros((1, 33), np.float32) for f in REGALLOC.feature_names}
    feats["progress"] = np.zeros(1, np.float32)
    for name, slots in columns.items():
        for slot, value in slots.items():
            feats[name][0, slot] = value
    return Observation("f", 0, feats)


def test_default_eviction_rule_picks_the_lightest_legal_interference():
    # slot 5 is lighter than the live range, slot 7 heavier: evict 5
    obs = _eviction(mask={5: 1, 7: 1, VIRT_REG: 1}, use_def_density={5: 1.0, 7: 9.0, VIRT_REG: 4.0})
    assert REGALLOC.default_advice(obs) == 5
    # nothing lighter and nothing free: evict nothing
    heavy = _eviction(mask={7: 1, VIRT_REG: 1}, use_def_density={7: 9.0, VIRT_REG: 4.0})
    assert REGALLOC.default_advice(heavy) == VIRT_REG
    # an unspillable live range must evict something, the first legal slot at worst
    forced = _eviction(mask={7: 1}, use_def_density={7: 9.0})
    assert REGALLOC.default_advice(forced) == 7


def test_spill_costs_are_read_from_the_allocators_remarks(tmp_path):
    remarks = tmp_path / "r.yaml"
    remarks.write_text(
        "--- !Missed\nPass: regalloc\nName: SpillReloadCopies\nFunction: main\nArgs:\n"
        "  - NumSpills:       '2'\n  - TotalSpillsCost: '3.5'\n"
        "--- !Missed\nPass: regalloc\nName: LoopSpillReloadCopies\nFunction: loop\nArgs:\n"
        "  - TotalSpillsCost: '99'\n"
    )
    assert spill_costs(remarks) == {"main": {"NumSpills": 2.0, "TotalSpillsCost": 3.5}}


# --- compile command construction ---------------------------------------------------------

ARGS = (
    "-cc1",
    "-triple",
    "x86_64-pc-linux-gnu",
    "-O2",
    "-fembed-bitcode=all",
    "-split-dwarf-file",
    "a.dwo",
    "-dependency-file=a.d",
    "-MT",
    "a.o",
    "-o",
    "a.o",
    "-Oz",
    "-fprofile-instrument-use-path=a.profdata",
)


def test_compile_command_drops_build_tree_flags_and_appends_the_module():
    module = Module("pkg/dir/a.o", Path("c/pkg/dir/a.o.bc"), ARGS)
    assert module.package == "pkg" and module.opt_level == "-Oz" and module.profiled
    cmd = module.compile_command("clang", Path("out.o"), "-Oz", ["-mllvm", "-x"])
    assert cmd == [
        "clang",
        "-cc1",
        "-triple",
        "x86_64-pc-linux-gnu",
        "-O2",
        "-Oz",
        "-fprofile-instrument-use-path=a.profdata",
        "-mllvm",
        "-x",
        "-x",
        "ir",
        "c/pkg/dir/a.o.bc",
        "-o",
        "out.o",
    ]


def test_a_module_is_not_re_leveled():
    module = Module("pkg/a.o", Path("a.bc"), ("-cc1", "-O2"))
    with pytest.raises(CorpusError, match="recorded at -O2, needed at -Oz"):
        module.compile_command("clang", Path("o"), "-Oz")
    assert Module("pkg/b.o", Path("b.bc"), ("-cc1",)).opt_level == "-O0"


@pytest.mark.parametrize(
    ("args", "language"),
    [
        (("-main-file-name", "a.c", "-std=gnu99"), "c"),
        (("-main-file-name", "dir/a.cc"), "c++"),
        (("-main-file-name", "a.c", "-std=gnu++17"), "c++"),  # clang++ on a .c file
        (("-main-file-name", "a.s"), None),
        ((), None),
    ],
)
def test_a_modules_language_is_its_sources(args, language):
    assert Module("pkg/a.o", Path("a.bc"), ("-cc1", *args)).language == language


# --- recipe parsing ----------------------------------------------------------------------


def test_every_shipped_recipe_parses():
    names = available_recipes()
    assert len(names) >= 20 and "zlib" in names
    for name in names:
        recipe = load_recipe(name)
        assert recipe.name == name and recipe.source and recipe.build, name


def test_a_recipe_is_found_by_its_name_or_its_debian_source(tmp_path):
    (tmp_path / "lua.toml").write_text(
        'source = "lua5.4"\nbuild = ["make"]\ntest = ["make test"]\ntest_timeout_s = 30\n'
    )
    by_name, by_source = load_recipe("lua", tmp_path), load_recipe("lua5.4", tmp_path)
    assert by_name == by_source
    assert by_name.build == ("make",) and by_name.test_timeout_s == 30.0
    assert by_name.build_timeout_s == 1800.0 and by_name.configure == ()


@pytest.mark.parametrize(
    "text, message",
    [('source = "x"\n', "bad recipe.*'build'"), ("source = [\n", "bad recipe"), ("", "bad recipe")],
)
def test_a_bad_recipe_names_its_file(tmp_path, text, message):
    (tmp_path / "bad.toml").write_text(text)
    with pytest.raises(BuildError, match=f"bad.toml: {message}"):
        load_recipe("bad", tmp_path)


def test_an_unknown_recipe_lists_the_known_ones(tmp_path):
    with pytest.raises(BuildError, match="no recipe nothing.toml.*have: .*zlib"):
        load_recipe("nothing")
    (tmp_path / "mine.toml").write_text('source = "mine"\nbuild = ["make"]\n')
    with pytest.raises(BuildError, match=f"no recipe nothing.toml in {tmp_path} .have: mine.$"):
        load_recipe("nothing", tmp_path)


# --- reward shaping ----------------------------------------------------------------------


def test_ranks_are_centered_and_ignore_how_far_an_outlier_is():
    r = _ranks(np.array([0.1, -5.0, 0.2, 100.0]))
    assert r == pytest.approx([-1 / 6, -0.5, 1 / 6, 0.5])
    assert _ranks(np.array([0.1, -5.0, 0.2, 0.3])).tolist() == r.tolist()
    assert _ranks(np.array([7.0])).tolist() == [-0.5]


def test_reduction_without_penalty_is_the_plain_relative_saving():
    base = np.array([100.0, 50.0])
    costs = np.array([[90.0, 55.0], [100.0, 50.0]])
    assert np.allclose(penalized_reduction(base, costs, 0.0), [(0.1 - 0.1) / 2, 0.0])
    assert np.allclose(penalized_reduction(base, costs, 1.0), [(0.1 - 0.2) / 2, 0.0])


def test_adam_ascends_and_its_state_restores():
    adam = Adam(2, lr=0.1)
    theta = adam.step(np.zeros(2), np.array([1.0, -3.0]))
    assert np.allclose(theta, [0.1, -0.1])  # the first step is lr * sign(grad)
    again = Adam(2, lr=0.1)
    again.restore(adam.state())
    grad = np.array([0.5, 0.5])
    assert np.array_equal(again.step(theta, grad), adam.step(theta, grad))


# --- evaluation totals -------------------------------------------------------------------


def _evaluation(problem: str, metric: str) -> Evaluation:
    ev = Evaluation(get_problem(problem), "clang 22", "corpus")
    ev.modules = {
        "zlib/a.o": {metric: 90.0, f"default_{metric}": 100.0},
        "zlib/b.o": {metric: 60.0, f"default_{metric}": 50.0},
        "lua/c.o": {metric: 0.0, f"default_{metric}": 0.0},
    }
    return ev


def test_totals_and_packages_compare_the_policy_with_the_default(tmp_path):
    ev = _evaluation("inlining-size", "text_once")
    assert ev.totals() == {
        "modules": 3,
        "text_once": 150.0,
        "default_text_once": 150.0,
        "delta": 0.0,
    }
    packages = ev.per_package()
    assert packages["zlib"]["delta"] == pytest.approx(0.0)
    assert packages["lua"] == {
        "modules": 1,
        "text_once": 0.0,
        "default_text_once": 0.0,
        "delta": 0.0,
    }
    ev.modules["zlib/b.o"]["text_once"] = 40.0
    assert ev.totals()["delta"] == pytest.approx((130 - 150) / 150)
    ev.save(tmp_path)
    assert Evaluation.load(tmp_path).totals() == ev.totals()


def test_the_guard_keeps_the_default_wherever_the_objects_text_did_not_shrink():
    """As mlgo.serve.guard keeps objects: by their whole .text, a tie the default's; every
    measure of a module kept is the default's, and a C++ object that sheds a shared copy
    (.text smaller, `text_once` larger) stays the policy's."""
    row = {"decisions": 3, "changed": 1}

    def sizes(text: float, once: float, default_text: float, default_once: float) -> dict:
        return {**row, "text_size": text, "text_once": once,
                "default_text_size": default_text, "default_text_once": default_once}  # fmt: skip

    ev = Evaluation(get_problem("inlining-size"), "clang", "corpus")
    ev.modules = {
        "p/larger.o": sizes(130, 130, 100, 100),
        "p/tie.o": sizes(100, 95, 100, 100),
        "p/smaller.o": sizes(80, 80, 100, 100),
        "q/sheds-copy.o": sizes(90, 104, 100, 100),
    }
    guarded = ev.guarded()
    assert {n: r["text_size"] for n, r in guarded.modules.items()} == {
        "p/larger.o": 100, "p/tie.o": 100, "p/smaller.o": 80, "q/sheds-copy.o": 90,
    }  # fmt: skip
    assert guarded.modules["p/tie.o"]["text_once"] == 100
    assert guarded.modules["p/larger.o"]["changed"] == 0
    assert guarded.packages_larger() == ["q"]  # the guard does not see text_once
    assert guarded.packages_larger("text_size") == [] and ev.packages_larger() == ["p", "q"]


def test_the_language_tool_splits_an_evaluation_into_c_and_cxx_and_the_guards_sizes(tmp_path):
    tool = Path(__file__).resolve().parents[1] / "tools" / "eval_by_language.py"
    ev = _evaluation("inlining-size", "text_once")  # zlib: C, -10 and +10 bytes
    ev.modules["snappy/d.o"] = {"text_once": 210.0, "default_text_once": 200.0}  # C++
    ev.save(tmp_path)
    r = subprocess.run([sys.executable, tool, tmp_path], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    row = r.stdout.split(str(tmp_path))[1].split("\n")[0].split("│")[1:8]
    assert [c.strip() for c in row] == [
        "+2.857%", "+0.000%", "+5.000%",  # 360 / 350; C 150 / 150; C++ 210 / 200
        "-2.857%", "-6.667%", "+0.000%",  # each module the smaller: 340, 140, 200
        "snappy +5.00% (+10)",  # zlib's two modules cancel out: it is not larger
    ]  # fmt: skip
    bad = subprocess.run([sys.executable, tool, tmp_path, tmp_path / "none"],
                         capture_output=True, text=True)  # fmt: skip
    assert bad.returncode == 1 and bad.stdout == ""  # nothing printed before the error
    assert bad.stderr.strip().endswith("not an evaluation ([Errno 2] No such file or directory: "
                                       f"'{tmp_path / 'none'}')")  # fmt: skip
    unmeasured = subprocess.run([sys.executable, tool, tmp_path, "--metric", "text_size"],
                                capture_output=True, text=True)  # fmt: skip
    assert unmeasured.returncode == 1 and unmeasured.stdout == ""
    assert unmeasured.stderr.strip() == f"error: {tmp_path}: measures no text_size on both sides"


def test_regalloc_totals_are_in_its_own_metric_and_a_stale_evaluation_is_refused(tmp_path):
    ev = _evaluation("regalloc-eviction", "spill_reload_cost")
    assert ev.totals()["default_spill_reload_cost"] == 150.0
    ev.save(tmp_path)
    Evaluation.load(tmp_path)
    # written when the reward was the weighted regalloc_cost
    stale = json.loads((tmp_path / "eval.json").read_text())
    for row in stale["modules"].values():
        row["regalloc_cost"] = row.pop("spill_reload_cost")
    (tmp_path / "stale.json").write_text(json.dumps(stale))
    with pytest.raises(ValueError, match="stale.json: not an evaluation .*no spill_reload_cost"):
        Evaluation.load(tmp_path / "stale.json")


# --- what mlgo-cc reads off a command line ---------------------------------------------


@pytest.mark.parametrize(
    ("args", "level"),
    [
        ([], "-O0"),
        (["-O"], "-O1"),
        (["-O2"], "-O2"),
        (["-O3", "-march=native", "-Oz"], "-Oz"),
        (["-Oz", "-O3"], "-O3"),
        (["-O4"], "-O3"),
        (["-O9"], "-O3"),
        (["-Os"], "-Os"),
        (["-Og"], "-Og"),
        (["-Ofast"], "-Ofast"),
        (["--optimize"], "-O1"),
        (["--optimize=z"], "-Oz"),
        (["-Oz", "-O"], "-O1"),
        (["-Oz", "-Xclang", "-O3", "-Xlinker", "-O1"], "-Oz"),
        (["-Oz", "-ObjC"], "-Oz"),
        (["-Ox"], None),
        (["-O²"], None),
    ],
)
def test_the_level_is_the_last_o_flag_as_clang_reads_it(args, level):
    assert opt_level([*args, "-c", "x.c"]) == level


@pytest.mark.parametrize(
    ("args", "obj"),
    [
        (["-c", "a.c", "-o", "out/a.o"], "out/a.o"),
        (["-c", "dir/a.c"], "a.o"),
        (["-c", "a.c", "-oout.o"], "out.o"),
        (["-c", "a.c", "-flto", "-fno-lto", "-o", "a.o"], "a.o"),
        (["a.c", "-o", "prog"], None),  # compile and link
        (["-c", "a.c", "b.c"], None),
        (["-S", "-c", "a.c"], None),
        (["-c", "-emit-llvm", "a.c"], None),
        (["-c", "a.c", "-flto=thin"], None),
        (["-c", "a.c", "-gsplit-dwarf"], None),
        (["-c", "a.c", "--coverage"], None),
        (["-c", "a.c", "-save-temps=obj"], None),
        (["-c", "a.c", "-o", "-"], None),
    ],
)
def test_the_guard_compares_only_one_elf_object(args, obj):
    sources = [a for a in args if a.endswith(".c")]
    assert guarded_object(args, sources) == (Path(obj) if obj else None)


def test_the_default_compile_writes_nothing_but_its_object():
    args = ["-Oz", "-c", "a.c", "-o", "a.o", "-MD", "-MP", "-MF", "a.d", "-MT", "t", "-MQx"]
    args += ["-Wp,-MMD,.a.d", "-ftime-trace=t.json", "-fsave-optimization-record", "-MJ", "j"]
    args += ["-foptimization-record-file=r.yaml", "--serialize-diagnostics", "a.dia", "-g"]
    assert default_args(args, Path("tmp/a.o")) == ["-Oz", "-c", "a.c", "-g", "-o", "tmp/a.o"]


@pytest.mark.unit
def test_a_policy_server_is_cached_per_policy_and_tensorflow_library_directory(monkeypatch):
    """The server's rpath names TF's library directory: a server built for another (or a
    deleted) virtualenv must not be reused, or it exits 127 at its first start. And a
    policy with other weights is another server."""
    from mlgo.ship import aot

    policy = load_policy(POLICIES / "inlining-size")
    monkeypatch.setattr(aot, "tf_version", lambda: "2.21.0")
    keys = []
    for lib in ("/venv-a/tensorflow", "/venv-b/tensorflow", "/venv-a/tensorflow"):
        monkeypatch.setattr(aot, "tf_dir", lambda lib=lib: Path(lib))
        keys.append(aot.server_key(policy))
    assert keys[0] != keys[1] and keys[0] == keys[2]
    other = policy.with_flat(policy.flat() * 2)
    assert aot.server_key(other) != keys[2]


@pytest.mark.unit
def test_a_model_card_retrains_each_run_its_policy_started_from(tmp_path):
    """BC, ES on a subset of the packages, then BC-Max from it: the card gives all three
    commands in order and their budget summed; a start whose state cannot be read ends it."""
    from mlgo.train.evaluate import Evaluation
    from mlgo.train.modelcard import model_card

    problem = get_problem("inlining-size")

    def made(name: str, algo: str, packages: list[str], init: Path | None, minutes: float) -> Path:
        run = tmp_path / name
        config = {"init": str(init)} if init else {}
        state = {"algo": algo, "step": 2, "compiles": 100, "seconds": 60 * minutes,
                 "extra": {"config": config}}  # fmt: skip
        (run / "eval").mkdir(parents=True)
        (run / "state.json").write_text(json.dumps(state))
        rows = {f"{p}/a.o": {"text_once": 9.0, "default_text_once": 10.0} for p in packages}
        Evaluation(problem, "clang", "corpus", rows).save(run / "eval")
        return run

    bc = made("bc", "bc", ["zlib", "pp"], None, 5)
    es = made("es", "es", ["zlib"], bc, 30)
    bcmax = made("bcmax", "bcmax", ["zlib", "pp"], es, 45)
    policy = load_policy(POLICIES / "inlining-size")
    card = model_card(policy, bcmax)
    lines = [line for line in card.splitlines() if line.startswith("mlgo train")]
    assert [line.split()[3] for line in lines] == ["bc", "es", "bcmax"]
    assert "--init runs/bc " in lines[1] and " --packages zlib " in lines[1]
    assert "--init runs/es " in lines[2] and "--packages" not in lines[2]
    assert "- with the runs it started from (bc, es): 300 compilations, 80 minutes" in card
    (bc / "state.json").write_text("{not json")
    lines = [line for line in model_card(policy, bcmax).splitlines() if "mlgo train" in line]
    assert [line.split()[3] for line in lines] == ["es", "bcmax"]


@pytest.mark.unit
def test_a_calibrated_policy_outside_its_run_is_carded_from_the_run_it_was_calibrated_from(
    tmp_path,
):
    """`mlgo calibrate --out` anywhere: its calibration.json names the source policy, whose
    run the card is drawn from; a record that cannot be read leaves the card to the folder."""
    from mlgo.train.modelcard import model_card, policy_run

    run, cal = tmp_path / "runs" / "bcmax", tmp_path / "shipped" / "policy"
    (run / "policy").mkdir(parents=True)
    cal.mkdir(parents=True)
    (run / "state.json").write_text(json.dumps({"algo": "bcmax", "step": 3, "compiles": 7}))
    (cal / "calibration.json").write_text(json.dumps({"source": str(run / "policy")}))
    assert policy_run(cal) == run and policy_run(run / "policy") == run
    card = model_card(load_policy(POLICIES / "inlining-size"), policy_run(cal), calibrated=True)
    assert "- algorithm: bcmax, 3 steps" in card
    assert "mlgo calibrate --policy runs/bcmax --corpus data/corpus-validation" in card
    (cal / "calibration.json").write_text("{not json")
    assert policy_run(cal) == cal.parent


def test_candidates_alike_on_either_side_have_no_rank_correlation_and_raise_no_warning(recwarn):
    from mlgo.programs.judges import rank_correlation

    alike, linked = {"a": 0.0, "b": 0.0, "c": 0.0}, {"a": 1.0, "b": 2.0, "c": 3.0}
    assert rank_correlation(alike, linked) == {"spearman": None, "candidates": 3}
    assert rank_correlation(linked, {"a": 1.0, "b": 2.0, "c": 4.0})["spearman"] == 1.0
    assert rank_correlation(linked, {"a": 1.0, "b": 2.0}) == {"spearman": None, "candidates": 2}
    assert not recwarn.list
