"""Inlining for size with IR2Vec: inlining-size's decision and reward, and beside LLVM's
scalar features the caller's and the callee's IR2Vec embeddings, which clang-22's ML
inliner sends (and keeps current as inlining proceeds) once given a vocabulary.

The scalar features leave many call sites alike that a search answers apart ("twins"):
a function's embedding is a weighted sum of vectors of what its instructions are, which
tells apart callees of the same size and shape that do different things. The vocabulary
is mlgo's own, trained on the train split's bitcode (`mlgo.train.vocabulary`), and ships
with the package; its dimension is EMBEDDING_DIM.
"""

from __future__ import annotations

import hashlib

from mlgo.data import ir2vec_vocabulary
from mlgo.llvm.log_format import ELEMENT
from mlgo.problems import with_advisor_flags
from mlgo.problems.inlining_size import PROBLEM as SCALAR

EMBEDDING_DIM = 16
EMBEDDINGS = ("callee_embedding", "caller_embedding")


# The ML inliner's switch for the embeddings and the vocabulary it reads (both are
# needed: the first alone stops clang).
VOCABULARY_FLAGS = (
    "-mllvm",
    f"-ml-inliner-ir2vec-vocab-file={ir2vec_vocabulary()}",
    "-mllvm",
    f"-ir2vec-vocab-path={ir2vec_vocabulary()}",
)


PROBLEM = with_advisor_flags(
    SCALAR,
    VOCABULARY_FLAGS,
    name="inlining-size-ir2vec",
    summary="inline or not at each call site, for the smallest .text, seeing IR2Vec embeddings",
    feature_names=SCALAR.feature_names
    + tuple(f"{e}{ELEMENT}{i}" for e in EMBEDDINGS for i in range(EMBEDDING_DIM)),
    input_specs=tuple((e, "float32", (EMBEDDING_DIM,)) for e in EMBEDDINGS),
    feature_digest=hashlib.sha256(ir2vec_vocabulary().read_bytes()).hexdigest()[:16],
)
