"""Merging ranks' own block bodies (what ``rankwatch agent`` sends): every row keeps what its rank
said, each rank keeps its identity and its own group entries, and ``pack`` merges only what is
safe to merge."""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
import pytest

from rankwatch.blockmerge import merge_bodies, pack
from rankwatch.blockwire import (
    BLOCK_WIRE_VERSION,
    FLAG_PER_RANK,
    MERGED_WIRE_VERSION,
    BlockBody,
    decode_blocks,
    encode_blocks,
    rank_body,
)
from rankwatch.errors import WireError
from rankwatch.sim import PROFILES, Layout, Scenario, Workload, deliveries, from_batch
from rankwatch.wire import Records, encode_batch

_PREFIX = struct.Struct("<4sHHIIIII")


def _round(job: str = "j") -> list[bytes]:
    """Every rank's own block body of one send round of a 16-rank job (tp 4, pp 2, dp 2)."""
    lay = Layout(tp=4, pp=2, dp=2)
    sc = Scenario(
        job, layout=lay, workload=Workload.for_rate(100, lay), profile=PROFILES["quiet"], duration=3.0, seed=5
    )
    first: dict[int, bytes] = {}
    for d in deliveries(sc):
        h = d.batch.header
        if h["rank"] in first:
            continue
        bb = from_batch(h, d.batch.records, np.full(len(h["groups"]), 8))
        for g in h["groups"]:
            g["block_seqs"] = 8
        first[h["rank"]] = rank_body(h, bb.blocks)
    return [first[r] for r in sorted(first)]


def _rows_by_rank(body: BlockBody) -> dict[int, dict[str, Any]]:
    """Each rank's rows with group indices replaced by the entries they name (comparable across bodies)."""
    bb = body.batch
    out: dict[int, dict[str, Any]] = {}
    for name in ("progress", "p2p", "blocks"):
        rows = getattr(bb, name)
        for r in np.unique(bb.ranks["rank"]).tolist():
            mine = rows[rows["rank"] == r]
            out.setdefault(r, {})[name] = sorted(
                (json.dumps(bb.groups[int(x["group"])], sort_keys=True), *x.tolist()[:1], *x.tolist()[2:]) for x in mine
            )
    return out


def test_a_merged_body_keeps_every_ranks_rows_identity_and_entries() -> None:
    bodies = _round()
    own = [decode_blocks(b) for b in bodies]
    merged_bytes = merge_bodies(own)
    version, flags = _PREFIX.unpack_from(merged_bytes)[1:3]
    assert version == MERGED_WIRE_VERSION and flags & FLAG_PER_RANK
    merged = decode_blocks(merged_bytes)
    assert merged.per_rank and not own[0].per_rank
    assert merged.job == own[0].job and merged.world == 16
    want: dict[int, dict[str, Any]] = {}
    for b in own:
        want |= _rows_by_rank(b)
    assert _rows_by_rank(merged) == want  # no row lost, added, or moved to another group
    assert sum(len(b.batch.groups) for b in own) > len(merged.batch.groups)  # shared entries travel once
    for b, info in zip(own, merged.rank_info, strict=True):
        mine = b.rank_info[0]
        assert {k: v for k, v in info.items() if k != "group_entries"} == mine
        assert [merged.batch.groups[e] for e in info["group_entries"]] == b.batch.groups
        assert [merged.batch.group_rank[(mine["rank"], e)] for e in info["group_entries"]] == [
            b.batch.group_rank[(mine["rank"], i)] for i in range(len(b.batch.groups))
        ]


def test_entries_that_differ_stay_apart() -> None:
    bodies = _round()
    own = [decode_blocks(b) for b in bodies[:2]]  # tensor-parallel peers: they share a group
    shared = {g["id"] for g in own[0].batch.groups} & {g["id"] for g in own[1].batch.groups}
    assert shared
    gid = sorted(shared)[0]
    entry = next(g for g in own[1].batch.groups if g["id"] == gid)
    entry.pop("block_seqs")
    entry["block_want"] = 16  # rank 1 has not learnt the size yet: its rows must keep their own entry
    own[1].batch.blocks = own[1].batch.blocks[:0]
    merged = decode_blocks(merge_bodies(own))
    assert [g for g in merged.batch.groups if g["id"] == gid] == [
        next(g for g in own[0].batch.groups if g["id"] == gid),
        entry,
    ]
    e1 = [merged.batch.groups[e] for e in merged.rank_info[1]["group_entries"]]
    assert entry in e1


