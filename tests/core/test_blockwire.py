"""The block wire format: what a rank (or an aggregator) encodes is what the collector decodes,
and malformed bodies are refused with a message that says what is wrong."""

from __future__ import annotations

import json
import struct
import zlib
from typing import Any

import numpy as np
import pytest

from rankwatch.blockwire import (
    BLOCK_MAGIC,
    BLOCK_WIRE_VERSION,
    check_membership,
    decode_blocks,
    encode_blocks,
    is_block_body,
    rank_body,
)
from rankwatch.errors import WireError
from rankwatch.sim import PROFILES, Layout, Scenario, Workload, deliveries, from_batch
from rankwatch.sim.blocks import BLOCK_DTYPE, BlockBatch
from rankwatch.sim.stream import stream_blocks
from rankwatch.wire import OpKind

_PREFIX = struct.Struct("<4sHHIIIII")


def _scenario(tp: int = 2, pp: int = 2, dp: int = 2, duration: float = 3.0) -> Scenario:
    lay = Layout(tp=tp, pp=pp, dp=dp)
    return Scenario(
        "s", layout=lay, workload=Workload.for_rate(100, lay), profile=PROFILES["quiet"], duration=duration, seed=1
    )


def _same(a: BlockBatch, b: BlockBatch) -> None:
    for name in ("ranks", "progress", "p2p", "blocks"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and np.array_equal(x, y), name
    assert a.group_rank == b.group_rank
    assert [g["id"] for g in a.groups] == [g["id"] for g in b.groups]


@pytest.mark.parametrize("compress", [True, False])
def test_one_rank_round_trip_with_p2p_and_progress(compress: bool) -> None:
    seen_p2p = False
    for d in deliveries(_scenario()):
        h = d.batch.header
        bb = from_batch(h, d.batch.records, np.full(len(h["groups"]), 8))
        body = rank_body(h, bb.blocks, compress=compress)
        assert is_block_body(body)
        got = decode_blocks(body)
        _same(got.batch, bb)
        check_membership(got.batch)
        assert got.records == len(d.batch.records)
        assert (got.job, got.world, got.rank_info[0]["rank"]) == (h["job"], h["world"], h["rank"])
        assert got.batch.nodes == {h["rank"]: h["node"]}
        assert "entered" not in json.dumps(got.batch.groups)  # progress travels in columns only
        seen_p2p |= bool((bb.blocks["kind"] == int(OpKind.SEND)).any())
    assert seen_p2p  # the pipeline's sends were summarised and carried too


def test_many_ranks_in_one_body() -> None:
    sc = _scenario(tp=8, pp=2, dp=4, duration=4.0)
    n = 0
    for d in stream_blocks(sc, agent_ranks=32):
        bb = d.batch
        infos = [
            {"rank": int(r), "node": f"n{int(r) // 8}", "incarnation": "0-1-x", "batch": 3} for r in bb.ranks["rank"]
        ]
        got = decode_blocks(encode_blocks("big", sc.layout.world, bb, infos))
        _same(got.batch, bb)
        assert got.records == int(bb.blocks["count"].sum())
        n += got.records
    assert n > 0


def _body(head: dict[str, Any] | None = None, **over: Any) -> bytes:
    """A valid one-rank body, with parts replaced: header keys (``head``), the rank's object
    (``info``), or whole tables."""
    d = next(iter(deliveries(_scenario())))
    h = dict(d.batch.header)
    bb = from_batch(h, d.batch.records, np.full(len(h["groups"]), 8))
    for name in ("blocks", "progress", "p2p", "ranks"):
        if name in over:
            setattr(bb, name, over.pop(name))
    info = [h | over.pop("info", {})]
    header_over = head or {}
    body = encode_blocks(h["job"], h["world"], bb, info, compress=False)
    if header_over:
        magic, ver, flags, hl, *counts = _PREFIX.unpack_from(body)
        head = json.loads(body[_PREFIX.size : _PREFIX.size + hl]) | header_over
        raw = json.dumps(head).encode()
        body = _PREFIX.pack(magic, ver, flags, len(raw), *counts) + raw + body[_PREFIX.size + hl :]
    return body


def _blocks(**fields: Any) -> np.ndarray:
    d = next(iter(deliveries(_scenario())))
    h = d.batch.header
    b = from_batch(h, d.batch.records, np.full(len(h["groups"]), 8)).blocks.copy()
    for k, v in fields.items():
        b[k][0] = v
    return b


def test_valid_body_decodes() -> None:
    assert decode_blocks(_body()).records > 0
    assert decode_blocks(_body(p2p=_p2p_row())).batch.p2p.shape[0] == 1  # the row the cases below spoil


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"RWK\x00", "shorter than"),
        (b"X" * 40, "bad magic"),
        (_PREFIX.pack(BLOCK_MAGIC, 9, 0, 2, 0, 0, 0, 0) + b"{}", "block wire version 9"),
        (_PREFIX.pack(BLOCK_MAGIC, BLOCK_WIRE_VERSION, 4, 2, 0, 0, 0, 0) + b"{}", "unknown flags"),
        (_PREFIX.pack(BLOCK_MAGIC, BLOCK_WIRE_VERSION, 0, 99, 0, 0, 0, 0) + b"{}", "truncated inside its header"),
        (_PREFIX.pack(BLOCK_MAGIC, BLOCK_WIRE_VERSION, 0, 5, 0, 0, 0, 0) + b"{nope", "not valid JSON"),
        (_PREFIX.pack(BLOCK_MAGIC, BLOCK_WIRE_VERSION, 0, 2, 0, 0, 0, 9_000_000) + b"{}", "the limit is"),
        (_PREFIX.pack(BLOCK_MAGIC, BLOCK_WIRE_VERSION, 0, 2, 1, 0, 0, 0) + b"{}" + b"\0" * 5, "column block is 5"),
        (_PREFIX.pack(BLOCK_MAGIC, BLOCK_WIRE_VERSION, 1, 2, 1, 0, 0, 0) + b"{}" + b"junk", "not valid zlib"),
        (
            _PREFIX.pack(BLOCK_MAGIC, BLOCK_WIRE_VERSION, 1, 2, 0, 0, 0, 0) + b"{}" + zlib.compress(b"\0" * 64),
            "does not decompress to the expected size",
        ),
        (_body(head={"job": ""}), "'job' must be"),
        (_body(head={"world": 0}), "'world' must be"),
        (_body(head={"ranks": []}), "one per rank row"),
        (_body(info={"incarnation": 5}), "lacks 'incarnation'"),
        (_body(info={"rank": 1}), "disagree on which rank"),
        (_body(info={"pid": "x"}), "pid must be"),
        (_body(head={"groups": [{"id": "0", "ranks": [[0, 99, 1]]}]}), "not within world size"),
        (_body(head={"groups": [{"id": "0", "block_seqs": 3}]}), "power of two"),
        (_body(blocks=_blocks(group=40)), "names group index 40"),
        (_body(blocks=_blocks(rank=1)), "has no rank row"),
        (_body(blocks=_blocks(kind=99)), "unknown op kind 99"),
        (_body(blocks=_blocks(count=0)), "count must be from 1"),
        (_body(blocks=_blocks(count=9)), "count must be from 1"),
        (_body(blocks=_blocks(block_seqs=3)), "powers of two"),
        (_body(blocks=_blocks(block_seqs=128)), "powers of two"),
        (_body(blocks=_blocks(seq_hi=10_000)), "seq_hi is not within its block"),
        (_body(blocks=_blocks(min_ns=10**12)), "min_ns <= max_ns"),
        (_body(blocks=_blocks(first_enter_ns=2**62)), "first_enter_ns is after"),
        (_body(blocks=_blocks(nbytes=-1)), "negative nbytes"),
    ],
)
def test_malformed_bodies_are_refused_with_a_reason(body: bytes, says: str) -> None:
    with pytest.raises(WireError, match=None) as exc:
        decode_blocks(body)
    assert says in str(exc.value)


