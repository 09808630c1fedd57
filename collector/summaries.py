"""Per-group summaries over time: a compact row per process group per time window.

Raw op records stay in memory and are lost with the process; what people chart later (how many
ops a group ran, how many bytes, how long ranks spent inside its collectives) is folded into one
accumulator per (group, window) by the persist loop, from the columns ingest queued since its
last pass, and the accumulators that changed are written. In-collective times go into a log histogram
(four buckets per octave from 1 us, so a percentile is within about 19% of the exact one), which
is stored with the row: a process that takes over a job's lease carries on its open window.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rankwatch.sim.blocks import BlockBatch
from rankwatch.wire import KIND_NAMES, Records

__all__ = ["BUCKETS", "GroupSummaries", "bucket_of", "hist_percentile_ms", "summary_public"]

BUCKETS = 128
_PER_OCTAVE = 4
_I64_MAX = np.iinfo(np.int64).max


def bucket_of(dur_ns: np.ndarray) -> np.ndarray:
    """Histogram bucket of each duration: four per octave above 1 us (below 1 us: bucket 0)."""
    us = np.maximum(dur_ns, 1000).astype(np.float64) / 1000.0
    return np.minimum((np.log2(us) * _PER_OCTAVE).astype(np.intp), BUCKETS - 1)


def _bucket_ms(b: int) -> float:
    return float(2.0 ** ((b + 0.5) / _PER_OCTAVE) / 1000.0)


def hist_percentile_ms(hist: np.ndarray, q: float, lo_ms: float, hi_ms: float) -> float:
    """The ``q`` quantile (0..1) of a bucket histogram, as the bucket's geometric middle, clamped
    to the exact minimum and maximum."""
    nz = np.flatnonzero(hist)
    return _percentiles_ms(nz.tolist(), hist[nz].tolist(), (q,), lo_ms, hi_ms)[0]


def _percentiles_ms(buckets: list[int], counts: list[int], qs: tuple[float, ...], lo: float, hi: float) -> list[float]:
    """Quantiles of a sparse histogram (its non-empty buckets in order, and their counts)."""
    total = sum(counts)
    if not total:
        return [0.0] * len(qs)
    out = []
    for q in qs:
        want, seen = max(1, math.ceil(q * total)), 0
        for b, c in zip(buckets, counts, strict=True):
            seen += c
            if seen >= want:
                out.append(min(max(_bucket_ms(b), lo), hi))
                break
    return out


@dataclass(slots=True)
class _Window:
    ops: int = 0
    nbytes: int = 0
    seq_first: int = _I64_MAX
    seq_last: int = 0
    tsum_ns: float = 0.0
    tmin_ns: int = _I64_MAX
    tmax_ns: int = 0
    hist: np.ndarray = field(default_factory=lambda: np.zeros(BUCKETS, dtype=np.int64))
    kinds: dict[str, int] = field(default_factory=dict)
    reporters: set[int] = field(default_factory=set)
    ranks_before: int = 0  # ranks a previous holder saw report (by count: the same ranks go on)
    dirty: bool = True


_BlockPart = tuple[float, list[int], np.ndarray, np.ndarray, np.ndarray]
"""A queued block batch: window start, the job's group index of each of its group entries, its
block rows, and its progress rows' rank and group entry columns."""

MAX_QUEUED = 20_000_000
"""Records queued for folding at most (the persist loop folds every ``persist_interval_s``; this
only bounds memory if it is stuck: past it, records are left out of the summaries and counted)."""