def test_only_one_jobs_one_rank_bodies_merge() -> None:
    own = [decode_blocks(b) for b in _round()[:2]]
    other = decode_blocks(_round("k")[2])
    with pytest.raises(ValueError, match="one job"):
        merge_bodies([own[0], other])
    with pytest.raises(ValueError, match="two of the bodies"):
        merge_bodies([own[0], own[0]])
    merged = decode_blocks(merge_bodies(own))
    with pytest.raises(ValueError, match="one rank's own"):
        merge_bodies([merged, decode_blocks(_round()[5])])


def test_pack_merges_what_is_safe_and_passes_the_rest_as_it_came() -> None:
    bodies = _round()
    retries = [bodies[3], bodies[4]]  # the same ranks twice in one gathering: never in one merged body
    other_job = _round("k")[0]
    raw = encode_batch(
        {
            "job": "j",
            "rank": 0,
            "world": 16,
            "node": "n",
            "incarnation": "i",
            "batch": 0,
            "mono_ns": 1,
            "groups": [],
        },
        Records.empty(),
    )
    bad = bytearray(bodies[7])
    bad[4:6] = (9).to_bytes(2, "little")  # a version nobody reads
    sent = [*bodies[:7], bytes(bad), *bodies[8:], *retries, other_job, raw]
    items = pack(sent)
    assert sorted(i for it in items for i in it.members) == list(range(len(sent)))  # each once
    merged = [it for it in items if it.merged]
    alone = {it.members[0]: it.body for it in items if not it.merged}
    assert alone == {7: bytes(bad), len(sent) - 2: other_job, len(sent) - 1: raw}
    assert [len(it.members) for it in merged] == [15, 2]  # the retried rank went in a second body
    for it in merged:
        got = decode_blocks(it.body)
        assert [r["rank"] for r in got.rank_info] == [decode_blocks(sent[i]).rank_info[0]["rank"] for i in it.members]
    capped = pack(bodies, max_ranks=4)
    assert [len(it.members) for it in capped] == [4, 4, 4, 4]


def test_version_2_is_read_and_version_1_stays_as_it_was() -> None:
    own = decode_blocks(_round()[0])
    v1 = encode_blocks(own.job, own.world, own.batch, own.rank_info)
    assert _PREFIX.unpack_from(v1)[1] == BLOCK_WIRE_VERSION  # ranks still write what older collectors read
    bad = bytearray(v1)
    bad[6:8] = (1 | FLAG_PER_RANK).to_bytes(2, "little")
    with pytest.raises(WireError, match="unknown flags 0x3"):  # per-rank answers only in version 2
        decode_blocks(bytes(bad))
    lacking = encode_blocks(own.job, own.world, own.batch, own.rank_info, per_rank=True)
    with pytest.raises(WireError, match=r"ranks\[0\].group_entries"):
        decode_blocks(lacking)
    wrong = encode_blocks(own.job, own.world, own.batch, [own.rank_info[0] | {"group_entries": [99]}], per_rank=True)
    with pytest.raises(WireError, match=r"ranks\[0\].group_entries"):
        decode_blocks(wrong)


def test_the_detector_learns_a_group_without_member_runs_from_one_merged_body() -> None:
    """A group whose entry names no members is learnt from where each reporter sits; in a merged
    body every member reports at once, and every one of them must count."""
    from rankwatch.detector import DetectorConfig, JobDetector

    own = []
    for rank in range(4):
        h = {
            "job": "j",
            "rank": rank,
            "world": 4,
            "node": f"n{rank // 2}",
            "incarnation": f"i{rank}",
            "batch": 0,
            "mono_ns": 1_000_000_000,
            "groups": [{"id": "g", "size": 4, "group_rank": 3 - rank, "entered": 0, "completed": 0}],
        }
        own.append(decode_blocks(rank_body(h, from_batch(h, Records.empty()).blocks)))
    merged = decode_blocks(merge_bodies(own))
    assert "ranks" not in merged.batch.groups[0] and len(merged.batch.groups) == 1
    det = JobDetector(DetectorConfig())
    det.observe_blocks(merged.batch, 100.0)
    ch = det.topo.channel_id.get("g")
    assert ch is not None
    assert det.topo.slot_of(np.full(4, ch), np.arange(4)).min() >= 0  # every rank is a member
