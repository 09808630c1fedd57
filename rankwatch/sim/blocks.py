"""Sequence-aligned block summaries: what large jobs send instead of one record per op.

All members of a group issue the same sequence numbers, so "ops ``b*B+1 .. (b+1)*B`` of group g"
names the same ops on every member. A block summary is, for one rank, one group, one op class
(kind, size) and one such block: how many of those ops it completed, the sum, minimum and maximum
of its time inside them (``t_end - t_start``), and the first and last ``t_enter`` (its own clock).
Summaries are mergeable (sums, minima, maxima), so a rank may send a block in parts and the
collector adds them up. Point-to-point ops are summarised per (group, direction, peer), their
sequence being counted per peer.

``BlockBatch`` carries, for many ranks at once (one rank's shipper, or a per-node agent),
everything the detector needs: identity and liveness per rank, per-group progress (entered,
completed, in flight since), point-to-point ops in flight, and the blocks. ``from_batch`` turns a
raw ``wire.Batch`` into one, so the detector has a single way in. ``rankwatch.blockwire`` is
their wire encoding (what ranks in block mode, and aggregators, send).

    BLOCK_DTYPE      per (rank, group, class, block): count, sum/min/max ns, first/last enter
    PROGRESS_DTYPE   per (rank, group): entered, completed, in flight since
    P2P_DTYPE        per point-to-point op in flight: (rank, group, kind, peer, seq, since)
    RANK_DTYPE       per rank: clock at send time, flush period, state
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rankwatch.wire import KIND_NAMES, OpKind, Records

__all__ = [
    "BLOCK_DTYPE",
    "BLOCK_SEQS",
    "P2P_DTYPE",
    "PROGRESS_DTYPE",
    "RANK_DTYPE",
    "STATE_CODES",
    "BlockBatch",
    "from_batch",
    "summarise",
]

BLOCK_SEQS = 64
"""The largest block; a group's block size is a power of two up to this, the same on every member."""

STATE_CODES = {"running": 0, "goodbye": 1, "terminating": 2, "crashed": 3}

BLOCK_DTYPE = np.dtype(
    [
        ("rank", "<i4"),
        ("group", "<u4"),  # index into BlockBatch.groups
        ("kind", "u1"),  # OpKind of every op in the row
        ("peer", "<i4"),  # point-to-point: the peer's group rank; else -1
        ("nbytes", "<i8"),  # size of the row's ops (one size class: same bit length)
        ("block", "<i8"),  # ops with seq in [block * block_seqs + 1, (block + 1) * block_seqs]
        ("block_seqs", "<u2"),
        ("seq_hi", "<i8"),  # highest sequence number summarised
        ("count", "<u4"),
        ("sum_ns", "<i8"),  # time inside the ops: t_end - t_start
        ("min_ns", "<i8"),
        ("max_ns", "<i8"),
        ("first_enter_ns", "<i8"),  # the rank's own monotonic clock
        ("last_enter_ns", "<i8"),
    ]
)

PROGRESS_DTYPE = np.dtype(
    [
        ("rank", "<i4"),
        ("group", "<u4"),
        ("entered", "<i8"),
        ("completed", "<i8"),
        ("inflight_since_ns", "<i8"),  # -1: nothing in flight
        ("inflight_kind", "u1"),
    ]
)

P2P_DTYPE = np.dtype(
    [("rank", "<i4"), ("group", "<u4"), ("kind", "u1"), ("peer", "<i4"), ("seq", "<i8"), ("since_ns", "<i8")]
)

RANK_DTYPE = np.dtype(
    [("rank", "<i4"), ("world", "<i4"), ("mono_ns", "<i8"), ("flush_s", "<f4"), ("state", "u1"), ("restart", "<i4")]
)

_KIND_CODES = {name: code for code, name in KIND_NAMES.items()}
_P2P = np.array([int(OpKind.SEND), int(OpKind.RECV)], dtype=np.uint8)


@dataclass(slots=True)
class BlockBatch:
    """Liveness, progress and block summaries of one or more ranks, sent at one time.

    Args:
        groups: group descriptions (``id``, optional ``desc``, ``ranks`` runs, ``size``), as in
            the wire header; ``group`` columns index this list.
        ranks: one ``RANK_DTYPE`` row per rank in the batch.
        progress: ``PROGRESS_DTYPE`` rows, one per (rank, group) the rank is in.
        p2p: ``P2P_DTYPE`` rows for point-to-point ops in flight.
        blocks: ``BLOCK_DTYPE`` rows.
        nodes: node name of each rank in the batch.
        notes: per rank, whatever else its header said (``stack``, ``end_reason``, ``incarnation``, ``job``).
        group_rank: per (rank, group index), the rank's position in the group when it said so.
    """

    groups: list[dict[str, Any]]
    ranks: np.ndarray
    progress: np.ndarray
    p2p: np.ndarray
    blocks: np.ndarray
    nodes: dict[int, str]
    notes: dict[int, dict[str, Any]] = field(default_factory=dict)
    group_rank: dict[tuple[int, int], int] = field(default_factory=dict)


def _bitlen(x: np.ndarray) -> np.ndarray:
    """Bit length of non-negative int64 values (the size class of an op)."""
    x = np.asarray(x, dtype=np.int64)
    out = np.zeros(x.shape, np.int64)
    nz = x > 0
    out[nz] = np.floor(np.log2(x[nz].astype(np.float64))).astype(np.int64) + 1
    return out


