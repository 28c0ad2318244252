"""An IR2Vec vocabulary trained on real bitcode by real llvm-ir2vec, read by real LLVM."""

from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest

from mlgo.corpus.format import load_corpus
from mlgo.data import ir2vec_vocabulary
from mlgo.problems.inlining_size_ir2vec import EMBEDDING_DIM
from mlgo.train.vocabulary import (
    SECTIONS,
    TransE,
    VocabularyError,
    entities,
    tail_hits,
    train_transe,
    train_vocabulary,
)


@pytest.mark.slow  # a vocabulary trained
def test_a_vocabulary_trained_on_a_corpus_is_what_llvm_embeds_functions_with(
    tc, mini_corpus, tmp_path
):
    out = tmp_path / "vocab.json"
    graph, entity, relation = train_vocabulary(
        tc, mini_corpus, out, TransE(dim=4, steps=300, batch=256)
    )
    vocabulary = json.loads(out.read_text())
    assert tuple(vocabulary) == SECTIONS
    names = [n for section in vocabulary.values() for n in section]
    assert tuple(names) == graph.entities == entities(tc.tool("llvm-ir2vec"))
    vectors = np.array([v for section in vocabulary.values() for v in section.values()])
    assert vectors.shape == (len(names), 4)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-4)
    # trained: head + relation finds the true tail far more often than at the start
    untrained = train_transe(graph, TransE(dim=4, steps=1, batch=256))
    assert tail_hits(graph, entity, relation, 3) > 3 * tail_hits(graph, *untrained, 3)

    bitcode = max(mini_corpus.modules, key=lambda m: m.bitcode.stat().st_size).bitcode
    embedded = subprocess.run(
        [tc.tool("llvm-ir2vec"), "embeddings", "--level=func", f"--ir2vec-vocab-path={out}",
         str(bitcode), "-o", "-"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    # "Function: NAME", then " [ v0 v1 ... ]"
    rows = {line.strip(" []") for line in embedded.splitlines() if line.startswith(" [")}
    assert len(rows) > 1, "functions that differ get different embeddings"
    assert all(len(r.split()) == 4 for r in rows)


def test_the_shipped_vocabulary_covers_this_llvm_at_the_problems_dimension(tc):
    vocabulary = json.loads(ir2vec_vocabulary().read_text())
    names = tuple(n for section in vocabulary.values() for n in section)
    assert names == entities(tc.tool("llvm-ir2vec"))
    assert {len(v) for s in vocabulary.values() for v in s.values()} == {EMBEDDING_DIM}


def test_a_module_that_is_not_bitcode_is_named_and_nothing_is_written(tc, mini_corpus, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(mini_corpus.root, broken)
    bad = load_corpus(broken).modules[0].bitcode
    bad.write_bytes(b"not bitcode")
    out = tmp_path / "vocab.json"
    with pytest.raises(VocabularyError, match=f"^{bad}: llvm-ir2vec triplets failed"):
        train_vocabulary(tc, load_corpus(broken), out, TransE(dim=2, steps=1))
    assert not out.exists()


def test_the_command_refuses_a_bad_corpus_or_out_in_one_line_before_training(mini_corpus, tmp_path):
    from tests.cli_helpers import mlgo, one_line_error

    out = tmp_path / "vocab.json"
    r = mlgo("corpus", "vocabulary", str(tmp_path / "nothing"), "--out", str(out))
    one_line_error(r, "corpus_description.json: not found")
    blocker = tmp_path / "a-file"
    blocker.write_text("mine")
    r = mlgo("corpus", "vocabulary", str(mini_corpus.root), "--out", str(blocker / "v.json"))
    one_line_error(r, "a-file")
    assert blocker.read_text() == "mine" and not out.exists()
