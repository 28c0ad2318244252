"""corpus/splits.toml: the package-level train/validation/test splits, written down before
training (issue 21, item 1)."""

from __future__ import annotations

import pytest

from mlgo.corpus.splits import load_splits, packages_to_build, split_packages
from mlgo.packages.recipes import available_recipes
from mlgo.programs.demo import DEMO_PACKAGE
from mlgo.runtime.commands import BuildError

pytestmark = pytest.mark.unit

# Packages that earlier work trained or selected on: never in test.
EARLIER = [
    "zlib",
    "bzip2",
    "libpng",
    "libyaml",
    "expat",
    "lz4",
    "zstd",
    "lua",
    "sqlite3",
    "cjson",
    "giflib",
    "lmdb",
    "xz-utils",
    "json-c",
    "oniguruma",
    "libtasn1",
    "mawk",
    "pugixml",
    "tinyxml2",
    "jsoncpp",
    "double-conversion",
    "muparser",
]
# split: (at least this many packages, at least this many in C++)
MINIMUMS = {"train": (60, 20), "validation": (12, 4), "test": (15, 5)}


def test_the_splits_are_disjoint_and_every_name_has_a_recipe():
    splits = load_splits()
    names = [p.name for ps in splits.values() for p in ps]
    assert len(names) == len(set(names))
    assert set(names) <= set(available_recipes())
    # the demo tunes a project no shipped policy trained on, as a user's own would be
    assert DEMO_PACKAGE in available_recipes() and DEMO_PACKAGE not in names


@pytest.mark.parametrize("split", MINIMUMS)
def test_each_split_is_large_enough_and_has_enough_cpp(split):
    packages = load_splits()[split]
    at_least, cpp_at_least = MINIMUMS[split]
    assert len(packages) >= at_least
    assert sum(p.language == "C++" for p in packages) >= cpp_at_least


def test_test_holds_nothing_earlier_work_trained_or_selected_on():
    splits = load_splits()
    assert not {p.name for p in splits["test"]} & set(EARLIER)
    assert set(EARLIER) <= {p.name for s in ("train", "validation") for p in splits[s]}


def test_each_split_spans_the_domains():
    splits = load_splits()
    domains = {s: {p.domain for p in ps} for s, ps in splits.items()}
    assert len(domains["train"]) >= 10 and len(domains["test"]) >= 8
    assert len(domains["validation"]) >= 6


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[train]\n", "bad splits file .*'validation'"),
        ("[train]\n[validation]\n[test]\n[extra]\n", "unknown split extra"),
        ('[train]\na = { language = "Go", domain = "x" }\n[validation]\n[test]\n', "'Go'"),
        ("[train]\na = 1\n[validation]\n[test]\n", "bad splits file"),
        ("[train\n", "bad splits file"),
    ],
)
def test_a_bad_splits_file_is_one_line_naming_it(tmp_path, text, message):
    path = tmp_path / "splits.toml"
    path.write_text(text)
    with pytest.raises(BuildError, match=message) as e:
        load_splits(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_packages_come_from_names_or_a_split_not_both():
    assert packages_to_build(["zlib"], None) == ["zlib"]
    assert packages_to_build([], "test") == split_packages("test")
    for names, split in ((["zlib"], "test"), ([], None)):
        with pytest.raises(BuildError, match="name packages or give --split, not both"):
            packages_to_build(names, split)
    with pytest.raises(BuildError, match=r"no split 'nope' \(have: train, validation, test\)"):
        split_packages("nope")
