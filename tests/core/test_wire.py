"""The wire format round-trips exactly and stays compact."""

from __future__ import annotations

import numpy as np
import pytest

from rankwatch.errors import WireError
from rankwatch.wire import OpKind, Records, decode_batch, encode_batch, ranks_to_runs, runs_to_ranks


def _header(n_groups: int = 1, entered: int = 10_000) -> dict:
    return {
        "job": "j",
        "rank": 1,
        "world": 16,
        "node": "n0",
        "incarnation": "0-1-x",
        "batch": 4,
        "mono_ns": 123,
        "groups": [{"id": str(i), "ranks": [[0, 16, 1]], "entered": entered} for i in range(n_groups)],
    }


def _records(n: int, rng: np.random.Generator) -> Records:
    t = np.cumsum(rng.integers(5_000_000, 15_000_000, n)).astype(np.int64) + 10**12
    dur = rng.integers(20_000, 5_000_000, n)
    return Records(
        group=(np.arange(n) % 3).astype(np.uint16),
        kind=np.full(n, int(OpKind.ALL_REDUCE), np.uint8),
        dtype=np.ones(n, np.uint8),
        peer=np.full(n, -1, np.int32),
        seq=(np.arange(n) // 3 + 1).astype(np.int64),
        nbytes=np.full(n, 4 << 20, np.int64),
        t_enter=t,
        t_start=t,
        t_end=t + dur,
    )


def test_round_trip_is_exact() -> None:
    rec = _records(1000, np.random.default_rng(0))
    batch = decode_batch(encode_batch(_header(3), rec))
    for name in Records.__slots__:
        np.testing.assert_array_equal(getattr(batch.records, name), getattr(rec, name), err_msg=name)
    assert batch.header["rank"] == 1


def test_compact_on_the_wire() -> None:
    n = 10_000
    body = encode_batch(_header(3), _records(n, np.random.default_rng(1)))
    assert len(body) / n <= 32, len(body) / n


def test_empty_batch_is_a_heartbeat() -> None:
    batch = decode_batch(encode_batch(_header(), Records.empty()))
    assert len(batch.records) == 0


@pytest.mark.parametrize(
    ("mutate", "says"),
    [
        (lambda h: h.pop("incarnation"), "lacks required field 'incarnation'"),
        (lambda h: h.update(rank=True), "'rank' must be an integer"),
        (lambda h: h.update(job=""), "'job' must be 1 to"),
        (lambda h: h["groups"][0].update(ranks=[[0, 17, 1]]), "not within world size"),
        (lambda h: h["groups"][0].update(ranks=[[3, 1, 1]]), "not within world size"),
        (lambda h: h["groups"][0].update(completed=20_000), "ahead of"),
        (lambda h: h["groups"][0].update(id=""), "id must be"),
    ],
)
def test_header_validation_names_the_field(mutate, says) -> None:  # type: ignore[no-untyped-def]
    h = _header()
    mutate(h)
    with pytest.raises(WireError, match=says):
        decode_batch(encode_batch(h, Records.empty()))


def test_rank_runs() -> None:
    assert ranks_to_runs(range(8)) == [[0, 8, 1]]
    assert ranks_to_runs([0, 8, 16, 24]) == [[0, 25, 8]]
    assert ranks_to_runs([3]) == [[3, 4, 1]]
    for ranks in ([1, 2, 3, 7, 9, 11], [5, 4, 3], list(range(0, 100_000, 8))):
        assert runs_to_ranks(ranks_to_runs(ranks)) == ranks
    assert len(ranks_to_runs(range(100_000))) == 1
