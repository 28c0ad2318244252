"""A run's directory and its inputs are the user's own, and every child process and every
number is bounded: a crafted checkpoint, an --out another user made or changed, a test that
leaves children behind, and numbers no run could use."""

from __future__ import annotations

import io
import json
import os
import zipfile
from pathlib import Path

import numpy as np
import pytest

from tests.cli_helpers import POLICIES, mlgo, one_line_error
from tests.conftest import copy_corpus


def _bomb(path: Path) -> None:
    """A small archive whose one array's header declares 3.35 GiB of float64."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<f8", "fortran_order": False, "shape": (450_000_000,)}
    )
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("theta.npy", header.getvalue() + bytes(3_500_000))


@pytest.mark.parametrize("bad", ["not an archive", "a FIFO", "a bomb"])
def test_a_bad_checkpoint_is_one_line(mini_corpus, tmp_path, bad):
    """The checkpoint a rerun resumes from is read bounded by the run's own size: a file
    that is no archive, a FIFO (it hung) and a 3.5 MB archive declaring 3.35 GiB (it asked
    for them) are each one line naming it."""
    corpus = copy_corpus(mini_corpus, tmp_path / "c")
    run = tmp_path / "run"
    run.mkdir()
    (run / "state.json").write_text(json.dumps({"algo": "es"}))
    checkpoint = run / "checkpoint.npz"
    if bad == "a FIFO":
        os.mkfifo(checkpoint)
    elif bad == "a bomb":
        _bomb(checkpoint)
    else:
        checkpoint.write_bytes(b"PK\x03\x04 not really")
    init = str(POLICIES / "inlining-size")
    r = mlgo("train", "--algo", "es", "--corpus", str(corpus), "--init", init,
             "--out", str(run), "--steps", "1", timeout=120)  # fmt: skip
    why = {"a FIFO": "not a regular file", "a bomb": "at most", "not an archive": "not an array"}
    one_line_error(r, str(checkpoint), why[bad])
