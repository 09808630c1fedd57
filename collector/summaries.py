"""Per-group summaries over time: a compact row per process group per time window.

Raw op records stay in memory and are lost with the process; what people chart later (how many
ops a group ran, how many bytes, how long ranks spent inside its collectives) is folded at
ingest, with a few numpy calls per batch, into one accumulator per (group, window), and the
persist loop writes the accumulators that changed. In-collective times go into a log histogram
(four buckets per octave from 1 us, so a percentile is within about 19% of the exact one), which
is stored with the row: a process that takes over a job's lease carries on its open window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rankwatch.wire import Records

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
    total = int(hist.sum())
    if total == 0:
        return 0.0
    b = int(np.searchsorted(np.cumsum(hist), max(1, math.ceil(q * total))))
    return min(max(_bucket_ms(b), lo_ms), hi_ms)


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


class GroupSummaries:
    """The open (and not yet written) summary windows of one job."""

    def __init__(self, window_s: float = 60.0) -> None:
        self.window_s = float(window_s)
        self.windows: dict[tuple[str, float], _Window] = {}

    def window_start(self, now: float) -> float:
        return math.floor(now / self.window_s) * self.window_s

    def add(self, rank: int, gids: tuple[str, ...], r: Records, counts: dict[int, dict[str, int]], now: float) -> None:
        """Fold one batch's records (received at ``now``) into its groups' current windows.

        Args:
            rank: the sending rank.
            gids: the batch's group ids, indexed by ``r.group``.
            r: the batch's records.
            counts: op counts per group index and kind name (computed once for the batch).
            now: receive time, seconds since the epoch: windows follow the server's clock.
        """
        n = len(r)
        if not n:
            return
        start = self.window_start(now)
        dur = r.t_end - r.t_enter
        b = bucket_of(dur)
        g = r.group.astype(np.intp)
        per_group = np.bincount(g, minlength=len(gids))
        present = np.flatnonzero(per_group)
        if len(present) == 1:
            gi = int(present[0])
            self._fold(
                self._window(gids[gi], start),
                rank,
                n,
                int(r.nbytes.sum()),
                int(r.seq.min()),
                int(r.seq.max()),
                float(dur.sum()),
                int(dur.min()),
                int(dur.max()),
                np.bincount(b, minlength=BUCKETS),
                counts.get(gi, {}),
            )
            return
        order = np.argsort(g, kind="stable")
        bounds = np.concatenate(([0], np.cumsum(per_group[present])[:-1]))
        d_sorted, s_sorted = dur[order], r.seq[order]
        tmin = np.minimum.reduceat(d_sorted, bounds)
        tmax = np.maximum.reduceat(d_sorted, bounds)
        smin = np.minimum.reduceat(s_sorted, bounds)
        smax = np.maximum.reduceat(s_sorted, bounds)
        nbytes = np.bincount(g, weights=r.nbytes.astype(np.float64), minlength=len(gids))
        tsum = np.bincount(g, weights=dur.astype(np.float64), minlength=len(gids))
        hist = np.bincount(g * BUCKETS + b, minlength=len(gids) * BUCKETS).reshape(len(gids), BUCKETS)
        for j, gi in enumerate(present.tolist()):
            self._fold(
                self._window(gids[gi], start),
                rank,
                int(per_group[gi]),
                int(nbytes[gi]),
                int(smin[j]),
                int(smax[j]),
                float(tsum[gi]),
                int(tmin[j]),
                int(tmax[j]),
                hist[gi],
                counts.get(gi, {}),
            )

    def _window(self, gid: str, start: float) -> _Window:
        w = self.windows.get((gid, start))
        if w is None:
            w = self.windows[(gid, start)] = _Window()
        return w

    @staticmethod
    def _fold(
        w: _Window,
        rank: int,
        ops: int,
        nbytes: int,
        seq_first: int,
        seq_last: int,
        tsum_ns: float,
        tmin_ns: int,
        tmax_ns: int,
        hist: np.ndarray,
        kinds: dict[str, int],
    ) -> None:
        w.ops += ops
        w.nbytes += nbytes
        w.seq_first = min(w.seq_first, seq_first)
        w.seq_last = max(w.seq_last, seq_last)
        w.tsum_ns += tsum_ns
        w.tmin_ns = min(w.tmin_ns, tmin_ns)
        w.tmax_ns = max(w.tmax_ns, tmax_ns)
        w.hist += hist
        for k, c in kinds.items():
            w.kinds[k] = w.kinds.get(k, 0) + c
        w.reporters.add(rank)
        w.dirty = True

    # -- persistence ------------------------------------------------------------------------------
    def take_rows(self, job_id: str, writer: str, now: float) -> tuple[list[dict[str, Any]], list[tuple[str, float]]]:
        """Rows for the windows that changed since the last call (marked clean), and their keys.

        Closed windows that were already written are dropped from memory. If writing the rows
        fails, ``mark_dirty(keys)`` puts them back.
        """
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
            "time_p50_ms": hist_percentile_ms(w.hist, 0.50, lo, hi),
            "time_p99_ms": hist_percentile_ms(w.hist, 0.99, lo, hi),
            "time_max_ms": hi,
            "kinds": dict(sorted(w.kinds.items())),
            "hist": [[int(i), int(w.hist[i])] for i in nz.tolist()],
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
