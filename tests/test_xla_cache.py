"""The tuning cache never names a file outside itself, whatever its entries say."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from mlgo.xla.cache import TuningCache, digest, is_fingerprint

pytestmark = pytest.mark.unit

TUNER = digest(["tuner"])
LOWERED = digest(["lowered"])


@pytest.fixture
def cache(tmp_path: Path) -> TuningCache:
    return TuningCache(tmp_path / "cache")


def test_fingerprints_are_what_digest_makes() -> None:
    assert is_fingerprint(digest({"a": 1}))
    for key in ("../../x", "", "A" * 16, "0" * 15, "0" * 17, "0" * 15 + "/", None, 7):
        assert not is_fingerprint(key)


def test_crafted_hlo_reaching_outside_is_ignored(
    cache: TuningCache, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A well-formed choice outside the cache that a "../" key would reach.
    outside = tmp_path / f"outside-{TUNER}.json"
    outside.write_text(json.dumps({"config": "default"}))
    crafted = "../" * (len(cache.dir.relative_to(tmp_path).parts)) + "outside"
    assert (cache.dir / f"{crafted}-{TUNER}.json").resolve() == outside.resolve()
    entry = cache.dir / "lowered" / f"{LOWERED}.json"
    entry.parent.mkdir(parents=True)
    entry.write_text(json.dumps({"hlo": crafted}))

    reads: list[Path] = []
    original = Path.read_text

    def spy(self: Path, *args: object, **kwargs: object) -> str:
        reads.append(self)
        return original(self, *args, **kwargs)  # type: ignore[arg-type]

    with (
        caplog.at_level(logging.WARNING, logger="mlgo.xla.cache"),
        pytest.MonkeyPatch.context() as mp,
    ):
        mp.setattr(Path, "read_text", spy)
        assert cache.optimized(LOWERED) is None
        assert cache.choice(crafted, TUNER) is None
        assert cache.optimized("../" + LOWERED) is None

    assert outside not in reads and all(p.is_relative_to(cache.dir) for p in reads)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3
    assert lines[0].startswith(f"tuned_jit: ignoring unreadable tuning cache file {entry}")
    assert all(line.startswith("tuned_jit: ignoring") for line in lines)
    assert all("is not a fingerprint" in line for line in lines)


def test_store_refuses_keys_that_are_not_fingerprints(
    cache: TuningCache, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="mlgo.xla.cache"):
        cache.store(LOWERED, "../../escaped", TUNER, {"config": "default"})
    assert not list(tmp_path.rglob("*.json"))
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == [
        "tuned_jit: cannot write the tuning cache"
    ]


def test_well_formed_entries_still_round_trip(cache: TuningCache) -> None:
    hlo = digest(["hlo"])
    cache.store(LOWERED, hlo, TUNER, {"config": "default"})
    assert cache.optimized(LOWERED) == hlo
    choice = cache.choice(hlo, TUNER)
    assert choice is not None and choice["hlo"] == hlo
