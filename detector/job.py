"""``JobDetector``: one job's batches in, the suspects active now out.

The collector calls ``observe`` (a raw ``wire.Batch``) or ``observe_blocks`` (a ``BlockBatch`` of
block summaries) for every batch as it arrives, and ``evaluate`` whenever it wants the current
suspects. Time only comes in as arguments: the same code runs live, in the simulator and in the
benchmarks. All state is per slot, per channel or per rank, and pending blocks are bounded by the
cell timeout, so memory is bounded by the job's size.

A suspect's ``key`` names what it is about (kind, level, rank/node/link); it is reported while its
evidence holds and for ``release_s`` after, so one fault is one suspect even when its evidence
flickers. After a service restart nothing is known: ``ready`` turns true once ``ready_after_s``
of fresh data have been analysed, and until then the collector keeps its old suspects.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from rankwatch.detector.barriers import BarrierTracker
from rankwatch.detector.cells import PENDING_DTYPE, CellTable, cell_key, cell_stats, key_block
from rankwatch.detector.config import DetectorConfig
from rankwatch.detector.finding import Finding
from rankwatch.detector.hangs import HangReport, ProgressTracker, StuckGroup
from rankwatch.detector.lateness import RECENT_BUCKETS, LatenessTracker, Straggler, as_late
from rankwatch.detector.liveness import Liveness
from rankwatch.detector.localise import Culprit, localise
from rankwatch.detector.topology import Topology
from rankwatch.detector.transfer import TransferTracker
from rankwatch.sim.blocks import BLOCK_DTYPE, BLOCK_SEQS, BlockBatch, from_batch, summarise, summarise_rows
from rankwatch.wire import Batch, OpKind, Records

__all__ = ["JobDetector"]

_SEND, _RECV = int(OpKind.SEND), int(OpKind.RECV)
_RECORD_FIELDS = ("group", "kind", "dtype", "peer", "seq", "nbytes", "t_enter", "t_start", "t_end")


def _score(w: float, threshold: float) -> float:
    """A straggler's confidence: 0.5 at its threshold, towards 0.99 as its cost ``w`` grows past it."""
    return float(min(0.99, 0.5 + 0.5 * (1.0 - np.exp(-(w / max(threshold, 1e-9) - 1.0)))))


