"""The block wire format: sequence-aligned block summaries instead of one record per op.

Large jobs send, per rank, per group and per block of sequence numbers, what
``rankwatch.sim.blocks`` defines (``BlockBatch``): a summary row per (group, op class, block),
per-group progress (entered, completed, in flight since) and point-to-point ops in flight. One
body may carry one rank (what a rank's shipper sends) or many (an aggregator). It is binary,
versioned and columnar; the collector decodes it into numpy arrays without a Python object per
row, let alone per op::

    offset  size  what
    0       4     magic b"RWK\\x00"
    4       2     format version, little-endian: 1 (``BLOCK_WIRE_VERSION``, what ranks send) or 2
                  (``MERGED_WIRE_VERSION``: version 1 plus flag bit 1 and ``group_entries``, below)
    6       2     flags (bit 0: the column block is zlib-compressed; bit 1, version 2 only: the
                  rank rows are separate ranks' own bodies merged by an agent, to be
                  de-duplicated and answered rank by rank)
    8       4     length H of the header
    12      4     number of rank rows R
    16      4     number of progress rows P
    20      4     number of point-to-point rows Q
    24      4     number of block rows K
    28      H     header: UTF-8 JSON object (job, world, groups, one identity object per rank)
    28+H    ...   column block: the tables below in this order, each field a little-endian column
                  of its table's row count, fields in dtype order

    table     fields (``rankwatch.sim.blocks``)
    ranks     RANK_DTYPE       rank, world, mono_ns, flush_s, state, restart
    progress  PROGRESS_DTYPE   rank, group, entered, completed, inflight_since_ns, inflight_kind
              + group_rank i4  the rank's position in the group, -1 when not said
    p2p       P2P_DTYPE        rank, group, kind, peer, seq, since_ns
    blocks    BLOCK_DTYPE      rank, group, kind, peer, nbytes, block, block_seqs, seq_hi, count,
                               sum_ns, min_ns, max_ns, first_enter_ns, last_enter_ns

In a version-2 body with flag bit 1 (``FLAG_PER_RANK``, what ``rankwatch.blockmerge`` writes for
``rankwatch agent``) each rank object also lists ``group_entries``: the indices of the header's
group entries its own body had, so the collector can answer each rank about its own groups.
Readers take both versions; ranks keep writing version 1, which older collectors read.

``docs/wire-format.md`` documents the header; ``decode_blocks`` checks everything it can.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rankwatch.errors import WireError
from rankwatch.sim.blocks import BLOCK_DTYPE, BLOCK_SEQS, P2P_DTYPE, PROGRESS_DTYPE, RANK_DTYPE, BlockBatch, from_batch
from rankwatch.wire import (
    _KIND_KNOWN,
    _KIND_P2P,
    _OPTIONAL,
    MAX_BODY_BYTES,
    MAX_GROUPS_PER_BATCH,
    MAX_HEADER_BYTES,
    MAX_NAME,
    Records,
    _tname,
    _validate_group,
    inflate,
    peek_prefixed,
    read_header,
)

__all__ = [
    "BLOCK_CONTENT_TYPE",
    "BLOCK_MAGIC",
    "BLOCK_WIRE_VERSION",
    "FLAG_PER_RANK",
    "MAX_BLOCK_ROWS",
    "MAX_P2P_ROWS",
    "MAX_PROGRESS_ROWS",
    "MAX_RANKS_PER_BODY",
    "MERGED_WIRE_VERSION",
    "BlockBody",
    "check_membership",
    "decode_blocks",
    "encode_blocks",
    "is_block_body",
    "peek_header",
    "rank_body",
]

BLOCK_WIRE_VERSION = 1
MERGED_WIRE_VERSION = 2
BLOCK_MAGIC = b"RWK\x00"
BLOCK_CONTENT_TYPE = "application/vnd.rankwatch.blocks"
FLAG_ZLIB = 1
FLAG_PER_RANK = 2
_FLAGS_KNOWN = {BLOCK_WIRE_VERSION: FLAG_ZLIB, MERGED_WIRE_VERSION: FLAG_ZLIB | FLAG_PER_RANK}

MAX_RANKS_PER_BODY = 65_536
MAX_PROGRESS_ROWS = 4_000_000
MAX_P2P_ROWS = 1_000_000
MAX_BLOCK_ROWS = 4_000_000

_PREFIX = struct.Struct("<4sHHIIIII")
_GROUP_RANK = np.dtype("<i4")
_TABLES: tuple[tuple[str, np.dtype[Any]], ...] = (
    ("ranks", RANK_DTYPE),
    ("progress", PROGRESS_DTYPE),
    ("p2p", P2P_DTYPE),
    ("blocks", BLOCK_DTYPE),
)
# progress, liveness and identity the header's group entries and rank objects must not repeat
# (they travel as columns)
_PROGRESS_KEYS = ("entered", "completed", "inflight_since_ns", "inflight_kind", "p2p_inflight", "group_rank")
_COLUMN_KEYS = ("job", "world", "groups", "mono_ns", "flush_s", "state", "restart")
_STATES = 4


@dataclass(frozen=True, slots=True)
class BlockBody:
    """A decoded block body: the job, its world size, the ranks' identity objects, the batch.

    ``rank_info[i]`` belongs to ``batch.ranks[i]``: at least ``rank``, ``node``,
    ``incarnation`` and ``batch`` (the rank's batch number), and any of the raw header's optional
    keys (``pid``, ``drops``, ``meta``, ``control``, ``stack``, ``end_reason``, ...). ``per_rank``:
    the body merges separate ranks' bodies (flag bit 1); then each rank object also has
    ``group_entries``, the indices of ``batch.groups`` that rank's own body had.
    """

    job: str
    world: int
    rank_info: list[dict[str, Any]]
    batch: BlockBatch
    per_rank: bool = False

    @property
    def records(self) -> int:
        """Op records the blocks stand for."""
        return int(self.batch.blocks["count"].sum(dtype=np.int64))


def is_block_body(body: bytes) -> bool:
    """Whether a request body is a block body (rather than a raw batch)."""
    return body[:4] == BLOCK_MAGIC


def peek_header(body: bytes) -> dict[str, Any]:
    """A block body's JSON header, without checking or decoding the rest.

    Raises:
        WireError: shorter than the prefix, or the header truncated or not a JSON object.
    """
    return peek_prefixed(body, _PREFIX, "block batch")


def encode_blocks(
    job: str,
    world: int,
    batch: BlockBatch,
    rank_info: Sequence[Mapping[str, Any]],
    *,
    compress: bool = True,
    per_rank: bool = False,
) -> bytes:
    """Serialise a ``BlockBatch``.

    Args:
        job: the job's name.
        world: the job's world size.
        batch: the rows; ``batch.groups`` become the header's group entries (progress keys in
            them are dropped: progress travels in columns).
        rank_info: one identity object per row of ``batch.ranks``, in the same order (a raw
            header's keys; the ones that travel as columns are dropped).
        compress: zlib-compress the column block (level 1).
        per_rank: the rank rows are separate ranks' own bodies, to be answered one by one (a
            version-2 body with flag bit 1; each rank object must carry ``group_entries``).

    Returns:
        The request body.
    """
    if len(rank_info) != batch.ranks.shape[0]:
        raise ValueError(f"{len(rank_info)} rank objects for {batch.ranks.shape[0]} rank rows")
    groups = [{k: v for k, v in g.items() if k not in _PROGRESS_KEYS} for g in batch.groups]
    ranks = [{k: v for k, v in r.items() if k not in _COLUMN_KEYS} for r in rank_info]
    header = {"job": job, "world": world, "groups": groups, "ranks": ranks}
    pr = batch.progress
    group_rank = np.full(pr.shape[0], -1, _GROUP_RANK)
    if batch.group_rank and pr.shape[0]:
        for i, (r, g) in enumerate(zip(pr["rank"].tolist(), pr["group"].tolist(), strict=True)):
            group_rank[i] = batch.group_rank.get((r, g), -1)
    parts: list[bytes] = []
    for name, dt in _TABLES:
        rows = np.asarray(getattr(batch, name))
        if rows.dtype != dt:
            raise ValueError(f"{name} rows must have dtype {dt}, not {rows.dtype}")
        for field in dt.names or ():
            parts.append(np.ascontiguousarray(rows[field]).tobytes())
        if name == "progress":
            parts.append(group_rank.tobytes())
    block = b"".join(parts)
    flags = FLAG_PER_RANK if per_rank else 0
    if compress:
        block = zlib.compress(block, 1)
        flags |= FLAG_ZLIB
    head = json.dumps(header, separators=(",", ":"), allow_nan=False).encode()
    counts = (batch.ranks.shape[0], pr.shape[0], batch.p2p.shape[0], batch.blocks.shape[0])
    version = MERGED_WIRE_VERSION if per_rank else BLOCK_WIRE_VERSION
    return _PREFIX.pack(BLOCK_MAGIC, version, flags, len(head), *counts) + head + block


def _row_bytes(dt: np.dtype[Any]) -> int:
    fields: Any = dt.fields
    return int(sum(fields[f][0].itemsize for f in dt.names or ()))


_ROW_BYTES = {name: _row_bytes(dt) for name, dt in _TABLES}
_FIELDS: dict[str, tuple[tuple[str, np.dtype[Any]], ...]] = {
    name: tuple((f, dt[f]) for f in dt.names or ()) for name, dt in _TABLES
}
_ROW_BYTES["progress"] += _GROUP_RANK.itemsize


def decode_blocks(body: bytes) -> BlockBody:
    """Parse and check one block body without building a Python object per row.

    Raises:
        WireError: the body is not a well-formed block body of a version this code reads; the
            message says what is wrong.
    """
    if len(body) > MAX_BODY_BYTES:
        raise WireError(f"block batch is {len(body)} bytes; the limit is {MAX_BODY_BYTES}")
    if len(body) < _PREFIX.size:
        raise WireError(f"block batch is {len(body)} bytes, shorter than the {_PREFIX.size}-byte prefix")
    magic, version, flags, head_len, n_ranks, n_prog, n_p2p, n_blocks = _PREFIX.unpack_from(body)
    if magic != BLOCK_MAGIC:
        raise WireError("not a rankwatch block batch (bad magic bytes)")
    known = _FLAGS_KNOWN.get(version)
    if known is None:
        raise WireError(
            f"block wire version {version} is not supported; this collector reads {BLOCK_WIRE_VERSION} "
            f"and {MERGED_WIRE_VERSION}"
        )
    if flags & ~known:
        raise WireError(f"unknown flags 0x{flags:x}")
    per_rank = bool(flags & FLAG_PER_RANK)
    if head_len > MAX_HEADER_BYTES:
        raise WireError(f"header is {head_len} bytes; the limit is {MAX_HEADER_BYTES}")
    for what, n, limit in (
        ("rank", n_ranks, MAX_RANKS_PER_BODY),
        ("progress", n_prog, MAX_PROGRESS_ROWS),
        ("point-to-point", n_p2p, MAX_P2P_ROWS),
        ("block", n_blocks, MAX_BLOCK_ROWS),
    ):
        if n > limit:
            raise WireError(f"block batch has {n} {what} rows; the limit is {limit}")
    header, end = read_header(body, _PREFIX.size, head_len, "block batch")
    counts = {"ranks": n_ranks, "progress": n_prog, "p2p": n_p2p, "blocks": n_blocks}
    need = sum(_ROW_BYTES[name] * n for name, n in counts.items())
    block = body[end:]
    if flags & FLAG_ZLIB:
        block = inflate(block, need)
    if len(block) != need:
        raise WireError(f"column block is {len(block)} bytes; the row counts in the prefix need {need}")
    tables: dict[str, np.ndarray] = {}
    off = 0
    group_rank = np.zeros(0, _GROUP_RANK)
    for name, dt in _TABLES:
        n = counts[name]
        rows = np.empty(n, dt)
        if n:
            for field, fdt in _FIELDS[name]:
                rows[field] = np.frombuffer(block, fdt, n, off)
                off += fdt.itemsize * n
            if name == "progress":
                group_rank = np.frombuffer(block, _GROUP_RANK, n, off)
                off += _GROUP_RANK.itemsize * n
        tables[name] = rows
    job, world, groups, rank_info = _validate_header(header, n_ranks, per_rank)
    bb = BlockBatch(
        groups=groups,
        ranks=tables["ranks"],
        progress=tables["progress"],
        p2p=tables["p2p"],
        blocks=tables["blocks"],
        nodes={int(r["rank"]): r["node"] for r in rank_info},
        notes={
            int(r["rank"]): {k: r[k] for k in ("stack", "end_reason", "incarnation") if r.get(k) is not None}
            | {"job": job}
            for r in rank_info
        },
    )
    _validate_rows(bb, world, rank_info)
    if n_prog and (group_rank >= 0).any():
        idx = np.flatnonzero(group_rank >= 0)
        pr = bb.progress
        bb.group_rank = dict(
            zip(
                zip(pr["rank"][idx].tolist(), pr["group"][idx].tolist(), strict=True),
                group_rank[idx].tolist(),
                strict=True,
            )
        )
    return BlockBody(job=job, world=world, rank_info=rank_info, batch=bb, per_rank=per_rank)


_RANK_REQUIRED: dict[str, type | tuple[type, ...]] = {"rank": int, "node": str, "incarnation": str, "batch": int}


def _validate_header(
    header: dict[str, Any], n_ranks: int, per_rank: bool = False
) -> tuple[str, int, list[dict[str, Any]], list[dict[str, Any]]]:
    job, world, groups, ranks = (header.get(k) for k in ("job", "world", "groups", "ranks"))
    if not isinstance(job, str) or not job or len(job) > MAX_NAME:
        raise WireError(f"header field 'job' must be a string of 1 to {MAX_NAME} characters")
    if not isinstance(world, int) or isinstance(world, bool) or not 1 <= world <= 10_000_000:
        raise WireError("header field 'world' must be an integer from 1 to 10,000,000")
    if not isinstance(groups, list):
        raise WireError("header field 'groups' must be a list")
    if len(groups) > MAX_GROUPS_PER_BATCH:
        raise WireError(f"batch names {len(groups)} groups; the limit is {MAX_GROUPS_PER_BATCH}")
    for i, g in enumerate(groups):
        _validate_group(i, g, world)
        bs = g.get("block_seqs", g.get("block_want"))
        if bs is not None and (not isinstance(bs, int) or isinstance(bs, bool) or not _pow2_upto(bs)):
            raise WireError(f"groups[{i}] block size must be a power of two from 1 to {BLOCK_SEQS}")
    if not isinstance(ranks, list) or len(ranks) != n_ranks:
        raise WireError(f"header field 'ranks' must be a list of {n_ranks} objects, one per rank row")
    ng = len(groups)
    for i, r in enumerate(ranks):
        if not isinstance(r, dict):
            raise WireError(f"ranks[{i}] must be an object")
        for key, typ in _RANK_REQUIRED.items():
            v = r.get(key)
            if not isinstance(v, typ) or isinstance(v, bool):
                raise WireError(f"ranks[{i}] lacks {key!r} or it is not {_tname(typ)}")
        if len(r) > 4:  # the optional keys it has (a rank object has a few of the many there are)
            for key, v in r.items():
                opt = _OPTIONAL.get(key)
                if opt is not None and v is not None and not isinstance(v, opt):
                    raise WireError(f"ranks[{i}].{key} must be {_tname(opt)}")
        node, incarnation, rank = r["node"], r["incarnation"], r["rank"]
        if not node or len(node) > MAX_NAME or not incarnation or len(incarnation) > MAX_NAME:
            raise WireError(f"ranks[{i}] node and incarnation must be 1 to {MAX_NAME} characters")
        if r["batch"] < 0 or not 0 <= rank < world:
            raise WireError(f"ranks[{i}]: rank {rank} must be within world size {world}, its batch number >= 0")
        if per_rank:
            entries = r.get("group_entries")
            if (
                not isinstance(entries, list)
                or len(entries) > MAX_GROUPS_PER_BATCH
                or not all(type(e) is int and 0 <= e < ng for e in entries)
            ):
                raise WireError(f"ranks[{i}].group_entries must list indices of the header's groups")
    return job, world, groups, ranks


def _pow2_upto(b: int) -> bool:
    return 1 <= b <= BLOCK_SEQS and b & (b - 1) == 0


_POW2_OK = np.zeros(1 << 16, bool)  # by block_seqs (a u2 column): a power of two from 1 to BLOCK_SEQS
_POW2_OK[[1 << i for i in range(BLOCK_SEQS.bit_length())]] = True
_INFLIGHT_KIND_OK = _KIND_KNOWN.copy()
_INFLIGHT_KIND_OK[0] = True  # nothing in flight


def _validate_rows(bb: BlockBatch, world: int, rank_info: list[dict[str, Any]]) -> None:
    """Check the tables' rows: one combined verdict per table, as few numpy calls as it takes
    (a body from one node has a few dozen rows, so the calls cost more than the rows); the
    checks one by one only to say what is wrong.

    Raises:
        WireError: the first thing wrong, in the order ``_explain_rows`` checks.
    """
    if not _rows_look_right(bb, world, rank_info):
        _explain_rows(bb, world, rank_info)


def _rows_look_right(bb: BlockBatch, world: int, rank_info: list[dict[str, Any]]) -> bool:
    """Whether every check of ``_explain_rows`` passes (False may still be a false alarm)."""
    rr = bb.ranks
    ranks = rr["rank"].tolist()
    if ranks != [r["rank"] for r in rank_info] or len(set(ranks)) != len(ranks):
        return False
    if ranks:
        w, fs = rr["world"], rr["flush_s"]
        if ((w < 1) | (w > world) | (rr["state"] >= _STATES) | ~(fs > 0) | (fs == np.inf) | (rr["restart"] < 0)).any():
            return False
    tables = [t for t in (bb.progress, bb.p2p, bb.blocks) if t.shape[0]]
    if not tables:
        return True
    if not ranks:
        return False
    group = tables[0]["group"] if len(tables) == 1 else np.concatenate([t["group"] for t in tables])
    if int(group.max()) >= len(bb.groups):
        return False
    rank = tables[0]["rank"] if len(tables) == 1 else np.concatenate([t["rank"] for t in tables])
    known = np.sort(rr["rank"])
    if not (known[np.minimum(np.searchsorted(known, rank), known.shape[0] - 1)] == rank).all():
        return False
    pr = bb.progress
    if pr.shape[0]:
        c = pr["completed"]
        if ((c < 0) | (c > pr["entered"]) | ~_INFLIGHT_KIND_OK[pr["inflight_kind"]]).any():
            return False
    pp = bb.p2p
    if pp.shape[0] and (~_KIND_P2P[pp["kind"]] | (pp["seq"] < 1) | (pp["peer"] < 0)).any():
        return False
    b = bb.blocks
    if b.shape[0]:
        bs, cnt, blk, hi, mn = b["block_seqs"], b["count"], b["block"], b["seq_hi"], b["min_ns"]
        lo = blk * bs + 1
        bad = ~_POW2_OK[bs] | ~_KIND_KNOWN[b["kind"]] | (cnt < 1) | (cnt > bs) | (blk < 0) | (hi < lo)
        bad |= (hi >= lo + bs) | (b["nbytes"] < 0) | (b["peer"] < -1) | (mn < 0) | (mn > b["max_ns"])
        bad |= (b["sum_ns"] < 0) | (b["first_enter_ns"] > b["last_enter_ns"])
        said = [g.get("block_seqs") or 0 for g in bb.groups]
        if any(said):
            gb = np.array(said, np.int64)[b["group"]]
            bad |= (gb != 0) & (gb != bs)
        if bad.any():
            return False
    return True


def _explain_rows(bb: BlockBatch, world: int, rank_info: list[dict[str, Any]]) -> None:
    rr = bb.ranks
    ranks = rr["rank"].astype(np.int64)
    said = np.fromiter((r["rank"] for r in rank_info), np.int64, len(rank_info))
    if not np.array_equal(ranks, said):
        raise WireError("rank rows and the header's rank objects disagree on which rank is which")
    sorted_ranks = np.sort(ranks)
    if sorted_ranks.shape[0] > 1 and (np.diff(sorted_ranks) == 0).any():
        raise WireError("a rank appears twice in one block batch")
    if rr.shape[0]:
        if int(rr["world"].min()) < 1 or int(rr["world"].max()) > world:
            raise WireError(f"a rank row's world size is not within 1..{world}")
        if int(rr["state"].max()) >= _STATES:
            raise WireError(f"unknown rank state code {int(rr['state'].max())}")
        fs = rr["flush_s"]
        if not np.isfinite(fs).all() or (fs <= 0).any():
            raise WireError("flush_s must be a positive number")
        if int(rr["restart"].min()) < 0:
            raise WireError("restart counts must not be negative")
    ng = len(bb.groups)
    for name, rows in (("progress", bb.progress), ("p2p", bb.p2p), ("blocks", bb.blocks)):
        if not rows.shape[0]:
            continue
        if int(rows["group"].max()) >= ng:
            raise WireError(f"a {name} row names group index {int(rows['group'].max())}; the batch has {ng} groups")
        r = rows["rank"].astype(np.int64)
        pos = np.searchsorted(sorted_ranks, r)
        if sorted_ranks.shape[0] == 0 or not (sorted_ranks[np.minimum(pos, sorted_ranks.shape[0] - 1)] == r).all():
            raise WireError(f"a {name} row is about a rank that has no rank row in this batch")
    pr = bb.progress
    if pr.shape[0]:
        if int(pr["completed"].min()) < 0 or (pr["completed"] > pr["entered"]).any():
            raise WireError("progress: completed must be >= 0 and not ahead of entered")
        if not _KIND_KNOWN[pr["inflight_kind"]][pr["inflight_kind"] != 0].all():
            raise WireError("progress: unknown in-flight op kind")
    pp = bb.p2p
    if pp.shape[0]:
        if not _KIND_P2P[pp["kind"]].all():
            raise WireError("a point-to-point row must be a send or a recv")
        if int(pp["seq"].min()) < 1 or int(pp["peer"].min()) < 0:
            raise WireError("point-to-point rows need seq >= 1 and a peer >= 0")
    b = bb.blocks
    if b.shape[0]:
        bs = b["block_seqs"].astype(np.int64)
        if int(bs.min()) < 1 or int(bs.max()) > BLOCK_SEQS or ((bs & (bs - 1)) != 0).any():
            raise WireError(f"block sizes must be powers of two from 1 to {BLOCK_SEQS}")
        if not _KIND_KNOWN[b["kind"]].all():
            raise WireError(f"unknown op kind {int(b['kind'][~_KIND_KNOWN[b['kind']]][0])}")
        cnt = b["count"].astype(np.int64)
        if int(cnt.min()) < 1 or (cnt > bs).any():
            raise WireError("a block row's count must be from 1 to its block size")
        blk = b["block"]
        lo = blk * bs + 1
        if int(blk.min()) < 0 or (b["seq_hi"] < lo).any() or (b["seq_hi"] >= lo + bs).any():
            raise WireError("a block row's seq_hi is not within its block")
        if int(b["nbytes"].min()) < 0 or int(b["peer"].min()) < -1:
            raise WireError("a block row has negative nbytes or a peer below -1")
        if int(b["min_ns"].min()) < 0 or (b["min_ns"] > b["max_ns"]).any() or int(b["sum_ns"].min()) < 0:
            raise WireError("a block row's times must satisfy 0 <= min_ns <= max_ns and sum_ns >= 0")
        if (b["first_enter_ns"] > b["last_enter_ns"]).any():
            raise WireError("a block row's first_enter_ns is after its last_enter_ns")
        said_bs = np.fromiter((int(g.get("block_seqs") or 0) for g in bb.groups), np.int64, ng)
        gb = said_bs[b["group"].astype(np.int64)]
        if ((gb != 0) & (gb != bs)).any():
            raise WireError("a block row's block size differs from its group's block_seqs")


_ANYONE = (0, 1 << 62, 1)


def check_membership(bb: BlockBatch) -> None:
    """Check that every row's rank is a member of the group it names (where the group says its
    members), as the collector does for raw batches.

    A group entry is almost always one run (``[start, stop, step]``): those are checked for all
    rows at once; entries of several runs (an irregular group) one entry at a time.

    Raises:
        WireError: naming the first group (by entry index) with an outsider, and its lowest
            outsider.
    """
    ng = len(bb.groups)
    if not ng:
        return
    tables = [t for t in (bb.progress, bb.p2p, bb.blocks) if t.shape[0]]
    if not tables:
        return
    one: list[Any] = []  # [start, stop, step] of each entry of one run; anyone's for the others
    several: list[int] = []
    for i, entry in enumerate(bb.groups):
        runs = entry.get("ranks")
        if runs and len(runs) == 1:
            one.append(runs[0])
        else:
            one.append(_ANYONE)
            if runs:
                several.append(i)
    g = np.concatenate([t["group"] for t in tables]).astype(np.intp)
    r = np.concatenate([t["rank"] for t in tables]).astype(np.int64)
    start, stop, step = np.array(one, np.int64)[g].T
    bad = (r < start) | (r >= stop) | ((r - start) % step != 0)
    for i in several:
        rows = np.flatnonzero(g == i)
        if rows.shape[0]:
            rs = r[rows]
            ok = np.zeros(rs.shape[0], bool)
            for a, b, c in bb.groups[i]["ranks"]:
                ok |= (rs >= a) & (rs < b) & ((rs - a) % c == 0)
            bad[rows] = ~ok
    if bad.any():
        gi = int(g[bad].min())
        outsider = int(r[bad & (g == gi)].min())
        raise WireError(f"rank {outsider} reports groups[{gi}] ({bb.groups[gi]['id']!r}) but is not one of its members")


def rank_body(header: Mapping[str, Any], blocks: np.ndarray, *, compress: bool = True) -> bytes:
    """One rank's block batch, from a raw batch's header and the rank's block rows.

    Args:
        header: what the rank would send in raw mode (``docs/wire-format.md``); its group
            entries' progress keys become the progress and point-to-point columns.
        blocks: ``BLOCK_DTYPE`` rows whose ``group`` indexes ``header["groups"]``.
        compress: zlib-compress the column block.
    """
    bb = from_batch(header, Records.empty())
    bb.blocks = blocks
    return encode_blocks(str(header["job"]), int(header["world"]), bb, [header], compress=compress)
