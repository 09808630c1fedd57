"""Per-job state kept in memory: ranks, groups, op counts, batch de-duplication, pending commands.

One ``JobState`` per job, updated by every accepted batch under the job's lock. It is what
``GET /jobs`` shows for live jobs and what the storage layer persists; raw records go to the
detector, never here. It remembers which ranks and groups changed since the last write, so the
persist loop writes those rows only (a 100,000-rank job does not rewrite every rank every pass).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import numpy as np

from rankwatch.blockwire import BlockBody
from rankwatch.collector.recent import RecentOps
from rankwatch.collector.summaries import GroupSummaries
from rankwatch.sim.blocks import STATE_CODES, BlockBatch
from rankwatch.wire import KIND_NAMES, Batch, runs_to_ranks

__all__ = ["Command", "GroupInfo", "JobChanges", "JobState", "RankInfo", "iso"]

_command_ids = itertools.count(1)


def iso(ts: float | None) -> str | None:
    """Seconds since the epoch as ISO 8601 UTC with milliseconds (how the API shows times)."""
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(slots=True)
class RankInfo:
    """What the collector knows of one rank."""

    rank: int
    node: str
    incarnation: str
    first_seen: float
    last_seen: float
    pid: int | None = None
    restart: int = 0
    state: str = "running"
    ops: int = 0
    drops: int = 0
    batches: int = 0
    last_batch: int = -1
    flush_s: float = 1.0
    end_reason: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    stack: str | None = None
    control_allowed: bool = False
    commands_ignored: int = 0

    def public(self, now: float) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "node": self.node,
            "pid": self.pid,
            "incarnation": self.incarnation,
            "restart": self.restart,
            "state": self.state,
            "first_seen": iso(self.first_seen),
            "last_seen": iso(self.last_seen),
            "silent_s": round(max(0.0, now - self.last_seen), 3),
            "ops": self.ops,
            "drops": self.drops,
            "batches": self.batches,
            "end_reason": self.end_reason,
            "control_allowed": self.control_allowed,
            "commands_ignored": self.commands_ignored,
            "meta": self.meta,
        }

    def row(self, job_id: str) -> dict[str, Any]:
        """The ``ranks`` table row."""
        return {
            "job_id": job_id,
            "rank": self.rank,
            "node": self.node,
            "pid": self.pid,
            "incarnation": self.incarnation,
            "restart": self.restart,
            "state": self.state,
            "first_seen": self.first_seen,
            "last_seen": self.last_seen,
            "ops": self.ops,
            "drops": self.drops,
            "batches": self.batches,
            "last_batch": self.last_batch,
            "end_reason": self.end_reason,
            "meta": self.meta,
        }


@dataclass(slots=True)
class GroupInfo:
    """What the collector knows of one process group of a job."""

    gid: str
    desc: str | None = None
    members: list[int] | None = None
    size: int | None = None
    backend: str | None = None
    last_seq: int = 0
    ops: int = 0
    op_counts: dict[str, int] = field(default_factory=dict)
    reporters: set[int] = field(default_factory=set)
    runs: list[Any] | None = None  # the member runs ``members`` was expanded from
    members_dirty: bool = True  # members changed since written (a 100k-rank list is not rewritten each pass)
    block_seqs: int | None = None  # block size its members use in block mode (settled by the first word)
    entry: Mapping[str, Any] | None = None  # the header entry it was last described by

    def public(self) -> dict[str, Any]:
        members = self.members if self.members is not None else sorted(self.reporters)
        return {
            "id": self.gid,
            "desc": self.desc,
            "ranks": members,
            "size": self.size if self.size is not None else len(members),
            "backend": self.backend,
            "last_seq": self.last_seq,
            "ops": self.ops,
            "op_counts": dict(sorted(self.op_counts.items())),
            "block_seqs": self.block_seqs,
        }

    def row(self, job_id: str, *, members: bool = True) -> dict[str, Any]:
        """The ``groups`` table row (without ``members`` unless asked)."""
        out: dict[str, Any] = {"members": self.members} if members else {}
        return out | {
            "job_id": job_id,
            "gid": self.gid,
            "desc": self.desc,
            "size": self.size,
            "backend": self.backend,
            "last_seq": self.last_seq,
            "ops": self.ops,
            "op_counts": dict(self.op_counts),
        }


@dataclass(slots=True)
class Command:
    """A command for one rank, carried in the reply to its next batch until it is acknowledged."""

    id: str
    rank: int
    type: str
    args: dict[str, Any]
    created: float
    delivered: float | None = None
    result: str | None = None  # "done" or "ignored" once acknowledged

    def wire(self) -> dict[str, Any]:
        return {"id": self.id, "type": self.type, **self.args}


class JobState:
    """Everything in memory about one job."""

    REDELIVER_S = 10.0

    def __init__(self, job_id: str, now: float, *, summary_window_s: float = 60.0) -> None:
        self.job_id = job_id
        self.first_seen = now
        self.last_seen = now
        self.world = 0
        self.ranks: dict[int, RankInfo] = {}
        self.groups: dict[str, GroupInfo] = {}
        self.lock = threading.RLock()
        self.commands: dict[str, Command] = {}
        self.dirty = True
        self.stored = False  # the job's row is in the database
        self.dirty_ranks: set[int] = set()
        self.dirty_groups: set[str] = set()
        self.summaries = GroupSummaries(summary_window_s)
        self.policy: dict[str, Any] | None = None
        self.records = 0
        self.batches = 0
        self.wire_bytes = 0
        self.detector: Any = None
        self.recent = RecentOps()
        self.flight_recorder: dict[int, dict[str, Any]] = {}
        self.fr_requests: dict[str, dict[int, str]] = {}  # suspect key -> rank -> command id
        self.fr_attached: dict[str, int] = {}

    # -- batches ----------------------------------------------------------------------------------
    def is_duplicate(self, rank: int, incarnation: str, batch_no: int) -> bool:
        """A batch already taken: same rank, same incarnation, number not above the last taken.

        A rank ships its batches in order and retries only the pending one, so the highest
        accepted number per incarnation is enough. A restarted process has a new incarnation.
        """
        info = self.ranks.get(rank)
        return info is not None and info.incarnation == incarnation and batch_no <= info.last_batch

    def apply(self, batch: Batch, now: float) -> None:
        """Fold an accepted batch into the job's ranks, groups and counts."""
        h = batch.header
        r = batch.records
        rank = h["rank"]
        self.world = max(self.world, h["world"])
        self.last_seen = now
        self.batches += 1
        self.records += len(r)
        self._take_rank(h, len(r), now)
        groups = h["groups"]
        gids = tuple(g["id"] for g in groups)
        self.recent.add(rank, gids, r)
        counts = _counts(r, len(groups))
        self.summaries.add(rank, gids, r, now)
        for i, g in enumerate(groups):
            gi = self._take_group(g)
            gi.last_seq = max(gi.last_seq, int(g.get("entered", 0)))
            gi.reporters.add(rank)
            for kind, n in counts.get(i, {}).items():
                gi.op_counts[kind] = gi.op_counts.get(kind, 0) + n
                gi.ops += n
        self.dirty = True

    def fresh_ranks(self, body: BlockBody) -> list[bool]:
        """For each rank object of a block batch: whether its batch is new (not a retry)."""
        return [not self.is_duplicate(r["rank"], r["incarnation"], r["batch"]) for r in body.rank_info]

    def apply_blocks(self, body: BlockBody, now: float, fresh: list[bool] | None = None) -> BlockBatch | None:
        """Fold an accepted block batch into the job's ranks, groups and counts.

        Ranks whose batch was already taken (a retry) are left out; ``None`` when that is all of
        them, else the batch without their rows (what the detector should see). Works on the
        columns: a Python step per rank and per group, none per row or op.

        Args:
            body: the decoded batch.
            now: server time.
            fresh: ``fresh_ranks(body)``, if the caller has it already.
        """
        bb = body.batch
        infos = body.rank_info
        if fresh is None:
            fresh = self.fresh_ranks(body)
        if not any(fresh):
            return None
        if not all(fresh):
            keep = np.array([r["rank"] for r, f in zip(infos, fresh, strict=True) if f], np.int64)
            infos = [r for r, f in zip(infos, fresh, strict=True) if f]
            bb = _only_ranks(bb, keep)
        rr, blocks, pr = bb.ranks, bb.blocks, bb.progress
        self.world = max(self.world, body.world)
        self.last_seen = now
        self.batches += 1
        cnt = blocks["count"].astype(np.int64)
        n_records = int(cnt.sum())
        self.records += n_records
        per_rank = records_per_rank(bb)
        states = _STATE_NAMES
        for info, (_, _, _, flush_s, state, restart), n_ops in zip(infos, rr.tolist(), per_rank, strict=True):
            self._take_rank(info, n_ops, now, state=states[state], restart=restart, flush_s=flush_s)
        entries = bb.groups
        ng = len(entries)
        entered = [0] * ng
        if pr.shape[0]:
            top = np.zeros(ng, np.int64)
            np.maximum.at(top, pr["group"].astype(np.intp), pr["entered"])
            entered = top.tolist()
        ops_by_group: dict[int, list[tuple[str, int]]] = {}
        for (gx, kind), n in _op_counts(blocks, cnt).items():
            ops_by_group.setdefault(gx, []).append((KIND_NAMES.get(kind) or str(kind), n))
        groups, dirty = self.groups, self.dirty_groups
        for i, entry in enumerate(entries):
            gi = groups.get(entry["id"])
            if gi is None or gi.entry != entry:  # the same entry as last time changes nothing
                gi = self._take_group(entry)
            else:
                dirty.add(gi.gid)
            if entered[i] > gi.last_seq:
                gi.last_seq = entered[i]
            if gi.runs is None:  # only shown while the members are unknown
                gi.reporters.update(pr["rank"][pr["group"] == i].tolist())
            for name, n in ops_by_group.get(i, ()):
                gi.op_counts[name] = gi.op_counts.get(name, 0) + n
                gi.ops += n
        self.summaries.add_blocks(tuple(g["id"] for g in entries), bb, now, n_records)
        self.dirty = True
        return bb

    def block_sizes(self, groups: list[dict[str, Any]]) -> dict[str, int]:
        """Settle each group's block size and say which a rank should be told.

        The first word about a group stands: a block size a rank already uses (``block_seqs``,
        e.g. after a service restart) or the one it proposes (``block_want``, from its op rate).
        Every member is then told the same size, so their blocks name the same ops.

        Returns:
            ``{group id: block size}`` for the groups whose entry does not use the settled size.
        """
        out: dict[str, int] = {}
        for g, size in zip(groups, self.entry_block_sizes(groups), strict=True):
            if size is not None:
                out[g["id"]] = size
        return out

    def entry_block_sizes(self, groups: list[dict[str, Any]]) -> list[int | None]:
        """``block_sizes`` per group entry: the size to tell its sender, ``None`` where it uses it."""
        out: list[int | None] = []
        for g in groups:
            gi = self.groups.get(g["id"])
            size = None
            if gi is not None:
                if gi.block_seqs is None:
                    gi.block_seqs = g.get("block_seqs") or g.get("block_want")
                if gi.block_seqs is not None and g.get("block_seqs") != gi.block_seqs:
                    size = gi.block_seqs
            out.append(size)
        return out

    def _take_rank(
        self,
        h: Mapping[str, Any],
        n_ops: int,
        now: float,
        *,
        state: str | None = None,
        restart: int | None = None,
        flush_s: float | None = None,
    ) -> RankInfo:
        """Update one rank from its header (a raw batch's, or a block batch's rank object, whose
        ``state``, ``restart`` and ``flush_s`` travel in columns and are passed apart)."""
        rank = h["rank"]
        info = self.ranks.get(rank)
        if info is None or info.incarnation != h["incarnation"]:
            old = info
            info = RankInfo(
                rank=rank,
                node=h["node"],
                incarnation=h["incarnation"],
                first_seen=now if old is None else old.first_seen,
                last_seen=now,
            )
            if old is not None:  # a restarted process: keep the rank's totals across incarnations
                info.ops, info.batches = old.ops, old.batches
            self.ranks[rank] = info
        self.dirty_ranks.add(rank)
        get = h.get
        info.node = h["node"]
        info.last_seen = now
        info.last_batch = h["batch"]
        info.batches += 1
        info.ops += n_ops
        info.drops = int(get("drops", 0))
        info.pid = get("pid")
        info.restart = int(get("restart", 0)) if restart is None else restart
        info.state = get("state", "running") if state is None else state
        info.flush_s = float(get("flush_s", 1.0)) if flush_s is None else flush_s
        info.end_reason = get("end_reason")
        info.stack = get("stack")
        meta = get("meta")
        if meta:
            info.meta = meta
        control = get("control")
        if control:
            info.control_allowed = bool(control.get("allowed", False))
            info.commands_ignored = int(control.get("ignored_total", 0) or 0)
            self._ack(control, now)
        else:
            info.control_allowed = False
            info.commands_ignored = 0
        attachments = get("attachments")
        if attachments:
            fr = attachments.get("flight_recorder")
            if isinstance(fr, dict):
                self.flight_recorder[rank] = {
                    "command": fr.get("command"),
                    "received": iso(now),
                    "trace": fr.get("trace"),
                }
        return info

    def _take_group(self, g: Mapping[str, Any]) -> GroupInfo:
        """Update a group's description from a header entry."""
        gi = self.groups.get(g["id"])
        if gi is None:
            gi = self.groups[g["id"]] = GroupInfo(gid=g["id"])
        self.dirty_groups.add(gi.gid)
        gi.desc = g.get("desc", gi.desc)
        runs = g.get("ranks")
        if runs and runs != gi.runs:  # expanded once per change, not per batch: O(world) each
            gi.members = runs_to_ranks(runs)
            gi.runs = runs
            gi.members_dirty = True
        if isinstance(g.get("size"), int):
            gi.size = g["size"]
        gi.backend = g.get("backend", gi.backend)
        gi.entry = g
        return gi

    # -- persistence ------------------------------------------------------------------------------
    def take_changes(self, now: float, writer: str) -> JobChanges | None:
        """The rows that changed since the last call, as dicts for the database, and the batches
        queued for the summaries (call under the lock; the persisting thread folds those after);
        ``None`` when nothing changed. ``put_back`` undoes it if the write fails."""
        if not (self.dirty or self.dirty_ranks or self.dirty_groups or self.summaries.pending):
            if not any_dirty(self.summaries):
                return None
        ranks, groups = self.dirty_ranks, self.dirty_groups
        self.dirty, self.dirty_ranks, self.dirty_groups = False, set(), set()
        queued = self.summaries.take_pending()
        new_members = {g for g in groups if g in self.groups and self.groups[g].members_dirty}
        for g in new_members:
            self.groups[g].members_dirty = False
        return JobChanges(
            job={
                "id": self.job_id,
                "first_seen": self.first_seen,
                "last_seen": self.last_seen,
                "world": self.world,
                "state": self.state(),
            },
            ranks=[self.ranks[r].row(self.job_id) for r in sorted(ranks) if r in self.ranks],
            groups=[
                self.groups[g].row(self.job_id, members=False) for g in sorted(groups - new_members) if g in self.groups
            ],
            groups_with_members=[self.groups[g].row(self.job_id, members=True) for g in sorted(new_members)],
            queued=queued,
            rank_keys=ranks,
            group_keys=groups,
            member_keys=new_members,
        )

    def put_back(self, changes: JobChanges) -> None:
        """Mark what ``changes`` held as unwritten again (its write failed)."""
        self.dirty = True
        self.dirty_ranks |= changes.rank_keys
        self.dirty_groups |= changes.group_keys
        for g in changes.member_keys:
            if g in self.groups:
                self.groups[g].members_dirty = True
        self.summaries.mark_dirty(changes.window_keys)

    # -- commands ---------------------------------------------------------------------------------
    def queue_command(self, rank: int, kind: str, now: float, **args: Any) -> Command:
        cmd = Command(id=f"c{next(_command_ids)}-{int(now * 1000)}", rank=rank, type=kind, args=args, created=now)
        self.commands[cmd.id] = cmd
        return cmd

    def command_status(self) -> list[dict[str, Any]]:
        return [
            {
                "id": c.id,
                "rank": c.rank,
                "type": c.type,
                "args": c.args,
                "created": iso(c.created),
                "delivered": iso(c.delivered),
                "result": c.result,
            }
            for c in self.commands.values()
        ]

    def commands_for(self, rank: int, now: float) -> list[dict[str, Any]]:
        """Commands to put in the reply to ``rank``'s batch (new ones, and unacknowledged old ones)."""
        out = []
        for cmd in self.commands.values():
            if cmd.rank != rank or cmd.result is not None:
                continue
            if cmd.delivered is None or now - cmd.delivered > self.REDELIVER_S:
                cmd.delivered = now
                out.append(cmd.wire())
        return out

    def _ack(self, control: dict[str, Any], now: float) -> None:
        for key, result in (("done", "done"), ("ignored", "ignored")):
            for cid in control.get(key) or []:
                cmd = self.commands.get(str(cid))
                if cmd is not None:
                    cmd.result = result

    # -- views ------------------------------------------------------------------------------------
    def nodes(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for r in sorted(self.ranks):
            out.setdefault(self.ranks[r].node, []).append(r)
        return out

    def summary(self, now: float | None = None) -> dict[str, Any]:
        now = time.time() if now is None else now
        states: dict[str, int] = {}
        for info in self.ranks.values():
            states[info.state] = states.get(info.state, 0) + 1
        return {
            "id": self.job_id,
            "world": self.world,
            "ranks_seen": len(self.ranks),
            "nodes": len({i.node for i in self.ranks.values()}),
            "first_seen": iso(self.first_seen),
            "last_seen": iso(self.last_seen),
            "state": self.state(),
            "rank_states": states,
            "ops": self.records,
            "wire_bytes": self.wire_bytes,
            "groups": len(self.groups),
        }

    def state(self) -> str:
        if not self.ranks:
            return "running"
        states = {i.state for i in self.ranks.values()}
        if states == {"goodbye"}:
            return "finished"
        if "running" in states:
            return "running"
        return "ended"

    def detail(self, now: float | None = None) -> dict[str, Any]:
        now = time.time() if now is None else now
        out = self.summary(now)
        out["ranks"] = [self.ranks[r].public(now) for r in sorted(self.ranks)]
        out["groups"] = [self.groups[g].public() for g in sorted(self.groups, key=_group_order)]
        out["node_ranks"] = self.nodes()
        out["policy"] = self.policy
        return out


def _group_order(gid: str) -> tuple[int, str]:
    head = gid.split("#", 1)[0]
    return (int(head), gid) if head.isdigit() else (1 << 62, gid)


def _counts(r: Any, ngroups: int) -> dict[int, dict[str, int]]:
    """Op counts per group index and kind name, computed on the columns (a bincount: cheaper
    than ``np.unique`` at a batch's size)."""
    if not len(r):
        return {}
    key = r.group.astype(np.intp) * 256 + r.kind.astype(np.intp)
    n = np.bincount(key)
    out: dict[int, dict[str, int]] = {}
    for k in np.flatnonzero(n).tolist():
        g, kind = divmod(k, 256)
        out.setdefault(g, {})[KIND_NAMES.get(kind, str(kind))] = int(n[k])
    return out


_STATE_NAMES = {code: name for name, code in STATE_CODES.items()}
_FEW_ROWS = 64


def records_per_rank(bb: BlockBatch) -> list[int]:
    """Op records each rank row's blocks stand for, in the order of the rank rows (which are
    unique, so a sorted search finds each block's rank); plain Python for a node's few rows."""
    rr, blocks = bb.ranks, bb.blocks
    n = rr.shape[0]
    if not blocks.shape[0]:
        return [0] * n
    if blocks.shape[0] <= _FEW_ROWS:
        per: dict[int, int] = {}
        for r, c in zip(blocks["rank"].tolist(), blocks["count"].tolist(), strict=True):
            per[r] = per.get(r, 0) + c
        return [per.get(r, 0) for r in rr["rank"].tolist()]
    order = np.argsort(rr["rank"], kind="stable")
    pos = order[np.searchsorted(rr["rank"][order], blocks["rank"])]
    return np.bincount(pos, weights=blocks["count"], minlength=n).astype(np.int64).tolist()


def _op_counts(blocks: np.ndarray, cnt: np.ndarray) -> dict[tuple[int, int], int]:
    """Op records per (group entry, kind) of block rows: plain Python for the few rows of one
    node's body (cheaper than a dozen numpy calls), the distinct sorted keys for many."""
    if blocks.shape[0] <= _FEW_ROWS:
        out: dict[tuple[int, int], int] = {}
        for key in zip(blocks["group"].tolist(), blocks["kind"].tolist(), cnt.tolist(), strict=True):
            out[key[:2]] = out.get(key[:2], 0) + key[2]
        return out
    key = blocks["group"].astype(np.int64) * 256 + blocks["kind"]
    order = np.argsort(key, kind="stable")
    key = key[order]
    first = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    sums = np.add.reduceat(cnt[order], first).tolist()
    return {divmod(k, 256): n for k, n in zip(key[first].tolist(), sums, strict=True)}


def _only_ranks(bb: BlockBatch, keep: np.ndarray) -> BlockBatch:
    """The rows of a block batch about ``keep`` ranks only."""

    def sel(rows: np.ndarray) -> np.ndarray:
        return rows[np.isin(rows["rank"], keep)]

    return BlockBatch(
        groups=bb.groups,
        ranks=sel(bb.ranks),
        progress=sel(bb.progress),
        p2p=sel(bb.p2p),
        blocks=sel(bb.blocks),
        nodes={r: n for r, n in bb.nodes.items() if r in set(keep.tolist())},
        notes={r: n for r, n in bb.notes.items() if r in set(keep.tolist())},
        group_rank={k: v for k, v in bb.group_rank.items() if k[0] in set(keep.tolist())},
    )


def any_dirty(summaries: GroupSummaries) -> bool:
    return any(w.dirty for w in summaries.windows.values())


@dataclass(slots=True)
class JobChanges:
    """What one persist pass writes about a job, and what to mark unwritten if it fails."""

    job: dict[str, Any]
    ranks: list[dict[str, Any]]
    groups: list[dict[str, Any]]
    groups_with_members: list[dict[str, Any]]
    queued: Any
    rank_keys: set[int]
    group_keys: set[str]
    member_keys: set[str]
    summaries: list[dict[str, Any]] = field(default_factory=list)
    window_keys: list[tuple[str, float]] = field(default_factory=list)