def _table(name: str, **fields: Any) -> np.ndarray:
    """A valid body's ``name`` table with fields of its first row replaced."""
    d = next(iter(deliveries(_scenario())))
    h = d.batch.header
    rows = getattr(from_batch(h, d.batch.records, np.full(len(h["groups"]), 8)), name).copy()
    for k, v in fields.items():
        rows[k][0] = v
    return rows


def _p2p_row(**fields: Any) -> np.ndarray:
    rows = np.zeros(1, from_batch.__globals__["P2P_DTYPE"])
    rows[0] = (int(_table("ranks")["rank"][0]), 0, int(OpKind.SEND), 1, 5, 100)  # a valid one to start from
    for k, v in fields.items():
        rows[k][0] = v
    return rows


@pytest.mark.parametrize(
    ("over", "says"),
    [
        ({"ranks": _table("ranks", world=0)}, "world size is not within"),
        ({"ranks": _table("ranks", world=99)}, "world size is not within"),
        ({"ranks": _table("ranks", state=7)}, "unknown rank state code 7"),
        ({"ranks": _table("ranks", flush_s=0.0)}, "flush_s must be a positive number"),
        ({"ranks": _table("ranks", flush_s=np.inf)}, "flush_s must be a positive number"),
        ({"ranks": _table("ranks", flush_s=np.nan)}, "flush_s must be a positive number"),
        ({"ranks": _table("ranks", restart=-1)}, "restart counts must not be negative"),
        ({"progress": _table("progress", completed=10**9)}, "not ahead of entered"),
        ({"progress": _table("progress", completed=-1)}, "completed must be >= 0"),
        ({"progress": _table("progress", inflight_kind=250)}, "unknown in-flight op kind"),
        ({"progress": _table("progress", rank=3)}, "progress row is about a rank that has no rank row"),
        ({"progress": _table("progress", group=77)}, "names group index 77"),
        ({"p2p": _p2p_row(kind=int(OpKind.ALL_REDUCE))}, "must be a send or a recv"),
        ({"p2p": _p2p_row(seq=0)}, "need seq >= 1"),
        ({"p2p": _p2p_row(peer=-2)}, "need seq >= 1 and a peer >= 0"),
        ({"p2p": _p2p_row(rank=9)}, "p2p row is about a rank that has no rank row"),
        ({"blocks": _blocks(block=-1)}, "seq_hi is not within its block"),
        ({"blocks": _blocks(peer=-2)}, "peer below -1"),
        ({"blocks": _blocks(sum_ns=-5)}, "sum_ns >= 0"),
    ],
)
def test_every_row_check_refuses_with_its_own_reason(over: dict[str, Any], says: str) -> None:
    with pytest.raises(WireError) as exc:
        decode_blocks(_body(**over))
    assert says in str(exc.value)


