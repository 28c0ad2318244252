import io

import numpy as np
import pytest

from mlgo.llvm.log_format import Header, LogFormatError, LogReader, LogWriter, TensorSpec

pytestmark = pytest.mark.unit

SPECS = (TensorSpec("a", "int64_t", (1,)), TensorSpec("m", "float", (1, 3)))
HEADER = Header(SPECS, advice=TensorSpec("out", "int64_t", (1,)))


def _log(observations: int) -> bytes:
    buf = io.BytesIO()
    w = LogWriter(buf, HEADER)
    w.context("fn")
    for i in range(observations):
        w.observation({"a": [i], "m": np.arange(3, dtype=np.float32) * i})
    return buf.getvalue()


def test_roundtrip_keeps_values_context_and_order():
    reader = LogReader(io.BytesIO(_log(3)))
    assert reader.header == HEADER
    obs = list(reader.observations())
    assert [o.index for o in obs] == [0, 1, 2]
    assert all(o.context == "fn" for o in obs)
    assert obs[2].features["a"].tolist() == [2]
    assert obs[2].features["m"].tolist() == [[0.0, 2.0, 4.0]]


def test_truncated_tensor_is_an_error_not_a_short_read():
    data = _log(2)
    with pytest.raises(LogFormatError, match="tensor bytes"):
        list(LogReader(io.BytesIO(data[:-10])).observations())


@pytest.mark.parametrize(
    "header",
    [
        b"not json\n",
        b'{"nofeatures": []}\n',
        b'{"features": [{"name": "x", "type": "int128", "shape": [1]}]}\n',
    ],
)
def test_bad_header_is_rejected(header):
    with pytest.raises(LogFormatError):
        LogReader(io.BytesIO(header))


def test_empty_log_is_rejected():
    with pytest.raises(LogFormatError, match="empty"):
        LogReader(io.BytesIO(b""))


def test_score_records_of_a_development_mode_log_are_read():
    score = TensorSpec("reward", "float", (1,))
    raw = (
        b'{"features": [{"name": "a", "type": "int64_t", "shape": [1]}], "score": '
        b'{"name": "reward", "type": "float", "shape": [1]}}\n{"context": "f"}\n'
        b'{"observation": 0}\n' + np.int64(7).tobytes() + b"\n"
        b'{"outcome": 0}\n' + np.float32(1.5).tobytes() + b"\n"
    )
    reader = LogReader(io.BytesIO(raw))
    assert reader.header.score == score
    (obs,) = reader.observations()
    assert obs.features["a"].tolist() == [7] and obs.score.tolist() == [1.5]