def summarise(records: Records, rank: int | np.ndarray, block_seqs: np.ndarray) -> np.ndarray:
    """Summarise one rank's records into blocks (or several ranks' at once).

    Args:
        records: the rank's op records (``group`` indexes the rank's group list).
        rank: the rank's global rank; or, for records of several batches concatenated (their
            ``group`` made distinct per batch), each record's rank.
        block_seqs: block size for each group index (the same for every member of a group).

    Returns:
        ``BLOCK_DTYPE`` rows, one per (group, kind, peer, size class, block).
    """
    return summarise_rows(records, rank, block_seqs)[0]


def summarise_rows(records: Records, rank: int | np.ndarray, block_seqs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``summarise``, and for each block row the index of one of its records."""
    n = len(records)
    if not n:
        return np.zeros(0, BLOCK_DTYPE), np.zeros(0, np.int64)
    g = records.group.astype(np.int64)
    kind = records.kind.astype(np.int64)
    peer = records.peer.astype(np.int64)
    p2p = np.isin(records.kind, _P2P)
    peer = np.where(p2p, peer, -1)
    nbits = _bitlen(records.nbytes)
    bs = np.asarray(block_seqs, dtype=np.int64)[g]
    blk = (records.seq.astype(np.int64) - 1) // bs
    k1 = (((g << 8 | kind) << 7 | nbits) << 24) | (peer + 1)
    order = np.lexsort((records.seq, blk, k1))
    k1s, blks = k1[order], blk[order]
    starts = np.flatnonzero(np.r_[True, (k1s[1:] != k1s[:-1]) | (blks[1:] != blks[:-1])])
    d = (records.t_end - records.t_start)[order]
    te = records.t_enter[order]
    out = np.zeros(starts.shape[0], BLOCK_DTYPE)
    first = order[starts]
    out["rank"] = rank if isinstance(rank, int) else rank[first]
    out["group"] = g[first]
    out["kind"] = kind[first]
    out["peer"] = peer[first]
    out["nbytes"] = records.nbytes[first]
    out["block"] = blk[first]
    out["block_seqs"] = bs[first]
    out["seq_hi"] = np.maximum.reduceat(records.seq[order], starts)
    out["count"] = np.diff(np.r_[starts, n])
    out["sum_ns"] = np.add.reduceat(d, starts)
    out["min_ns"] = np.minimum.reduceat(d, starts)
    out["max_ns"] = np.maximum.reduceat(d, starts)
    out["first_enter_ns"] = np.minimum.reduceat(te, starts)
    out["last_enter_ns"] = np.maximum.reduceat(te, starts)
    return out, first


def from_batch(
    header: Mapping[str, Any], records: Records, block_seqs: np.ndarray | None = None, *, blocks: bool = True
) -> BlockBatch:
    """One rank's raw batch as a ``BlockBatch``.

    Args:
        header: the batch header (see ``docs/wire-format.md``).
        records: its op records.
        block_seqs: block size per header group index (default: 1, every op its own block).
        blocks: summarise the records (else the batch has no block rows: the caller does it).
    """
    rank = int(header["rank"])
    groups = list(header.get("groups", []))
    ng = len(groups)
    if block_seqs is None:
        block_seqs = np.ones(ng, np.int64)
    ranks = np.zeros(1, RANK_DTYPE)
    ranks["rank"] = rank
    ranks["world"] = int(header["world"])
    ranks["mono_ns"] = int(header["mono_ns"])
    ranks["flush_s"] = float(header.get("flush_s") or 1.0)
    ranks["state"] = STATE_CODES.get(str(header.get("state", "running")), 0)
    ranks["restart"] = int(header.get("restart") or 0)
    progress = np.zeros(ng, PROGRESS_DTYPE)
    p2p_rows: list[tuple[int, int, int, int, int, int]] = []
    group_rank: dict[tuple[int, int], int] = {}
    for i, e in enumerate(groups):
        progress[i] = (
            rank,
            i,
            int(e.get("entered", 0)),
            int(e.get("completed", 0)),
            int(e["inflight_since_ns"]) if e.get("inflight_since_ns") is not None else -1,
            _KIND_CODES.get(str(e.get("inflight_kind", "")), 0),
        )
        if "group_rank" in e:
            group_rank[(rank, i)] = int(e["group_rank"])
        for item in e.get("p2p_inflight") or ():
            try:
                kname, peer, seq, since = item
                p2p_rows.append((rank, i, _KIND_CODES.get(str(kname), 0), int(peer), int(seq), int(since)))
            except (TypeError, ValueError):
                continue
    p2p = np.array(p2p_rows, dtype=P2P_DTYPE) if p2p_rows else np.zeros(0, P2P_DTYPE)
    notes: dict[str, Any] = {}
    for key in ("stack", "end_reason", "incarnation", "job"):
        if header.get(key) is not None:
            notes[key] = header[key]
    return BlockBatch(
        groups=groups,
        ranks=ranks,
        progress=progress,
        p2p=p2p,
        blocks=summarise(records, rank, block_seqs) if blocks else np.zeros(0, BLOCK_DTYPE),
        nodes={rank: str(header.get("node", ""))},
        notes={rank: notes},
        group_rank=group_rank,
    )
