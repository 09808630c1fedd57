"""Merging ranks' own block bodies into one body the collector decodes once and answers per rank.

A rank's block body carries about a hundred op records; the collector's cost for it is almost all
per body (header, checks, the job's bookkeeping, the detector's per-batch work), not per op. So
``rankwatch agent`` does not only frame the block bodies it gathers side by side (a multi-batch,
decoded body by body); it merges the bodies of one job into one body whose tables carry all
their ranks (``merge_bodies``), and the collector decodes it, folds it into the job and calls the
detector once. Each rank is still answered on its own: the body says so (block wire version 2,
flag bit 1, ``rankwatch.blockwire``), each rank object keeps the rank's own identity and batch
number (so the collector de-duplicates per rank) and lists the group entries its body had (so the
block sizes in its answer are about its own groups).

``pack`` decides what goes upstream for the bodies an agent gathered under one token: raw
batches, bodies that fail the collector's own checks (the collector answers them, with its
reason) and bodies alone in their job go as they came; the other block bodies of a job are
merged, a rank at most once per merged body, within the wire format's limits.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rankwatch.blockwire import (
    MAX_BLOCK_ROWS,
    MAX_P2P_ROWS,
    MAX_PROGRESS_ROWS,
    MAX_RANKS_PER_BODY,
    BlockBody,
    check_membership,
    decode_blocks,
    encode_blocks,
    is_block_body,
)
from rankwatch.errors import WireError
from rankwatch.sim.blocks import BlockBatch
from rankwatch.wire import MAX_BODY_BYTES, MAX_GROUPS_PER_BATCH, MAX_HEADER_BYTES

__all__ = ["Item", "merge_bodies", "pack"]

_TABLES = ("ranks", "progress", "p2p", "blocks")
# a merged body stays well inside what a collector takes: half of each limit, summed over parts
_LIMITS = {
    "ranks": MAX_RANKS_PER_BODY,
    "progress": MAX_PROGRESS_ROWS // 2,
    "p2p": MAX_P2P_ROWS // 2,
    "blocks": MAX_BLOCK_ROWS // 2,
    "groups": MAX_GROUPS_PER_BATCH,
    "header": MAX_HEADER_BYTES // 2,
    "bytes": MAX_BODY_BYTES // 2,
}


@dataclass(slots=True)
class Item:
    """One batch to send upstream: ``body``, standing for the gathered bodies at ``members``.

    ``merged``: ``body`` is a version-2 body made of those bodies (answered with one result per
    member, in order); otherwise it is the one member's body, byte for byte.
    """

    body: bytes
    members: list[int]
    merged: bool = False


def merge_bodies(bodies: Sequence[BlockBody], *, compress: bool = True) -> bytes:
    """One version-2 block body carrying several ranks' own bodies, to be answered per rank.

    Group entries that are the same in several bodies (a group's members send the same entry)
    travel once; entries that differ stay apart, so every row keeps what its rank said.

    Args:
        bodies: decoded one-rank bodies of one job (what ranks' shippers send), each rank in at
            most one of them.
        compress: zlib-compress the column block.

    Raises:
        ValueError: the bodies are of different jobs, a body is not one rank's own, or a rank is
            in two of them.
    """
    if not bodies:
        raise ValueError("nothing to merge")
    job = bodies[0].job
    if any(b.job != job for b in bodies):
        raise ValueError("only bodies of one job can be merged")
    if any(b.per_rank or len(b.rank_info) != 1 for b in bodies):
        raise ValueError("only one rank's own bodies can be merged (an aggregator's body is answered as a whole)")
    index: dict[str, int] = {}
    groups: list[dict[str, Any]] = []
    parts: dict[str, list[np.ndarray]] = {name: [] for name in _TABLES}
    group_rank: dict[tuple[int, int], int] = {}
    infos: list[dict[str, Any]] = []
    for body in bodies:
        bb = body.batch
        remap = np.empty(len(bb.groups), np.uint32)
        for i, entry in enumerate(bb.groups):
            key = json.dumps(entry, sort_keys=True, separators=(",", ":"))
            j = index.get(key)
            if j is None:
                j = index[key] = len(groups)
                groups.append(entry)
            remap[i] = j
        entries = remap.tolist()
        parts["ranks"].append(bb.ranks)
        for name in _TABLES[1:]:
            rows = getattr(bb, name)
            if rows.shape[0]:
                rows = rows.copy()
                rows["group"] = remap[rows["group"].astype(np.intp)]
            parts[name].append(rows)
        for (r, gi), pos in bb.group_rank.items():
            group_rank[(r, entries[gi])] = pos
        infos.extend(info | {"group_entries": entries} for info in body.rank_info)
    ranks = np.concatenate(parts["ranks"])
    if np.unique(ranks["rank"]).shape[0] != ranks.shape[0]:
        raise ValueError("a rank is in two of the bodies")
    merged = BlockBatch(
        groups=groups,
        ranks=ranks,
        progress=np.concatenate(parts["progress"]),
        p2p=np.concatenate(parts["p2p"]),
        blocks=np.concatenate(parts["blocks"]),
        nodes={},
        group_rank=group_rank,
    )
    world = max(b.world for b in bodies)
    return encode_blocks(job, world, merged, infos, compress=compress, per_rank=True)


@dataclass
class _Chunk:
    bodies: list[BlockBody] = field(default_factory=list)
    members: list[int] = field(default_factory=list)
    ranks: set[int] = field(default_factory=set)
    used: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_LIMITS, 0))

    def takes(self, body: BlockBody, cost: dict[str, int]) -> bool:
        if self.ranks.intersection(int(r["rank"]) for r in body.rank_info):
            return False
        return all(self.used[k] + cost[k] <= limit for k, limit in _LIMITS.items())

    def add(self, i: int, body: BlockBody, cost: dict[str, int]) -> None:
        self.bodies.append(body)
        self.members.append(i)
        self.ranks.update(int(r["rank"]) for r in body.rank_info)
        for k, v in cost.items():
            self.used[k] += v


def pack(bodies: Sequence[bytes], *, max_ranks: int | None = None, compress: bool = True) -> list[Item]:
    """What to send upstream for bodies gathered under one token: merged where that is safe.

    Only one rank's own block bodies are merged: a body that speaks for several ranks (an
    aggregator's, or another agent's merged body) expects one answer, and goes as it came.

    Args:
        bodies: the gathered bodies, raw batches and block bodies alike.
        max_ranks: the most ranks in one merged body (default: the wire format's limits only).
        compress: zlib-compress merged bodies' column blocks.

    Returns:
        Items covering every index of ``bodies`` exactly once.
    """
    items: list[Item] = []
    chunks: dict[str, list[_Chunk]] = {}
    for i, raw in enumerate(bodies):
        if not is_block_body(raw):
            items.append(Item(raw, [i]))
            continue
        try:
            body = decode_blocks(raw)
            check_membership(body.batch)
        except WireError:
            items.append(Item(raw, [i]))  # the collector says what is wrong with it, to this rank
            continue
        bb = body.batch
        if body.per_rank or len(body.rank_info) != 1:
            items.append(Item(raw, [i]))
            continue
        cost = {name: int(getattr(bb, name).shape[0]) for name in _TABLES}
        cost |= {"groups": len(bb.groups), "header": int.from_bytes(raw[8:12], "little"), "bytes": len(raw)}
        job_chunks = chunks.setdefault(body.job, [])
        chunk = next(
            (c for c in job_chunks if c.takes(body, cost) and (max_ranks is None or len(c.members) < max_ranks)),
            None,
        )
        if chunk is None:
            chunk = _Chunk()
            job_chunks.append(chunk)
        chunk.add(i, body, cost)
    for job_chunks in chunks.values():
        for c in job_chunks:
            if len(c.members) == 1:
                items.append(Item(bodies[c.members[0]], c.members))
            else:
                items.append(Item(merge_bodies(c.bodies, compress=compress), c.members, merged=True))
    return items