def _max_per(idx: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each distinct index and the largest of its values (nan if any is nan, as ``np.maximum``)."""
    o = np.lexsort((v, idx))
    i = idx[o]
    last = np.ones(i.shape[0], bool)
    last[:-1] = i[1:] != i[:-1]
    return i[last], v[o][last]


@dataclass(slots=True)
class _Arrived:
    """When each row of several concatenated batches arrived, and what survives their merging."""

    ranks: np.ndarray  # per rank row
    blocks: np.ndarray  # per block row
    notes: list[tuple[dict[int, dict[str, Any]], float]]  # each batch's notes, in order
    p2p_keep: np.ndarray  # p2p rows of each rank's last batch (what it has in flight now)


Arrived = float | _Arrived


@dataclass(slots=True)
class _Held:
    """A batch taken but not folded yet; a raw one keeps its records, summarised when folded."""

    batch: BlockBatch
    at: float
    chans: np.ndarray
    records: Records | None = None
    block_seqs: np.ndarray | None = None
    rows: int = 0  # table rows and raw records: what folding it costs

    def summarise(self) -> BlockBatch:
        if self.records is not None and len(self.records):
            self.batch.blocks = summarise(self.records, int(self.batch.ranks["rank"][0]), self.block_seqs)  # type: ignore[arg-type]
        return self.batch


def _raw_blocks(q: list[_Held], goff: np.ndarray, n_groups: int) -> tuple[np.ndarray, np.ndarray]:
    """Block rows of the held raw batches, summarised together, and the batch of each row."""
    raw = [i for i, h in enumerate(q) if h.records is not None and len(h.records)]
    if not raw:
        return np.zeros(0, BLOCK_DTYPE), np.zeros(0, np.int64)
    recs = [q[i].records for i in raw]
    sizes = [len(r) for r in recs]  # type: ignore[arg-type]
    batch = np.repeat(np.array(raw, np.int64), sizes)
    cols = {f: np.concatenate([getattr(r, f) for r in recs]) for f in _RECORD_FIELDS}
    cols["group"] = cols["group"].astype(np.int64) + goff[batch]  # distinct per batch: never merged
    bs = np.ones(n_groups, np.int64)
    for i in raw:
        b = q[i].block_seqs
        if b is not None:
            bs[goff[i] : goff[i] + b.shape[0]] = b
    ranks = np.array([int(q[i].batch.ranks["rank"][0]) for i in raw], np.int64)
    rows, first = summarise_rows(Records(**cols), np.repeat(ranks, sizes), bs)
    return rows, batch[first]


def _concat(q: list[_Held]) -> tuple[BlockBatch, _Arrived, np.ndarray]:
    """Several batches as one: tables concatenated, group indices into the joined group list."""
    bbs = [h.batch for h in q]
    at = np.array([h.at for h in q], np.float64)
    goff = np.cumsum([0] + [len(b.groups) for b in bbs[:-1]])
    tables = {}
    which = {}
    for name in ("ranks", "progress", "p2p", "blocks"):
        parts = [getattr(b, name) for b in bbs]
        sizes = [p.shape[0] for p in parts]
        rows = np.empty(sum(sizes), parts[0].dtype)  # np.concatenate of records re-derives their dtype: slow
        end = 0
        for p, n in zip(parts, sizes, strict=True):
            if n:
                rows[end : end + n] = p
                end += n
        idx = np.repeat(np.arange(len(bbs)), sizes)
        if name != "ranks" and rows.shape[0]:
            rows["group"] += goff[idx].astype(rows["group"].dtype)
        tables[name], which[name] = rows, idx
    raw, raw_batch = _raw_blocks(q, goff, int(goff[-1]) + len(bbs[-1].groups))
    if raw.shape[0]:
        tables["blocks"] = np.concatenate([tables["blocks"], raw]) if tables["blocks"].shape[0] else raw
        which["blocks"] = np.concatenate([which["blocks"], raw_batch])
    # a rank's point-to-point ops in flight are those its last batch lists
    rk = tables["ranks"]["rank"].astype(np.int64)
    keep = np.ones(tables["p2p"].shape[0], bool)
    if keep.shape[0]:
        ranks, last = _max_per(rk, which["ranks"])
        pr = tables["p2p"]["rank"].astype(np.int64)
        keep = last[np.searchsorted(ranks, pr)] == which["p2p"]
    nodes: dict[int, str] = {}
    for b in bbs:
        nodes.update(b.nodes)
    merged = BlockBatch(
        groups=[g for b in bbs for g in b.groups],
        ranks=tables["ranks"],
        progress=tables["progress"],
        p2p=tables["p2p"],
        blocks=tables["blocks"],
        nodes=nodes,
    )
    arrived = _Arrived(
        ranks=at[which["ranks"]],
        blocks=at[which["blocks"]],
        notes=[(h.batch.notes, h.at) for h in q if h.batch.notes],
        p2p_keep=keep,
    )
    return merged, arrived, np.concatenate([h.chans for h in q]).astype(np.int64)


@dataclass(slots=True)
class _Track:
    finding: Finding
    last_true: float


class JobDetector:
    """The detector for one job."""

    def __init__(self, config: DetectorConfig | None = None) -> None:
        self.cfg = config or DetectorConfig()
        self.topo = Topology()
        self.cells = CellTable()
        self.late = LatenessTracker(self.cfg)
        self.xfer = TransferTracker(self.cfg)
        self.barriers = BarrierTracker(self.cfg)
        self.prog = ProgressTracker(self.cfg)
        self.live = Liveness(self.cfg)
        self._started = float("nan")
        self._last_eval = float("nan")
        self._last_full = float("nan")
        self._slow_cands: dict[str, Finding] = {}
        self._restart = -1
        self._tracks: dict[str, _Track] = {}
        self._rank_hot: dict[int, float] = {}
        self._rank_held: dict[int, float] = {}  # ...and since when, counting brief drops out (the mild hold)
        self._rank_out: dict[int, float] = {}  # since when a root in ``_rank_held`` has dropped out
        self._hot_out: dict[int, float] = {}  # ...and one in ``_rank_hot`` (bridged one analysis)
        self._carried: set[int] = set()  # roots in ``_rank_held`` kept between bursts (``Straggler.between``)
        # per node: the analyses at which ``node_share`` of its ranks were roots at once (the newest
        # within ``mild_hold_s``)
        self._node_together: dict[int, list[float]] = {}
        # per rank: when it last held a straggler's hold (``confirmed``), named or not
        self._confirmed_at: dict[int, float] = {}
        self._ch_slow: dict[int, float] = {}
        self.batches = 0
        self.rows = 0
        self.roots: dict[int, Straggler] = {}
        """The ranks the last analysis of slowness left late after its victim tests (read-only: for
        diagnostics such as ``bench/latency_parts.py``)."""
        self._rank_blocks = False  # blocks cut by the ranks (block mode) have come in
        # batches taken but not yet folded in: folded together at the next evaluate, as one
        # batch's worth of array work (a node's body has a few dozen rows; the calls cost more)
        self._queue: list[_Held] = []
        self._queue_rows = 0
        self._queue_restart = -1
        # an agent's batches list the same groups every time: their channels, by the list of ids
        self._chan_memo: dict[tuple[object, ...], np.ndarray] = {}

    # -- input -------------------------------------------------------------------------------------
    def observe(self, batch: Batch, received_at: float) -> None:
        """Take one rank's raw batch (its records are summarised into blocks here).

        Args:
            batch: a decoded ``wire.Batch``.
            received_at: server wall-clock seconds when it arrived.
        """
        h = batch.header
        rank, world = int(h["rank"]), int(h["world"])
        self._see_world(world)
        chans = self.topo.register_groups(list(h.get("groups", [])), rank)
        sizes = self._block_sizes(chans, batch, float(h.get("flush_s") or 1.0))
        bb = from_batch(h, batch.records, sizes, blocks=False)  # summarised when folded, with the others
        self._enqueue(_Held(bb, received_at, chans, batch.records, sizes))

    def observe_blocks(self, batch: BlockBatch, received_at: float) -> None:
        """Take block summaries of one or more ranks (large jobs, per-node agents).

        Args:
            batch: the ranks' liveness, progress and block summaries.
            received_at: server wall-clock seconds when it arrived.
        """
        self._rank_blocks = True
        if batch.ranks.shape[0]:
            self._see_world(int(batch.ranks["world"].max()))
        ids = tuple([e.get("id") for e in batch.groups])
        memo = self._chan_memo.get(ids)
        if memo is not None:  # every one known (ids never change their channel)
            self._enqueue(_Held(batch, received_at, memo))
            return
        get = self.topo.channel_id.get
        got = [get(i, -1) for i in ids]  # type: ignore[arg-type]
        chans = np.fromiter(got, np.int64, len(got))
        unknown = [i for i, c in enumerate(got) if c < 0]
        if not unknown:
            if len(self._chan_memo) >= 4096:
                self._chan_memo.clear()
            self._chan_memo[ids] = chans
        reporters: dict[int, list[int]] = {i: [] for i in unknown}
        if unknown:
            for r, gi in batch.group_rank:
                if gi in reporters:
                    reporters[gi].append(r)
        for i in unknown:
            e = batch.groups[i]
            gid = e.get("id")
            ch = -1
            if isinstance(gid, str):
                if "ranks" in e or not reporters[i]:
                    reporter = reporters[i][0] if reporters[i] else 0
                    ch = int(self.topo.register_groups([e], reporter)[0])
                else:  # membership learnt from where each reporter sits (several in an agent's body)
                    for reporter in reporters[i]:
                        e2 = dict(e, group_rank=batch.group_rank[(reporter, i)])
                        ch = int(self.topo.register_groups([e2], reporter)[0])
                        if ch >= 0:
                            break
            chans[i] = ch
        self._enqueue(_Held(batch, received_at, chans))

    def _enqueue(self, held: _Held) -> None:
        """Hold a batch for the next fold; a new incarnation of the job first folds what came before.
        A large batch (an aggregator's) is folded at once: joining it to others would only copy it."""
        bb = held.batch
        self.batches += 1
        if np.isnan(self._started):
            self._started = held.at
        if bb.ranks.shape[0]:
            restart = int(bb.ranks["restart"].max())
            if restart > self._queue_restart:
                self._drain()
                self._queue_restart = restart
        n_raw = 0 if held.records is None else len(held.records)
        held.rows = bb.ranks.shape[0] + bb.progress.shape[0] + bb.blocks.shape[0] + n_raw
        if held.rows >= self.cfg.fold_rows // 8:
            self._drain()
            self._fold([held])
            return
        self._queue.append(held)
        self._queue_rows += held.rows
        if self._queue_rows >= self.cfg.fold_rows:
            self._drain()

    @property
    def held_rows(self) -> int:
        """Rows of the batches held for the next fold."""
        return self._queue_rows

    def fold(self, max_rows: int) -> bool:
        """Fold the oldest held batches, about ``max_rows`` rows of them (at least one batch), so a
        caller holding a lock that ingest also takes can fold a large backlog in short turns.

        Returns:
            Whether batches are still held.
        """
        q, n, rows = self._queue, 0, 0
        while n < len(q) and (n == 0 or rows + q[n].rows <= max_rows):
            rows += q[n].rows
            n += 1
        self._queue, self._queue_rows = q[n:], self._queue_rows - rows
        self._fold(q[:n])
        return bool(self._queue)

    def _drain(self) -> None:
        """Fold every held batch."""
        q, self._queue, self._queue_rows = self._queue, [], 0
        self._fold(q)

    def _fold(self, q: list[_Held]) -> None:
        """Fold batches (no longer held) into the job's state, in one go."""
        if len(q) == 1:
            self._ingest(q[0].summarise(), q[0].at, q[0].chans)
        elif q:
            self._ingest(*_concat(q))

    def _see_world(self, world: int) -> None:
        if world > self.topo.world:
            self.topo.ensure_world(world)
            self.live.ensure(world)

    def _block_sizes(self, chans: np.ndarray, batch: Batch, flush_s: float) -> np.ndarray:
        """Block size per header group: fixed per group at first sight, from its op rate."""
        topo = self.topo
        out = np.ones(chans.shape[0], np.int64)
        rec = batch.records
        for i, ch in enumerate(chans.tolist()):
            if ch < 0:
                continue
            b = int(topo.ch_block[ch])
            if b == 0:
                if not len(rec):
                    continue
                n = int(np.count_nonzero((rec.group == i) & (rec.kind != _SEND) & (rec.kind != _RECV)))
                if not n:
                    continue
                want = n / max(flush_s, 1e-3) * self.cfg.raw_block_s
                b = int(min(BLOCK_SEQS, 2 ** max(0, int(np.floor(np.log2(max(want, 1.0)))))))
                topo.set_block(np.array([ch]), np.array([b]))
            out[i] = b
        return out

    def _ingest(self, bb: BlockBatch, arrived: Arrived, chans: np.ndarray) -> None:
        """Fold one batch, or several concatenated (``arrived`` an ``_Arrived``: ranks may repeat)."""
        topo, live = self.topo, self.live
        rows = bb.ranks
        if rows.shape[0]:
            restart = int(rows["restart"].max())
            if restart > self._restart:
                if self._restart >= 0:
                    self._reset_analysis()
                self._restart = restart
        for r, name in bb.nodes.items():
            if name and 0 <= r < topo.world:
                topo.set_node(r, name)
        if isinstance(arrived, _Arrived):
            live.update_many(rows, arrived.ranks, arrived.notes)
            blocks_at: float | np.ndarray = arrived.blocks
            p2p_keep: np.ndarray | None = arrived.p2p_keep
        else:
            live.update(rows, arrived, bb.notes)
            blocks_at, p2p_keep = arrived, None
        offset = live.offset
        self._ingest_progress(bb, chans, offset, p2p_keep)
        self._ingest_blocks(bb, chans, offset, blocks_at)

    def _slots(self, bb: BlockBatch, chans: np.ndarray, ranks: np.ndarray, gi: np.ndarray) -> np.ndarray:
        """Slot of each (rank, batch group index) pair; -1 where unknown."""
        ok = (gi >= 0) & (gi < chans.shape[0])
        ch = (
            np.where(ok, chans[np.clip(gi, 0, max(0, chans.shape[0] - 1))], -1)
            if chans.shape[0]
            else np.full(gi.shape, -1)
        )
        return self.topo.slot_of(ch.astype(np.int64), ranks.astype(np.int64))

    def _ingest_progress(
        self, bb: BlockBatch, chans: np.ndarray, offset: np.ndarray, p2p_keep: np.ndarray | None = None
    ) -> None:
        topo, prog = self.topo, self.prog
        pr = bb.progress
        if pr.shape[0]:
            ranks = pr["rank"].astype(np.int64)
            slots = self._slots(bb, chans, ranks, pr["group"].astype(np.int64))
            ok = slots >= 0
            if p2p_keep is not None:  # several batches: a slot's last row is what it says now
                last = np.zeros(slots.shape[0], bool)
                last[_max_per(slots, np.arange(slots.shape[0]))[1]] = True
                ok &= last
            prog.ensure(topo.n_slots, topo.n_channels)
            s, p = slots[ok], pr[ok]
            prog.entered[s] = np.maximum(prog.entered[s], p["entered"])
            prog.completed[s] = p["completed"]
            since = np.where(p["inflight_since_ns"] >= 0, p["inflight_since_ns"] * 1e-9 + offset[ranks[ok]], np.nan)
            prog.since[s] = since
        # point-to-point ops in flight: clear what these ranks had, then set what they say now
        prog.ensure(topo.n_slots, topo.n_channels)
        mine = topo.slots_of_ranks(bb.ranks["rank"])
        prog.since[mine[topo.ch_parent[topo.slot_ch[mine]] >= 0]] = np.nan
        pp = bb.p2p
        if p2p_keep is not None:  # several batches: what each rank's last one had in flight
            pp = pp[p2p_keep]
        if pp.shape[0]:
            slots = self._p2p_slots(bb, chans, pp["rank"], pp["group"], pp["kind"], pp["peer"])
            ok = slots >= 0
            prog.ensure(topo.n_slots, topo.n_channels)
            s, p = slots[ok], pp[ok]
            prog.since[s] = p["since_ns"] * 1e-9 + offset[p["rank"].astype(np.int64)]
            prog.entered[s] = np.maximum(prog.entered[s], p["seq"])

    def _p2p_slots(
        self, bb: BlockBatch, chans: np.ndarray, rank: np.ndarray, gi: np.ndarray, kind: np.ndarray, peer: np.ndarray
    ) -> np.ndarray:
        """Slot of point-to-point rows in their (group, sender, receiver) channel."""
        topo = self.topo
        rank = rank.astype(np.int64)
        gi = gi.astype(np.int64)
        parent_slot = self._slots(bb, chans, rank, gi)
        ok = parent_slot >= 0
        out = np.full(rank.shape[0], -1, np.int64)
        if not ok.any():
            return out
        parent = topo.slot_ch[parent_slot[ok]]
        me = parent_slot[ok] - topo.ch_off[parent]
        pe = peer[ok].astype(np.int64)
        send = kind[ok] == _SEND
        valid = (pe >= 0) & (pe < topo.ch_size[parent])
        src = np.where(send, me, pe)
        dst = np.where(send, pe, me)
        ch = np.full(parent.shape[0], -1, np.int64)
        if valid.any():
            ch[valid] = topo.p2p_channels(parent[valid], src[valid], dst[valid])
        slot = np.where(ch >= 0, topo.ch_off[np.maximum(ch, 0)] + np.where(send, 0, 1), -1)
        out[np.flatnonzero(ok)] = slot
        return out

    def _ingest_blocks(
        self, bb: BlockBatch, chans: np.ndarray, offset: np.ndarray, received_at: float | np.ndarray
    ) -> None:
        topo, prog = self.topo, self.prog
        b = bb.blocks
        if not b.shape[0]:
            return
        kind = b["kind"]
        p2p = (kind == _SEND) | (kind == _RECV)
        slots = np.full(b.shape[0], -1, np.int64)
        if (~p2p).any():
            idx = np.flatnonzero(~p2p)
            slots[idx] = self._slots(bb, chans, b["rank"][idx].astype(np.int64), b["group"][idx].astype(np.int64))
        if p2p.any():
            idx = np.flatnonzero(p2p)
            slots[idx] = self._p2p_slots(bb, chans, b["rank"][idx], b["group"][idx], kind[idx], b["peer"][idx])
        arrived = received_at if isinstance(received_at, np.ndarray) else None
        ok = slots >= 0
        if not ok.all():
            b, slots, p2p = b[ok], slots[ok], p2p[ok]
            kind = b["kind"]
            arrived = None if arrived is None else arrived[ok]
        if not b.shape[0]:
            return
        prog.ensure(topo.n_slots, topo.n_channels)
        ch = topo.slot_ch[slots]
        bs = b["block_seqs"].astype(np.int64)
        cur = topo.ch_block[ch]
        unset = cur == 0
        if unset.any():
            first_ch, first = np.unique(ch[unset], return_index=True)  # the first row's size stands
            topo.set_block(first_ch, bs[unset][first])
            cur = topo.ch_block[ch]
        same = cur == bs
        if not same.all():  # members disagree on the block size: the group's first word stands
            b, slots, p2p, ch = b[same], slots[same], p2p[same], ch[same]
            kind = b["kind"]
            arrived = None if arrived is None else arrived[same]
        seq_hi = b["seq_hi"]
        np.maximum.at(prog.wm, slots, seq_hi)
        if p2p.any():
            np.maximum.at(prog.entered, slots[p2p], seq_hi[p2p])
            np.maximum.at(prog.completed, slots[p2p], seq_hi[p2p])
        ranks = b["rank"].astype(np.int64)
        off = offset[ranks]
        t_last = b["last_enter_ns"] * 1e-9 + off
        np.maximum.at(prog.last_progress, ch, t_last)
        nbits = np.zeros(b.shape[0], np.int64)
        nz = b["nbytes"] > 0
        nbits[nz] = np.floor(np.log2(b["nbytes"][nz].astype(np.float64))).astype(np.int64) + 1
        cls_kind = np.where(p2p, _SEND, kind.astype(np.int64))
        rows = np.zeros(b.shape[0], PENDING_DTYPE)
        rows["key"] = cell_key(ch, (cls_kind << 6) | np.minimum(nbits, 63), b["block"])
        rows["slot"] = slots
        rows["cnt"] = b["count"]
        rows["sum"] = b["sum_ns"] * 1e-9
        rows["mn"] = b["min_ns"] * 1e-9
        rows["mx"] = b["max_ns"] * 1e-9
        rows["t_first"] = b["first_enter_ns"] * 1e-9 + off
        rows["t_last"] = t_last
        rows["arrived"] = received_at if arrived is None else arrived
        self.cells.add(rows)
        self.rows += rows.shape[0]

    def _reset_analysis(self) -> None:
        """A new incarnation of the job: sequence numbers start again."""
        self.cells.clear()
        self.late.reset()
        self.xfer.reset()
        self.barriers.reset()
        self.prog.reset()
        self._rank_hot.clear()
        self._rank_held.clear()
        self._rank_out.clear()
        self._hot_out.clear()
        self._carried.clear()
        self._node_together.clear()
        self._confirmed_at.clear()
        self._ch_slow.clear()

    # -- output ------------------------------------------------------------------------------------
    def ready(self, now: float) -> bool:
        """Whether enough fresh data has been analysed for the verdicts to be final."""
        self._drain()
        return not np.isnan(self._started) and now - self._started >= self.cfg.ready_after_s

    def evaluate(self, now: float) -> list[Finding]:
        """The suspects active at server time ``now``.

        Blocks that arrived are analysed at every call. The per-slot analysis of slowness, whose
        cost grows with the job, runs at most every ``n_slots / analysis_slots_per_s`` seconds
        (every call up to about 40,000 ranks); hangs and deaths are checked at every call.
        """
        self._drain()
        cfg, topo = self.cfg, self.topo
        self._last_eval = now
        n_slots, n_ch = topo.n_slots, topo.n_channels
        self.prog.ensure(n_slots, n_ch)
        cands: dict[str, Finding] = {}
        if not n_ch:
            self._dead_findings(now, cands)
            return self._lifecycle(now, cands)
        wm_min = np.minimum.reduceat(self.prog.wm[:n_slots], topo.ch_off)
        ready = self.cells.take(now, topo.ch_size, topo.ch_block, wm_min, cfg.cell_timeout_s)
        st = cell_stats(ready)
        blk = key_block(ready["key"])
        row_ch = topo.slot_ch[st.slot]
        self.late.update(
            now,
            st,
            blk * topo.ch_block[row_ch] + 1,
            n_slots,
            n_ch,
            row_ch,
            topo.ch_parent[row_ch] >= 0,
            spread=self._rank_blocks,
        )
        first_row = np.flatnonzero(np.r_[True, np.diff(ready["key"]) != 0]) if len(st) else np.zeros(0, np.int64)
        self.prog.observe_cells(now, st, (blk[first_row] + 1) * topo.ch_block[st.c_ch])
        self.barriers.update(st, topo, blk[first_row])
        # transfers first: channels slow now (or reported slow) freeze lateness baselines, and
        # ranks on them are not stragglers (their lateness is the slow transfer's)
        frozen = np.zeros(n_ch, bool)
        frozen[topo.slot_ch[np.flatnonzero(self.late.hot[:n_slots])]] = True
        frozen[list(self._ch_slow)] = True
        self.xfer.update(now, st, frozen)
        silent = self.live.silent(now, cfg.silent_flushes)
        dead = self.live.dead(now)
        ended = self.live.state[: topo.world] != 0
        hangs = self.prog.analyse(now, topo, silent, dead, ended)
        self._dead_findings(now, cands)
        self._hang_findings(now, hangs, cands)
        period = min(cfg.max_analysis_period_s, max(0.0, n_slots / cfg.analysis_slots_per_s))
        if np.isnan(self._last_full) or now - self._last_full >= period - 1e-9:
            dt = 0.0 if np.isnan(self._last_full) else now - self._last_full
            self._last_full = now
            slow, healthy = self.xfer.status(n_ch)
            comm_frozen = slow.copy()
            comm_frozen[list(self._ch_slow)] = True
            ch_excess = np.clip(np.nan_to_num(self.xfer.ex_held[:n_ch], nan=0.0), 0.0, None)
            if ch_excess.shape[0] < n_ch:
                ch_excess = np.r_[ch_excess, np.zeros(n_ch - ch_excess.shape[0])]
            roots = self.late.analyse(now, dt, topo, self._reported_ranks("noncomm_slow"), comm_frozen, ch_excess)
            self.roots = roots
            slow_cands: dict[str, Finding] = {}
            if not hangs.stuck:
                self._straggler_findings(now, dt, roots, silent[: topo.world] | ended, slow_cands)
                self._barrier_findings(now, silent[: topo.world] | ended, slow_cands)
                self._comm_findings(now, slow, healthy, slow_cands)
            self._slow_cands = slow_cands
        elif hangs.stuck:
            self._slow_cands = {}
        cands.update(self._slow_cands)
        return self._lifecycle(now, cands)

    def _reported_ranks(self, kind: str) -> set[int]:
        out: set[int] = set()
        for tr in self._tracks.values():
            if tr.finding.kind == kind:
                out.update(tr.finding.ranks)
        return out

    def _lifecycle(self, now: float, cands: dict[str, Finding]) -> list[Finding]:
        for key, f in cands.items():
            tr = self._tracks.get(key)
            if tr is None:
                f.detected_at = now
                self._tracks[key] = _Track(f, now)
            else:
                f.detected_at = tr.finding.detected_at
                f.first_seen = min(f.first_seen, tr.finding.first_seen)
                tr.finding, tr.last_true = f, now
        out = []
        for key in list(self._tracks):
            tr = self._tracks[key]
            if now - tr.last_true > self.cfg.release_s:
                del self._tracks[key]
            else:
                out.append(tr.finding)
        out.sort(key=lambda f: (f.detected_at, f.key))
        return out

    # -- findings per kind -------------------------------------------------------------------------
    def _node_groups(self, ranks: list[int], share: float | None = None) -> tuple[dict[int, list[int]], list[int]]:
        """Split ranks into nodes where they are at least ``share`` (``node_share``) of the node, and the rest."""
        topo = self.topo
        share = self.cfg.node_share if share is None else share
        per_node: dict[int, list[int]] = {}
        for r in ranks:
            per_node.setdefault(int(topo.node_of[r]), []).append(r)
        on_node = topo.node_ranks()
        nodes: dict[int, list[int]] = {}
        singles: list[int] = []
        for n, rs in per_node.items():
            total = len(on_node.get(n, []))
            if n >= 0 and len(rs) >= 2 and len(rs) >= share * total:
                nodes[n] = sorted(rs)
            else:
                singles.extend(rs)
        return nodes, sorted(singles)

    def _base(
        self, kind: str, level: str, ranks: list[int], nodes: list[int], link: tuple[int, int] | None
    ) -> dict[str, Any]:
        topo = self.topo
        names = [topo.node_names[n] for n in nodes if 0 <= n < len(topo.node_names)]
        link_names = None
        if link is not None:
            a, b = sorted((topo.node_names[link[0]], topo.node_names[link[1]]))
            link_names = (a, b)
        if level == "rank":
            ident = "+".join(str(r) for r in ranks)
        elif level == "node":
            ident = "+".join(sorted(names))
        else:
            ident = "|".join(link_names or ())
        return {
            "key": f"{kind}:{level}:{ident}",
            "kind": kind,
            "level": level,
            "ranks": list(ranks),
            "nodes": sorted(names),
            "link": link_names,
        }

    def _dead_findings(self, now: float, cands: dict[str, Finding]) -> None:
        live = self.live
        suspects, wave = live.first_casualties(now)
        if not suspects:
            return
        by_rank = {c.rank: c for c in suspects}
        nodes, singles = self._node_groups(sorted(by_rank))
        # ranks of one node go silent within a send period of each other: while more of a node is
        # silent than is dead yet, wait for them rather than name its ranks one by one
        silent = self.live.silent(now, self.cfg.silent_flushes)
        if singles and silent.any():
            pending, _ = self._node_groups(sorted(set(np.flatnonzero(silent).tolist()) | set(singles)))
            singles = [r for r in singles if int(self.topo.node_of[r]) not in pending]
        wave_info = {
            "casualties": len(wave),
            "first": [{"rank": c.rank, "how": c.how, "at": c.at} for c in wave[:8]],
        }
        groups: list[tuple[str, list[int], list[int]]] = [("node", rs, [n]) for n, rs in nodes.items()]
        groups += [("rank", [r], [int(self.topo.node_of[r])]) for r in singles]
        for level, rs, ns in groups:
            c0 = min((by_rank[r] for r in rs), key=lambda c: c.at)
            ev: dict[str, Any] = {
                "how": {str(r): by_rank[r].how for r in rs},
                "last_seen": {str(r): float(live.last_seen[r]) for r in rs},
                "wave": wave_info,
            }
            for r in rs:
                note = live.notes.get(r, {})
                if note.get("end_reason"):
                    ev.setdefault("end_reason", {})[str(r)] = note["end_reason"]
                if note.get("stack"):
                    ev.setdefault("stack", {})[str(r)] = note["stack"]
            base = self._base("rank_dead", level, rs, ns, None)
            cands[base["key"]] = Finding(
                **base,
                score=0.95,
                slowdown=None,
                first_seen=c0.at,
                detected_at=now,
                evidence=ev,
                flight_recorder_ranks=[],
            )

    def _stuck_ev(self, g: StuckGroup) -> dict[str, Any]:
        topo = self.topo
        return {
            "group": topo.ch_name[g.ch],
            "desc": topo.ch_desc[g.ch],
            "seq": g.seq,
            "stuck_since": g.since,
            "threshold_s": round(g.threshold, 3),
            "waiting": g.waiting[:64],
            "never_entered": g.missing[:64],
        }

    def _fr_ranks(self, groups: list[StuckGroup]) -> list[int]:
        topo = self.topo
        out: set[int] = set()
        for g in groups:
            ch = g.ch
            parent = int(topo.ch_parent[ch])
            src = topo.ch_members[parent if parent >= 0 else ch]
            out.update(int(r) for r in src.tolist())
        return sorted(out)[: self.cfg.max_flight_recorder_ranks]

    def _hang_findings(self, now: float, rep: HangReport, cands: dict[str, Finding]) -> None:
        topo, live = self.topo, self.live
        if rep.noncomm_roots:
            # two or more ranks of one host that stopped at once are the host's doing, however few
            # of its ranks show it: a node that hangs while it saves a checkpoint has some of its
            # ranks already waiting in the save's barrier, and only the rest never arrive
            nodes, singles = self._node_groups(sorted(rep.noncomm_roots), share=0.0)
            groups: list[tuple[str, list[int], list[int]]] = [("node", rs, [n]) for n, rs in nodes.items()]
            groups += [("rank", [r], [int(topo.node_of[r])]) for r in singles]
            for level, rs, ns in groups:
                stuck = [g for r in rs for g in rep.noncomm_roots[r]]
                ev: dict[str, Any] = {"stuck_groups": [self._stuck_ev(g) for g in stuck[:16]]}
                stacks = {str(r): live.notes.get(r, {}).get("stack") for r in rs if live.notes.get(r, {}).get("stack")}
                if stacks:
                    ev["stack"] = stacks
                if level == "rank":
                    ev.update(self._node_alike(rs[0], stuck))
                base = self._base("noncomm_hang", level, rs, ns, None)
                cands[base["key"]] = Finding(
                    **base,
                    score=0.9,
                    slowdown=None,
                    first_seen=min(g.since for g in stuck),
                    detected_at=now,
                    evidence=ev,
                    flight_recorder_ranks=self._fr_ranks(stuck),
                )
        if rep.comm_roots:
            roots = [g.ch for g in rep.comm_roots]
            onset = min(g.since for g in rep.comm_roots)
            lp = self.prog.last_progress[: topo.n_channels]
            stuck_ch = {g.ch for g in rep.stuck}
            progressed = [int(c) for c in np.flatnonzero(lp > onset + 1.0).tolist() if c not in stuck_ch]
            for cul in localise(topo, roots, self._near(roots, progressed)):
                gs = [g for g in rep.comm_roots if g.ch in set(cul.channels)]
                ev = {"stuck_groups": [self._stuck_ev(g) for g in gs[:16]], **self._culprit_ev(cul, hang=True)}
                member = next((r for g in gs for r in g.waiting if live.notes.get(r, {}).get("stack")), None)
                if member is not None:
                    ev["stack"] = {str(member): live.notes[member]["stack"]}
                base = self._base("comm_hang", cul.level, cul.ranks, cul.nodes, cul.link)
                cands[base["key"]] = Finding(
                    **base,
                    score=0.5 if cul.ambiguous else 0.85,
                    slowdown=None,
                    first_seen=min(g.since for g in gs),
                    detected_at=now,
                    evidence=ev,
                    flight_recorder_ranks=self._fr_ranks(gs),
                )

    def _node_alike(self, rank: int, stuck: list[StuckGroup]) -> dict[str, Any]:
        """Evidence that a hang of the rank's whole node would look the same, if it would.

        When every other rank of the node waits on this one inside one stuck op (tp8 on nodes of
        8: the node is one tensor-parallel group), a hang of the node itself (its GPUs, driver or
        host) that caught those ranks inside the op and this one outside it leaves the same
        timings: nothing tells the two apart (docs/detector.md, *Limits*). Said, so on-call
        checks the node too.
        """
        topo = self.topo
        n = int(topo.node_of[rank])
        if n < 0:
            return {}
        mates = set(np.flatnonzero(topo.node_of[: topo.world] == n).tolist()) - {rank}
        if not mates:
            return {}
        for g in stuck:
            if mates <= set(g.waiting):
                node = topo.node_names[n]
                desc = topo.ch_desc[g.ch]
                group = f"group {topo.ch_name[g.ch]}" + (f" ({desc})" if desc else "")
                return {
                    "node_alike": True,
                    "next_step": (
                        f"every other rank of {node} waits on rank {rank} inside {group}: a hang of "
                        f"{node} itself (GPU, driver, host) that caught them inside the op looks the same; "
                        f"if rank {rank}'s stack is inside torch or CUDA rather than the job's own code, check {node} "
                        "(nvidia-smi, dmesg)"
                    ),
                }
        return {}

    def _near(self, faulty: list[int], channels: list[int]) -> list[int]:
        """The channels among ``channels`` that share a node with a faulty one (the rest cannot clear anything)."""
        topo = self.topo
        if not channels:
            return []
        nodes = set()
        for ch in faulty:
            nodes.update(topo.node_of[topo.ch_members[ch]].tolist())
        node_mask = np.zeros(max(len(topo.node_names), 1), bool)
        node_mask[[n for n in nodes if n >= 0]] = True
        cand = np.asarray(channels, dtype=np.int64)
        slot_hit = node_mask[np.maximum(topo.node_of[topo.slot_rank], 0)] & (topo.node_of[topo.slot_rank] >= 0)
        ch_hit = np.zeros(topo.n_channels, bool)
        ch_hit[np.unique(topo.slot_ch[slot_hit])] = True
        return cand[ch_hit[cand]].tolist()

    def _culprit_ev(self, cul: Culprit, hang: bool = False) -> dict[str, Any]:
        topo = self.topo
        ev: dict[str, Any] = {"places": [list(p) for p in cul.places[:16]], "ambiguous": cul.ambiguous}
        if cul.ambiguous:
            # what on-call does next: timings cannot split these places, a pairwise test can
            names = sorted(topo.node_names[n] for n in cul.nodes)
            pairs = f"{', '.join(names[:8])}{' ...' if len(names) > 8 else ''}"
            if hang:
                # every member is inside one stuck op (a whole-job barrier, say) and nothing else
                # moves: which link or NVLink stopped it is below what collective timings show
                ev["next_step"] = (
                    f"every rank of these {len(cul.places)} places is inside the same stuck op and nothing else "
                    "is moving, so timings cannot tell which one stopped it: compare the ranks' Flight Recorder "
                    f"dumps served with this suspect, or test point-to-point transfers between pairs of {pairs} "
                    "(e.g. nccl-tests sendrecv_perf): the pair that does not complete holds the fault"
                )
            else:
                ev["next_step"] = (
                    f"these {len(cul.places)} places carry the same slow traffic, so timings cannot tell them apart: "
                    f"measure point-to-point bandwidth between pairs of {pairs} "
                    "(e.g. nccl-tests sendrecv_perf) to find the slow one"
                )
        cells = []
        for ch in cul.channels:
            if int(topo.ch_parent[ch]) >= 0:
                a, b = topo.ch_members[ch].tolist()
                cells.append({"src": a, "dst": b, "src_node": topo.node_name(a), "dst_node": topo.node_name(b)})
        if cells:
            ev["p2p_cells"] = cells[:64]
        return ev

    def _straggler_findings(
        self, now: float, dt: float, roots: dict[int, Straggler], gone: np.ndarray, cands: dict[str, Finding]
    ) -> None:
        """Stragglers confirmed now (``gone``: per rank, silent or ended)."""
        cfg, topo, late = self.cfg, self.topo, self.late
        # a root that drops out of the evidence briefly keeps its hold, and the time out does not
        # count. The mild hold bridges drops of up to ``root_gap_s``: a mild straggler's lateness
        # varies with its steps, and it flickers in and out of the roots; started afresh at every
        # flicker, its 4 s hold never ran out. The short hold bridges one analysis: a straggler's
        # time inside ops is not yet down in the common window at its onset, and it drops out for
        # one analysis (tune-straggler-002: 1 s later for it); longer gaps join two halves of a
        # burst of GC pauses (a root for a second, gone, and back) into one hold, a false suspect
        self._bridge(self._rank_hot, self._hot_out, roots, now, dt, cfg.fast_hold_s)
        self._bridge(self._rank_held, self._rank_out, roots, now, dt, cfg.root_gap_s)
        # the whole job has stopped (no group has had an op analysed for ``stale_s``, and most ranks
        # have been inside an op that long: a hang not yet named): what is in the ring now is what
        # the last ops left there, and it stays until the ring runs out. Like a pause, that is no
        # fresh evidence: it neither holds a root nor confirms one (the last buckets before a hang
        # made a rank late in the job's final step a straggler, a second before the hang was
        # named). Not a checkpoint's save: its ranks are writing, not inside ops, and a straggler
        # in a job that saves often must be able to hold across the saves' first seconds
        seen = late.ch_new[: topo.n_channels]
        quiet = bool(np.isfinite(seen).any()) and now - float(seen.max()) > cfg.stale_s
        if quiet:
            inside = np.nan_to_num(now - self.prog.since[: topo.n_slots], nan=0.0) > cfg.stale_s
            quiet = 2 * np.unique(topo.slot_rank[inside]).shape[0] > topo.world
        # ...and so is the ring of a rank that is leaving (``gone``: it said it is terminating, or
        # went silent): when a launcher kills a job after a crash, its ranks' last buckets are what
        # the crash left, not a straggler
        stalled = {r for r, st in roots.items() if st.paused or quiet or gone[r]}
        for r in roots:
            self._rank_hot.setdefault(r, now)
            self._rank_held.setdefault(r, now)
            if r in stalled:
                # its groups paused, the job stopped or the rank is leaving: the time does not count
                # towards its hold. A group between its bursts has not paused: the time counts
                # towards the mild hold, which its rank held at the bursts on both sides of it (a
                # straggler of 0.9 s steps is judged at one analysis in four), and it confirms only
                # when judged afresh. Only the mild hold, ever, for such a rank of a pipeline: its
                # sends are between bursts too, not judged, and the victim tests lack whom it waited
                # on there (tune-straggler-008, tp8pp2dp2 at 10/s: a 1.5x straggler's pipeline
                # neighbour, late at its data-parallel reduce, was named by the short hold). Not
                # one of a job without (a flapping 1.5x rank of tp8dp8, 1 s steps, 3.0 -> 5.5 s)
                self._rank_hot[r] = min(now, self._rank_hot[r] + dt)
                if roots[r].between and not quiet and not gone[r]:
                    if self._sends(r):
                        self._carried.add(r)
                else:
                    self._rank_held[r] = min(now, self._rank_held[r] + dt)
        self._carried &= self._rank_held.keys()
        if not roots:
            return
        mild_w = cfg.mild_share
        imposed = {r: self._imposed(r) for r in roots}
        reported = self._reported_ranks("noncomm_slow")
        # the short hold: a straggler whose own fluctuation is learned in every group it is late in
        # (its threshold is its own), with twice the evidence that made it a root
        # (per root: how long its fluctuation has been learned where it is late, if its evidence is
        # twice what made it a root)
        learned = {
            r: float(late.noise_age[st.slots].min())
            if st.slots and float(late.cusum[st.slots].max()) >= 2 * cfg.cusum_h
            else -1.0
            for r, st in roots.items()
        }
        fast = {r: learned[r] >= cfg.noise_warm_s for r in roots}
        # a job already slowed ``mild_slowdown`` by a straggler named or confirmed is not barely
        # slowed: a further root that adds at least half that cost holds the short hold, not the mild
        # one (a second straggler of 1.3x in tp4dp4 costs the job 1.15x on its own, 1.27x with the
        # first, and waited 4 s or more)
        slowed = {q: self._imposed(q) for q in reported | set(self._confirmed_at)}
        strong = {
            r: imposed[r] >= mild_w
            or (imposed[r] >= 0.5 * mild_w and any(w >= mild_w for q, w in slowed.items() if q != r))
            for r in roots
        }
        confirmed = [
            r
            for r in roots
            if (
                roots[r].held
                or (
                    strong[r]
                    and r not in self._carried
                    and now - self._rank_hot[r] >= (cfg.fast_hold_s if fast[r] else cfg.hold_s)
                )
                or now - self._rank_held[r] >= cfg.mild_hold_s
            )
            and (r not in stalled or r in reported)  # a pause confirms nothing new
        ]
        # ...and a rank named alone (never a node: its ranks are confirmed only as above) may hold the
        # short hold once its fluctuation has been learned for half of ``noise_warm_s``, late in four
        # of its five recent buckets (``steady``): a job's faults do not wait for its noise to be
        # learned in full, and a second straggler in a deep pipeline is a root for a second at a
        # time. Counted for nodes, such ranks named a false node (tp8dp8, a cluster of GC pauses
        # made the node's eight ranks, one tensor-parallel group, late together)
        alone = {
            r
            for r, st in roots.items()
            if st.steady
            and strong[r]
            and learned[r] >= 0.5 * cfg.noise_warm_s
            and now - self._rank_hot[r] >= cfg.fast_hold_s
            and r not in stalled
            and r not in self._carried
        }
        for r in confirmed:
            self._confirmed_at[r] = now
        for r in [r for r, t in self._confirmed_at.items() if now - t > cfg.release_s]:
            del self._confirmed_at[r]
        nodes, singles = self._node_groups(sorted(roots))
        # a node already reported keeps every root on it (its ranks flicker in and out of the evidence)
        active_nodes = {
            n for n in range(len(topo.node_names)) if self._tracks.get(f"noncomm_slow:node:{topo.node_names[n]}")
        }
        for r in list(singles):
            n = int(topo.node_of[r])
            if n in active_nodes:
                singles.remove(r)
                nodes.setdefault(n, []).append(r)
        groups: list[tuple[str, list[int], list[int]]] = []
        in_node: np.ndarray | None = None  # per channel: a collective group within one node
        for n, rs in nodes.items():
            conf = [r for r in rs if r in confirmed]
            total = len(topo.node_ranks().get(n, []))
            need = max(2, math.ceil(cfg.node_share * total))
            # The roots of a slow node flicker. Two rules for it, both only when the roots span more
            # than one group inside the node: a straggler's tensor-parallel mates wait for it there
            # and flicker in and out of the roots with it (tp8dp8, whose node is one such group,
            # named the node of a straggler that way).
            # - the hold counts with brief drops bridged (``_rank_held``, as the mild hold does):
            #   in and out at every other analysis (tp4pp2dp4 at 100/s, a node half a stage), their
            #   time together never reached ``hold_s`` and the node came 10 s late, after two ranks;
            # - once one of its ranks is a straggler (confirmed within ``release_s``, named or not),
            #   the node has had that share among the roots at once again within ``mild_hold_s`` (a
            #   job of few ops a second with uneven steps named the one rank that held first, for
            #   tens of seconds)
            spans = False
            hold = cfg.hold_s
            if len(rs) >= need:
                if in_node is None:  # once per analysis, and only when a node may qualify
                    in_node = (topo.ch_parent < 0) & ~topo.ch_cross_node() & (topo.ch_size > 1)
                spans = self._spans_groups(rs, in_node)
                # all of them members of one group inside the node (tp8dp8: the node is one tensor-
                # parallel group): one rank's long GC pause holds all of them up, and they are late
                # together at every reduce for a second or two. Unless that share of them is late
                # steadily (``Straggler.steady``), ranks confirmed alone do not make the node, and
                # late together it takes twice ``hold_s`` (healthy tp8dp8 jobs with `gc+` named
                # nodes on 3 of 20 seeds of our own)
                if not spans and sum(roots[r].steady for r in rs) < need:
                    conf, hold = [], 2 * cfg.hold_s
            # ...or the node has had that share of its ranks among the roots at once for ``hold``:
            # ranks of one node late together are not the chance lateness of one rank's uneven steps
            since = sorted(self._rank_hot[r] for r in rs)
            together = len(since) >= need and now - since[need - 1] >= hold
            again = False
            if spans:
                held = sorted(self._rank_held[r] for r in rs)
                together = together or now - held[need - 1] >= cfg.hold_s
                times = [t for t in self._node_together.get(n, []) if now - t <= cfg.mild_hold_s] + [now]
                self._node_together[n] = times
                on_node = topo.node_ranks().get(n, [])
                again = len(times) >= 2 and any(r in self._confirmed_at or r in reported for r in on_node)
            if len(conf) >= need or together or again or n in active_nodes:
                groups.append(("node", sorted(rs), [n]))
        # a root with another root on its node may be part of a slow node about to qualify: it
        # waits ``mild_hold_s`` before it is named on its own (a 1.5x node of tp4pp2dp4, whose
        # ranks turn roots a few at a time, was named as three of its ranks first)
        # (node-mates that dropped out of the roots within ``root_gap_s`` count: ``_rank_held`` holds
        # every root and those. At 10/s a slow node's ranks flicker in and out of the roots
        # together, and one left a root alone for an analysis was named as a rank beside its node,
        # ``bench/probe_classes.py`` seed 8181, tp8dp4 `cpu_noise~`)
        root_nodes = Counter(int(topo.node_of[r]) for r in self._rank_held)
        # ...and so does a node-mate as late in a group the root is late in (its evidence open, at
        # three quarters of its threshold or more, as ``LatenessTracker`` weighs a rank at its
        # evidence's cap): ranks of one node late together in one group are its node's lateness,
        # for the node tests. In dp24 at 100/s, saving every 50 steps, the eight ranks of a 1.2x
        # node were late by 0.054-0.061 s per s against thresholds of 0.06 once each run was read
        # at its own rate; rank 8, just over, was a root while its mates flickered out and was
        # named 1.5 s before its node (``test_a_slow_node_of_a_data_parallel_job_late_below_every_
        # rank_s_threshold_is_the_node``). Not node-mates late in other groups: a straggler's
        # tensor-parallel mates arrive late at their own data-parallel groups
        for r in singles:
            if r in self._rank_held and root_nodes[int(topo.node_of[r])] < 2 and roots[r].slots:
                if self._mate_as_late(r, roots[r]):
                    root_nodes[int(topo.node_of[r])] += 1
        # ...and one named alone on the short hold must be late in four in five of its recent
        # buckets, not three (``Straggler.steady``): a straggler is late at every step, a rank with
        # a cluster of GC pauses at a few of them (tp8dp8 at 30/s: three pauses in five steps made
        # a 1.4x "straggler" for two seconds). Otherwise it waits ``mild_hold_s``
        groups += [
            ("rank", [r], [int(topo.node_of[r])])
            for r in singles
            if (r in confirmed or r in alone)
            and (r in reported or roots[r].held or roots[r].steady or now - self._rank_held[r] >= cfg.mild_hold_s)
            and (
                r in reported
                or topo.node_of[r] < 0
                or root_nodes[int(topo.node_of[r])] < 2
                or now - self._rank_held[r] >= cfg.mild_hold_s
            )
        ]
        for level, rs, ns in groups:
            w = min(0.95, max(imposed[r] for r in rs))
            # what the job is shown to lose: read in the groups where the rank is late past its
            # threshold (its slots as a root), not in one whose excess is under it: in a job that
            # saves after every 1.2 s of steps the whole job's group, around the saves' barriers,
            # read 0.4-0.8 s per s under a threshold of 0.46-0.83, and a 1.1x rank costing the job
            # 1.05x was shown as 4.5x slower (unseen-straggler_mild-003)
            shown = min(w, max(self._imposed_where_late(r, roots[r]) for r in rs))
            thr = max(roots[r].threshold for r in rs)
            onset = (
                float(np.nanmin([roots[r].onset for r in rs])) if any(not np.isnan(roots[r].onset) for r in rs) else now
            )
            ev_groups = []
            for r in rs[:8]:
                for s in roots[r].slots[:4]:
                    ch = int(topo.slot_ch[s])
                    lo, size = int(topo.ch_off[ch]), int(topo.ch_size[ch])
                    lr = late.late_rate[lo : lo + size]
                    top = np.argsort(-lr)[:4]
                    ev_groups.append(
                        {
                            "group": topo.ch_name[ch],
                            "desc": topo.ch_desc[ch],
                            "rank": r,
                            "seq_from": int(late.onset_seq[s]),
                            "seq_to": int(self.prog.last_seq[ch]),
                            "late_s_per_s": round(float(late.late_rate[s]), 4),
                            "baseline_s_per_s": round(float(late.late_rate[s] - late.ex_late[s]), 4),
                            "baseline_late_ms_per_op": round(1e3 * float(late.ref_lop[s]), 3),
                            "in_collective_s_per_s": round(float(late.dur_rate[s]), 4),
                            "lateness": {
                                str(int(topo.ch_members[ch][i])): round(float(lr[i]), 4) for i in top.tolist()
                            },
                        }
                    )
            score = _score(w, thr)
            base = self._base("noncomm_slow", level, rs, ns, None)
            cands[base["key"]] = Finding(
                **base,
                score=round(score, 3),
                slowdown=round(1.0 / (1.0 - shown), 4),
                first_seen=onset,
                detected_at=now,
                evidence={
                    "groups": ev_groups,
                    "window_s": RECENT_BUCKETS * cfg.bucket_s,
                    "threshold_s_per_s": round(thr, 4),
                },
            )

    def _barrier_findings(self, now: float, gone: np.ndarray, cands: dict[str, Finding]) -> None:
        """Stragglers that held up most of the job's recent barriers (``barriers.py``).

        A place the bucketed analysis already names is left to it; a node found here takes the
        place of its ranks named there (the barriers see all of them, the buckets only some).
        """
        topo = self.topo
        for b in self.barriers.analyse(now, topo):
            if gone[b.ranks].any():
                continue
            named = [k for k, f in cands.items() if f.kind == "noncomm_slow" and set(f.ranks) & set(b.ranks)]
            if b.level == "rank" and named:
                continue
            if b.level == "node" and any(cands[k].level == "node" for k in named):
                continue
            for k in named:
                del cands[k]
            score = _score(b.w, self.cfg.min_effect)
            base = self._base("noncomm_slow", b.level, b.ranks, [b.node], None)
            cands[base["key"]] = Finding(
                **base,
                score=round(score, 3),
                slowdown=round(1.0 / (1.0 - min(0.95, b.w)), 4),
                first_seen=b.onset,
                detected_at=now,
                evidence={
                    "barriers": {
                        "group": topo.ch_name[b.channel],
                        "desc": topo.ch_desc[b.channel],
                        "ops": b.ops,
                        "waited_s_per_s": round(b.w, 4),
                    }
                },
            )

    @staticmethod
    def _bridge(
        since: dict[int, float], out: dict[int, float], roots: dict[int, Straggler], now: float, dt: float, gap: float
    ) -> None:
        """Keep each hold in ``since`` through drops out of ``roots`` shorter than ``gap`` (``out``:
        since when a rank has been out), the time out not counted; a longer drop ends it."""
        for r in list(since):
            if r in roots:
                out.pop(r, None)
            elif now - out.setdefault(r, now) >= gap - 1e-9:
                del since[r], out[r]
            else:
                since[r] = min(now, since[r] + dt)

    def _sends(self, r: int) -> bool:
        """Whether rank ``r`` has point-to-point groups (a pipeline's sends and receives)."""
        topo = self.topo
        ptr, slots_of = topo.rank_slots()
        return bool((topo.ch_parent[topo.slot_ch[slots_of[ptr[r] : ptr[r + 1]]]] >= 0).any())

    def _spans_groups(self, ranks: list[int], in_node: np.ndarray) -> bool:
        """Whether ranks of one node are not all members of one group ``in_node`` (per channel)."""
        topo = self.topo
        ptr, slots_of = topo.rank_slots()
        common: set[int] | None = None
        for r in ranks:
            chs = topo.slot_ch[slots_of[ptr[r] : ptr[r + 1]]]
            mine = set(chs[in_node[chs]].tolist())
            common = mine if common is None else common & mine
            if not common:
                return True
        return False

    def _imposed(self, r: int) -> float:
        """Seconds per second the job waits on the rank beyond normal: the most any of its groups does.

        Not the sum over its groups: a delay carries on downstream — a straggler's tensor-parallel
        mates wait for it inside their group, then arrive as late as it at the data-parallel one —
        so every group it is in shows the same seconds, and the sum counted them once per group
        (a 1.24x straggler in tp4dp4 read 1.55x). Op rates as of each group's newest analysed op
        (``LatenessTracker.imposed``): counted up to now they read a 1.27x slow node as 1.13x.
        """
        ptr, slots_of = self.topo.rank_slots()
        return self.late.imposed_by(slots_of[ptr[r] : ptr[r + 1]])

    def _mate_as_late(self, r: int, st: Straggler) -> bool:
        """Whether another rank of r's node is as late (``as_late``) in a group r is a root in
        (``st.slots``)."""
        topo, late = self.topo, self.late
        node = int(topo.node_of[r])
        if node < 0:
            return False
        m = min(topo.n_slots, late.cusum.shape[0], late.ex_late.shape[0], late.thr.shape[0])
        for ch in {int(topo.slot_ch[s]) for s in st.slots}:
            lo, size = int(topo.ch_off[ch]), int(topo.ch_size[ch])
            if lo + size > m:
                continue
            sl = slice(lo, lo + size)
            members = topo.ch_members[ch]
            mate = (topo.node_of[members] == node) & (members != r)
            if np.any(mate & as_late(late.cusum[sl], late.ex_late[sl], late.thr[sl])):
                return True
        return False

    def _imposed_where_late(self, r: int, st: Straggler) -> float:
        """``_imposed`` over the groups where the rank is a root (``Straggler.slots``); over all of
        its groups if none is listed."""
        if not st.slots:
            return self._imposed(r)
        return self.late.imposed_by(np.asarray(st.slots, np.int64))

    def _comm_findings(self, now: float, slow: np.ndarray, healthy: np.ndarray, cands: dict[str, Finding]) -> None:
        cfg, topo, xfer = self.cfg, self.topo, self.xfer
        slow_ch = set(np.flatnonzero(slow).tolist())
        for ch in list(self._ch_slow):
            if ch not in slow_ch:
                del self._ch_slow[ch]
        for ch in slow_ch:
            self._ch_slow.setdefault(ch, now)
        confirmed = [ch for ch in slow_ch if now - self._ch_slow[ch] >= cfg.hold_s]
        if not confirmed:
            return
        healthy_ch = self._near(confirmed, np.flatnonzero(healthy).tolist())
        prefer = [
            [tuple(p) for p in tr.finding.evidence.get("places", [])]
            for tr in self._tracks.values()
            if tr.finding.kind == "comm_slow"
        ]
        for cul in localise(topo, sorted(confirmed), healthy_ch, prefer=prefer):
            # what it costs: per rank, the excess of its slow channels added up; the worst rank
            per_rank: dict[int, float] = {}
            for ch in cul.channels:
                for r in topo.ch_members[ch].tolist():
                    per_rank[r] = per_rank.get(r, 0.0) + max(0.0, float(xfer.ex_rate[ch]))
            w = min(0.95, max(per_rank.values(), default=0.0))
            if w < cfg.comm_min_effect:
                continue
            base = self._base("comm_slow", cul.level, cul.ranks, cul.nodes, cul.link)
            if (
                base["key"] not in self._tracks
                and now - min(self._ch_slow[ch] for ch in cul.channels) < cfg.hold_s + cfg.link_hold_s
                and (cul.level != "link" or {p[0] for p in cul.places} & {"nic", "rnic"})
                and np.unique(topo.node_of[np.concatenate([topo.ch_members[ch] for ch in cul.channels])]).shape[0] == 2
            ):
                # seen between two nodes only, and not as a link alone: a link that a NIC at one end
                # explains as well (the NIC's other channels may not have been judged yet: a slow
                # NIC shows on its busiest link first), or a GPU's NIC or the pair of nodes from
                # the first of a slow link's channels (its others judged a moment later: named,
                # the GPU stood as a false suspect for seconds beside the link). Wait a little
                continue
            ev_ch = [
                {
                    "group": topo.ch_name[ch],
                    "desc": topo.ch_desc[ch],
                    "ratio": round(float(xfer.ratio[ch]), 3),
                    "transfer_ms": round(1e3 * float(xfer.now_s[ch]), 3),
                    "baseline_ms": round(1e3 * float(xfer.base_s[ch]), 3),
                    "excess_s_per_s": round(float(xfer.ex_rate[ch]), 4),
                    "seq_to": int(self.prog.last_seq[ch]),
                }
                for ch in cul.channels[:32]
            ]
            ev = {"slow_groups": ev_ch, "healthy_groups_compared": len(healthy_ch), **self._culprit_ev(cul)}
            score = 0.5 if cul.ambiguous else float(min(0.99, 0.6 + 0.1 * len(cul.channels)))
            cands[base["key"]] = Finding(
                **base,
                score=round(score, 3),
                slowdown=round(1.0 / (1.0 - w), 4),
                first_seen=min(self._ch_slow[ch] for ch in cul.channels) - cfg.tau_s,
                detected_at=now,
                evidence=ev,
            )
