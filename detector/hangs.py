"""Hangs: who the stuck ranks are waiting for, followed back to the root.

Every heartbeat says, per group, the last sequence number the rank entered and completed and
since when its oldest unfinished collective has been in flight; point-to-point ops in flight are
listed with their peer and sequence number. A group is *stuck* when a member has been inside the
same op longer than the group's threshold: ``hang_p99_mult`` times its p99 time inside an op,
with a floor of ``hang_floor_s`` (``hang_warm_floor_s`` while the group has little history).

In a stuck group, members that never entered the op (their ``entered`` is behind) are what the
others wait for. Such a member that is itself stuck inside another op is a victim: follow it. One
that is inside nothing is a root of a **non-communication hang** — unless it has gone silent, in
which case liveness decides (``rank_dead``). A stuck group that every member entered and none can
finish is a root of a **communication hang** — unless a member went silent or left, inside the op
(liveness decides again); the place common to all stuck roots and absent from
channels that still progressed after the hang began is localised like a slow link.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rankwatch.detector.cells import CellStats
from rankwatch.detector.config import DetectorConfig
from rankwatch.detector.topology import Topology

__all__ = ["HangReport", "ProgressTracker", "StuckGroup"]

_BINS = 32  # half-octave bins of the longest time inside an op, from 10 us up
_LO = np.log2(1e-5)


@dataclass(slots=True)
class StuckGroup:
    ch: int
    seq: int
    since: float
    threshold: float
    waiting: list[int]  # ranks inside the op
    missing: list[int]  # ranks that never entered it


@dataclass(slots=True)
class HangReport:
    noncomm_roots: dict[int, list[StuckGroup]] = field(default_factory=dict)  # rank -> groups waiting on it
    comm_roots: list[StuckGroup] = field(default_factory=list)
    deferred: set[int] = field(default_factory=set)  # roots that went silent: liveness decides
    stuck: list[StuckGroup] = field(default_factory=list)


def _grow(a: np.ndarray, n: int, fill: object) -> np.ndarray:
    if a.shape[0] >= n:
        return a
    out = np.full(max(n, 2 * a.shape[0]), fill, a.dtype)
    out[: a.shape[0]] = a
    return out


class ProgressTracker:
    """Per-slot progress and per-channel history of time inside ops."""

    def __init__(self, cfg: DetectorConfig) -> None:
        self.cfg = cfg
        self.entered = np.zeros(0, np.int64)
        self.completed = np.zeros(0, np.int64)
        self.since = np.full(0, np.nan)
        self.wm = np.zeros(0, np.int64)  # highest sequence number with a record/block
        self.hist = np.zeros((0, _BINS), np.float32)  # per channel: decaying histogram of block maxima
        self.nq = np.zeros(0, np.int64)  # per channel: blocks seen
        self.t = float("nan")
        self._job_p99 = 0.0
        self._job_p99_at = float("nan")
        self.last_progress = np.full(0, -np.inf)  # per channel: server time of the latest completed op's enter
        self.last_seq = np.zeros(0, np.int64)  # per channel: highest sequence number analysed

    def reset(self) -> None:
        self.__init__(self.cfg)  # type: ignore[misc]

    def ensure(self, n_slots: int, n_channels: int) -> None:
        self.entered = _grow(self.entered, n_slots, 0)
        self.completed = _grow(self.completed, n_slots, 0)
        self.since = _grow(self.since, n_slots, np.nan)
        self.wm = _grow(self.wm, n_slots, 0)
        if self.hist.shape[0] < n_channels:
            h = np.zeros((max(n_channels, 2 * self.hist.shape[0]), _BINS), np.float32)
            h[: self.hist.shape[0]] = self.hist
            self.hist = h
        self.nq = _grow(self.nq, n_channels, 0)
        self.last_progress = _grow(self.last_progress, n_channels, -np.inf)
        self.last_seq = _grow(self.last_seq, n_channels, 0)

    def observe_cells(self, now: float, st: CellStats, end_seq: np.ndarray) -> None:
        """Learn each channel's p99 time inside an op from analysed blocks.

        The first ``hang_warm_cells`` blocks of a channel (start-up, compilation, the first step)
        are left out; the histogram forgets with ``hang_hist_tau_s``, so periodic long waits (a
        barrier after each checkpoint) stay in it and one-off ones fade.
        """
        cfg = self.cfg
        if not np.isnan(self.t) and now > self.t:
            self.hist *= np.float32(np.exp(-(now - self.t) / cfg.hang_hist_tau_s))
        self.t = now
        if not len(st):
            return
        ch = st.c_ch
        np.maximum.at(self.last_seq, ch, end_seq)
        seen = self.nq[ch].copy()
        np.add.at(self.nq, ch, 1)
        # order within this call does not matter much; skip cells of channels still warming up
        learn = seen >= cfg.hang_warm_cells
        if not learn.any():
            return
        b = np.clip(((np.log2(np.maximum(st.c_max[learn], 1e-9)) - _LO) * 2).astype(np.int64), 0, _BINS - 1)
        np.add.at(self.hist, (ch[learn], b), 1.0)

    def p99(self, ch: int) -> float:
        h = self.hist[ch].astype(np.float64)
        tot = h.sum()
        if tot < 1.0:
            return 0.0
        tail = np.cumsum(h[::-1])
        k = int(np.searchsorted(tail, 0.01 * tot))  # bins from the top holding 1% of the weight
        top_bin = _BINS - 1 - k
        return float(2.0 ** ((top_bin + 1) / 2 + _LO))

    def threshold(self, ch: int) -> float:
        """Seconds a member may be inside one op of channel ``ch`` before the channel is stuck.

        A channel with its own history: ``hang_p99_mult`` times its p99, at least ``hang_floor_s``.
        A channel used rarely (a barrier per checkpoint) in a job that has history elsewhere:
        twice the floor, or the multiple of the job's longest p99. A job still starting:
        ``hang_warm_floor_s``.
        """
        cfg = self.cfg
        warm = self.nq[: self.hist.shape[0]] >= cfg.hang_warm_cells + 8  # first blocks skipped, a few learned
        if warm[ch]:
            return max(cfg.hang_floor_s, cfg.hang_p99_mult * self.p99(ch))
        if warm.any():
            if self._job_p99_at != self.t:
                self._job_p99 = max(self.p99(int(c)) for c in np.flatnonzero(warm)[:4096].tolist())
                self._job_p99_at = self.t
            return max(2 * cfg.hang_floor_s, cfg.hang_p99_mult * self._job_p99)
        return cfg.hang_warm_floor_s

    def analyse(
        self, now: float, topo: Topology, silent: np.ndarray, dead: np.ndarray, ended: np.ndarray
    ) -> HangReport:
        """Stuck groups and the roots they wait on.

        Args:
            now: server time.
            topo: the job's topology.
            silent: per rank, missed a few heartbeats (liveness decides about it).
            dead: per rank, silent for good.
            ended: per rank, said goodbye, crashed or was terminated: its last word on progress is stale.
        """
        cfg = self.cfg
        n = topo.n_slots
        gone = (silent | dead | ended)[topo.slot_rank]
        since = np.where(gone, np.nan, self.since[:n])
        old = np.nan_to_num(now - since, nan=0.0) >= cfg.hang_floor_s
        rep = HangReport()
        if not old.any():
            return rep
        chans = np.unique(topo.slot_ch[old])
        # in flight per rank, and since when (oldest)
        in_flight_since: dict[int, float] = {}
        for s in np.flatnonzero(~np.isnan(since)).tolist():
            r = int(topo.slot_rank[s])
            v = float(since[s])
            if v < in_flight_since.get(r, np.inf):
                in_flight_since[r] = v
        p2p = topo.ch_parent >= 0
        for ch in chans.tolist():
            lo, size = int(topo.ch_off[ch]), int(topo.ch_size[ch])
            sl = slice(lo, lo + size)
            sn = since[sl]
            oldest = float(np.nanmin(sn))
            thr = self.threshold(ch)
            if now - oldest < thr:
                continue
            members = topo.ch_members[ch]
            ent = self.entered[sl]
            frontier = int(ent.max())
            waiting_m = ~np.isnan(sn)
            missing_m = ent < frontier
            if p2p[ch]:
                # one side stuck in op k: the other side either is in it too, or never got there
                k = frontier
                missing_m = ent < k
            g = StuckGroup(
                ch=ch,
                seq=frontier,
                since=oldest,
                threshold=thr,
                waiting=members[waiting_m].tolist(),
                missing=members[missing_m].tolist(),
            )
            rep.stuck.append(g)
            if not missing_m.any():
                gone_m = gone[sl]
                if gone_m.any():
                    # every member entered, but one went silent (SIGSTOPped inside the op, its host
                    # froze) or left: that is what the others wait for, and liveness decides
                    # (``rank_dead``), not a communication hang of the place they share
                    rep.deferred.update(members[gone_m].tolist())
                    continue
                rep.comm_roots.append(g)
                continue
            for r in g.missing:
                if silent[r] or dead[r] or ended[r]:
                    rep.deferred.add(r)
                    continue
                t = in_flight_since.get(r)
                if t is not None:
                    continue  # waiting inside something else (a victim) or still moving
                rep.noncomm_roots.setdefault(r, []).append(g)
        return rep