def test_a_row_about_an_outsider_is_refused() -> None:
    d = next(iter(deliveries(_scenario())))
    h = d.batch.header
    bb = from_batch(h, d.batch.records, np.full(len(h["groups"]), 8))
    bb.groups = [dict(g) for g in bb.groups]
    me = h["rank"]
    g0 = int(bb.progress["group"][0])
    bb.groups[g0]["ranks"] = [[me + 1, me + 2, 1]]  # a group the rank says it is not in
    with pytest.raises(WireError, match="is not one of its members"):
        check_membership(decode_blocks(encode_blocks(h["job"], h["world"], bb, [h])).batch)


@pytest.mark.parametrize("members", [32, 4])  # many reporters (numpy) and a few (plain Python)
def test_an_outsider_is_named_among_many_reporters_and_few(members: int) -> None:
    sc = _scenario(tp=4, pp=2, dp=4)
    bb = next(iter(stream_blocks(sc, agent_ranks=32))).batch
    bb.groups = [dict(g) for g in bb.groups]
    gi = next(i for i, g in enumerate(bb.groups) if g["size"] == members)
    reporters = sorted(set(bb.progress["rank"][bb.progress["group"] == gi].tolist()))
    assert len(reporters) == members
    left_out = reporters[len(reporters) // 2]
    check_membership(bb)  # as sent: everyone belongs
    bb.groups[gi]["ranks"] = [[r, r + 1, 1] for r in reporters if r != left_out]
    with pytest.raises(WireError, match=f"rank {left_out} reports groups\\[{gi}\\]"):
        check_membership(bb)


def test_block_size_must_match_the_group_entry() -> None:
    d = next(iter(deliveries(_scenario())))
    h = d.batch.header
    bb = from_batch(h, d.batch.records, np.full(len(h["groups"]), 8))
    gi = int(bb.blocks["group"][0])
    bb.groups = [dict(g) for g in bb.groups]
    bb.groups[gi]["block_seqs"] = 16
    with pytest.raises(WireError, match="differs from its group's block_seqs"):
        decode_blocks(encode_blocks(h["job"], h["world"], bb, [h]))


def test_encode_checks_its_arguments() -> None:
    bb = BlockBatch(
        groups=[],
        ranks=np.zeros(1, from_batch.__globals__["RANK_DTYPE"]),
        progress=np.zeros(0, from_batch.__globals__["PROGRESS_DTYPE"]),
        p2p=np.zeros(0, from_batch.__globals__["P2P_DTYPE"]),
        blocks=np.zeros(0, BLOCK_DTYPE),
        nodes={},
    )
    with pytest.raises(ValueError, match="1 rank rows"):
        encode_blocks("j", 1, bb, [])