class _Queue:
    """Records waiting to be folded, copied into growable column buffers.

    Copying a batch's columns into place costs a few slice assignments; folding then works on
    contiguous arrays, with no per-batch cost left (concatenating thousands of small arrays cost
    more than the fold itself).
    """

    def __init__(self, capacity: int = 1024) -> None:
        self.n = 0
        self.group = np.empty(capacity, np.intp)
        self.dur = np.empty(capacity, np.int64)
        self.seq = np.empty(capacity, np.int64)
        self.kind = np.empty(capacity, np.intp)
        self.nbytes = np.empty(capacity, np.float64)
        self.windows: list[tuple[int, float]] = []  # (offset, window start) where a window begins
        self.reports: list[tuple[float, int, list[int]]] = []  # (window, rank, the groups its batch named)
        self.blocks: list[_BlockPart] = []

    def append(self, start: float, rank: int, groups: list[int], lut: np.ndarray, r: Records) -> None:
        k = len(r)
        if self.n + k > len(self.dur):
            self._grow(self.n + k)
        if not self.windows or self.windows[-1][1] != start:
            self.windows.append((self.n, start))
        sl = slice(self.n, self.n + k)
        np.take(lut, r.group, out=self.group[sl])
        np.subtract(r.t_end, r.t_enter, out=self.dur[sl])
        self.seq[sl] = r.seq
        self.kind[sl] = r.kind
        self.nbytes[sl] = r.nbytes
        self.n += k
        self.reports.append((start, rank, groups))

    def _grow(self, need: int) -> None:
        cap = max(need, 2 * len(self.dur))
        for name in ("group", "dur", "seq", "kind", "nbytes"):
            old = getattr(self, name)
            new = np.empty(cap, old.dtype)
            new[: self.n] = old[: self.n]
            setattr(self, name, new)


class GroupSummaries:
    """The open (and not yet written) summary windows of one job.

    Ingest only queues each batch's columns (``add``: a dictionary lookup per group and a few
    slice copies); the persisting thread folds everything queued since its last pass with one set
    of numpy calls (``fold``), so numpy's per-call cost is paid per pass, not per batch.
    """

    def __init__(self, window_s: float = 60.0) -> None:
        self.window_s = float(window_s)
        self.windows: dict[tuple[str, float], _Window] = {}
        self._index: dict[str, int] = {}
        self._gids: list[str] = []
        self._queue = _Queue()
        self._blocks: list[_BlockPart] = []
        self._queued_blocks = 0
        self.dropped = 0

    def window_start(self, now: float) -> float:
        return math.floor(now / self.window_s) * self.window_s

    def add(self, rank: int, gids: tuple[str, ...], r: Records, now: float) -> None:
        """Queue one batch's records (received at ``now``: windows follow the server's clock).

        Args:
            rank: the sending rank.
            gids: the batch's group ids, indexed by ``r.group``.
            r: the batch's records.
            now: receive time, seconds since the epoch.
        """
        if not len(r):
            return
        if self._queue.n + len(r) > MAX_QUEUED:
            self.dropped += len(r)
            return
        index = []
        for gid in gids:
            j = self._index.get(gid)
            if j is None:
                j = self._index[gid] = len(self._gids)
                self._gids.append(gid)
            index.append(j)
        self._queue.append(self.window_start(now), rank, index, np.array(index, dtype=np.intp), r)

    def add_blocks(self, gids: tuple[str, ...], bb: BlockBatch, now: float, records: int | None = None) -> None:
        """Queue a block batch's rows (received at ``now``; ``records``: what its rows' counts sum
        to, if the caller has it).

        A block row stands for ``count`` ops; they go into the histogram at the row's mean time
        inside them, so in block mode percentiles are those of block means (the minimum and
        maximum stay exact). Group entries are mapped to the job's groups when folded, for all
        queued batches at once.
        """
        b = bb.blocks
        n = records if records is not None else int(b["count"].sum(dtype=np.int64)) if b.shape[0] else 0
        if not n:
            return
        if self._queued_blocks + n > MAX_QUEUED:
            self.dropped += n
            return
        index = self._index
        lut = [index.get(gid) for gid in gids]
        if None in lut:
            lut = [self._gindex(gid) for gid in gids]
        pr = bb.progress
        self._blocks.append((self.window_start(now), lut, b, pr["rank"], pr["group"]))  # type: ignore[arg-type]
        self._queued_blocks += n

    def _gindex(self, gid: str) -> int:
        j = self._index.get(gid)
        if j is None:
            j = self._index[gid] = len(self._gids)
            self._gids.append(gid)
        return j

    @property
    def pending(self) -> bool:
        return self._queue.n > 0 or bool(self._blocks)

    def take_pending(self) -> _Queue:
        """What ``add`` and ``add_blocks`` queued since the last call (call under the job's lock)."""
        out, self._queue = self._queue, _Queue(max(1024, self._queue.n))
        out.blocks, self._blocks, self._queued_blocks = self._blocks, [], 0
        return out

    def fold(self, queue: _Queue) -> None:
        """Fold queued records and block rows into their windows (by the persisting thread only)."""
        if queue.blocks:
            self._fold_blocks(queue.blocks)
        if not queue.n:
            return
        ends = [off for off, _ in queue.windows[1:]] + [queue.n]
        for (off, start), end in zip(queue.windows, ends, strict=True):
            self._fold_window(start, queue, slice(off, end))
        gids, windows = self._gids, self.windows
        for start, rank, groups in queue.reports:  # a rank reports the groups its batch names
            for gi in groups:
                w = windows.get((gids[gi], start))
                if w is not None:
                    w.reporters.add(rank)

    def _fold_window(self, start: float, q: _Queue, sl: slice) -> None:
        g, dur, seq, kind = q.group[sl], q.dur[sl], q.seq[sl], q.kind[sl]
        ngroups = len(self._gids)
        per_group = np.bincount(g, minlength=ngroups)
        present = np.flatnonzero(per_group)
        # a stable sort of 16-bit keys is a radix sort: several times faster than sorting int64
        order = np.argsort(g.astype(np.uint16) if ngroups < 65536 else g, kind="stable")
        bounds = np.concatenate(([0], np.cumsum(per_group[present])[:-1]))
        d_sorted, s_sorted = dur[order], seq[order]
        tmin = np.minimum.reduceat(d_sorted, bounds)
        tmax = np.maximum.reduceat(d_sorted, bounds)
        smin = np.minimum.reduceat(s_sorted, bounds)
        smax = np.maximum.reduceat(s_sorted, bounds)
        byte_sum = np.bincount(g, weights=q.nbytes[sl], minlength=ngroups)
        tsum = np.bincount(g, weights=dur.astype(np.float64), minlength=ngroups)
        hist = np.bincount(g * BUCKETS + bucket_of(dur), minlength=ngroups * BUCKETS).reshape(ngroups, BUCKETS)
        kinds_key, kinds_n = np.unique(g * 256 + kind, return_counts=True)
        touched: dict[int, _Window] = {}
        for j, gi in enumerate(present.tolist()):
            w = touched[gi] = self._window(self._gids[gi], start)
            w.ops += int(per_group[gi])
            w.nbytes += int(byte_sum[gi])
            w.seq_first = min(w.seq_first, int(smin[j]))
            w.seq_last = max(w.seq_last, int(smax[j]))
            w.tsum_ns += float(tsum[gi])
            w.tmin_ns = min(w.tmin_ns, int(tmin[j]))
            w.tmax_ns = max(w.tmax_ns, int(tmax[j]))
            w.hist += hist[gi]
            w.dirty = True
        for key, n in zip(kinds_key.tolist(), kinds_n.tolist(), strict=True):
            gi, k = divmod(key, 256)
            name = KIND_NAMES.get(k, str(k))
            kinds = touched[gi].kinds
            kinds[name] = kinds.get(name, 0) + n

    def _fold_blocks(self, parts: list[_BlockPart]) -> None:
        by_start: dict[float, list[int]] = {}
        for i, p in enumerate(parts):
            by_start.setdefault(p[0], []).append(i)
        ngroups = len(self._gids)
        for start, idx in by_start.items():
            # each part's group entries, mapped through its own table into the job's groups
            luts = [parts[i][1] for i in idx]
            lut = np.fromiter(itertools.chain.from_iterable(luts), np.intp)
            base = np.cumsum([0] + [len(t) for t in luts[:-1]])
            b = np.concatenate([parts[i][2] for i in idx])
            if not b.shape[0]:
                continue
            g = lut[np.repeat(base, [parts[i][2].shape[0] for i in idx]) + b["group"]]
            cnt = b["count"].astype(np.int64)
            w_cnt = cnt.astype(np.float64)
            per_group = np.bincount(g, weights=w_cnt, minlength=ngroups).astype(np.int64)
            byte_sum = np.bincount(g, weights=w_cnt * b["nbytes"], minlength=ngroups)
            tsum = np.bincount(g, weights=b["sum_ns"].astype(np.float64), minlength=ngroups)
            seq_lo = b["block"] * b["block_seqs"].astype(np.int64) + 1
            tmin = np.full(ngroups, _I64_MAX, np.int64)
            np.minimum.at(tmin, g, b["min_ns"])
            tmax = np.zeros(ngroups, np.int64)
            np.maximum.at(tmax, g, b["max_ns"])
            smin = np.full(ngroups, _I64_MAX, np.int64)
            np.minimum.at(smin, g, seq_lo)
            smax = np.zeros(ngroups, np.int64)
            np.maximum.at(smax, g, b["seq_hi"])
            mean = b["sum_ns"] // np.maximum(cnt, 1)
            hist = np.bincount(g * BUCKETS + bucket_of(mean), weights=w_cnt, minlength=ngroups * BUCKETS)
            hist = hist.astype(np.int64).reshape(ngroups, BUCKETS)
            kinds = np.bincount(g * 256 + b["kind"].astype(np.intp), weights=w_cnt, minlength=ngroups * 256)
            touched: dict[int, _Window] = {}
            for gi in np.flatnonzero(per_group).tolist():
                w = touched[gi] = self._window(self._gids[gi], start)
                w.ops += int(per_group[gi])
                w.nbytes += int(byte_sum[gi])
                w.seq_first = min(w.seq_first, int(smin[gi]))
                w.seq_last = max(w.seq_last, int(smax[gi]))
                w.tsum_ns += float(tsum[gi])
                w.tmin_ns = min(w.tmin_ns, int(tmin[gi]))
                w.tmax_ns = max(w.tmax_ns, int(tmax[gi]))
                w.hist += hist[gi]
                w.dirty = True
                for k in np.flatnonzero(kinds[gi * 256 : (gi + 1) * 256]).tolist():
                    name = KIND_NAMES.get(k, str(k))
                    w.kinds[name] = w.kinds.get(name, 0) + int(kinds[gi * 256 + k])
            ranks = np.concatenate([parts[i][3] for i in idx]).astype(np.int64)
            rg = lut[np.repeat(base, [parts[i][4].shape[0] for i in idx]) + np.concatenate([parts[i][4] for i in idx])]
            pairs = np.unique(rg * (1 << 32) + ranks)
            pg, pr = pairs >> 32, (pairs & 0xFFFFFFFF).tolist()
            # pairs are sorted by group: each group's ranks are one run (a mask per group is quadratic)
            groups, first = np.unique(pg, return_index=True)
            ends = np.r_[first[1:], pg.shape[0]].tolist()
            for gi, lo, hi in zip(groups.tolist(), first.tolist(), ends, strict=True):
                seen = self.windows.get((self._gids[gi], start))
                if seen is not None:
                    seen.reporters.update(pr[lo:hi])

    def _window(self, gid: str, start: float) -> _Window:
        w = self.windows.get((gid, start))
        if w is None:
            w = self.windows[(gid, start)] = _Window()
        return w

    # -- persistence ------------------------------------------------------------------------------
    def take_rows(self, job_id: str, writer: str, now: float) -> tuple[list[dict[str, Any]], list[tuple[str, float]]]:
        """Rows for the windows that changed since the last call (marked clean), and their keys;
        folds what is still queued first.

        Closed windows that were already written are dropped from memory. If writing the rows
        fails, ``mark_dirty(keys)`` puts them back.
        """
        if self.pending:
            self.fold(self.take_pending())
        current = self.window_start(now)
        rows: list[dict[str, Any]] = []
        keys: list[tuple[str, float]] = []
        for key, w in list(self.windows.items()):
            if not w.dirty:
                if key[1] < current:
                    del self.windows[key]
                continue
            w.dirty = False
            keys.append(key)
            rows.append(self._row(job_id, key, w, writer, now))
        return rows, keys

    def mark_dirty(self, keys: list[tuple[str, float]]) -> None:
        for key in keys:
            w = self.windows.get(key)
            if w is not None:
                w.dirty = True

    def _row(self, job_id: str, key: tuple[str, float], w: _Window, writer: str, now: float) -> dict[str, Any]:
        lo, hi = w.tmin_ns / 1e6, w.tmax_ns / 1e6
        nz = np.flatnonzero(w.hist)
        buckets, counts = nz.tolist(), w.hist[nz].tolist()
        p50, p99 = _percentiles_ms(buckets, counts, (0.50, 0.99), lo, hi)
        return {
            "job_id": job_id,
            "gid": key[0],
            "window_start": key[1],
            "window_s": self.window_s,
            "ops": w.ops,
            "bytes": w.nbytes,
            "ranks": max(w.ranks_before, len(w.reporters)),
            "seq_first": w.seq_first,
            "seq_last": w.seq_last,
            "time_sum_s": w.tsum_ns / 1e9,
            "time_min_ms": lo,
            "time_p50_ms": p50,
            "time_p99_ms": p99,
            "time_max_ms": hi,
            "kinds": dict(sorted(w.kinds.items())),
            "hist": [[b, c] for b, c in zip(buckets, counts, strict=True)],
            "writer": writer,
            "updated_at": now,
        }

    def restore(self, row: Any) -> None:
        """Carry on a window another process (or an earlier life of this one) wrote."""
        if float(row.window_s) != self.window_s:
            return  # the window length changed: the old row stays as it is
        w = _Window(
            ops=int(row.ops),
            nbytes=int(row.bytes),
            seq_first=int(row.seq_first),
            seq_last=int(row.seq_last),
            tsum_ns=float(row.time_sum_s) * 1e9,
            tmin_ns=round(float(row.time_min_ms) * 1e6),
            tmax_ns=round(float(row.time_max_ms) * 1e6),
            kinds={str(k): int(v) for k, v in (row.kinds or {}).items()},
            ranks_before=int(row.ranks),
            dirty=False,
        )
        for b, c in row.hist or []:
            if 0 <= int(b) < BUCKETS:
                w.hist[int(b)] += int(c)
        self.windows[(row.gid, float(row.window_start))] = w


def summary_public(row: Any) -> dict[str, Any]:
    """A summary row as the API shows it."""
    from rankwatch.collector.jobs import iso

    return {
        "group": row.gid,
        "window_start": iso(row.window_start),
        "window_s": row.window_s,
        "ops": row.ops,
        "bytes": row.bytes,
        "ranks": row.ranks,
        "seq_first": row.seq_first,
        "seq_last": row.seq_last,
        "time_sum_s": round(row.time_sum_s, 6),
        "time_min_ms": round(row.time_min_ms, 4),
        "time_p50_ms": round(row.time_p50_ms, 4),
        "time_p99_ms": round(row.time_p99_ms, 4),
        "time_max_ms": round(row.time_max_ms, 4),
        "kinds": row.kinds,
        "writer": row.writer,
        "updated_at": iso(row.updated_at),
    }
