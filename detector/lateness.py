"""Non-communication slowness: the rank the others keep waiting for, and how much it costs.

Per slot (one rank in one group) the analysed blocks are added into time buckets of
``bucket_s`` seconds (server time of the ops): how long the others waited for it (*lateness*),
how long it spent inside the group's ops (*in-collective time*), and how many ops. A slot's rate
is the **median over its five most recent non-empty buckets** of the per-op mean times the
group's op rate: seconds per second of wall-clock, so lateness is directly the share w of time
the group loses. The median makes it persistent by construction — a GC pause, a barrier after a
checkpoint or one slow step lands in one or two buckets and moves nothing; a straggler is in all five.
Across a pause of the job (a checkpoint's save) a collective group that runs ops often is judged
over its newest buckets before and after the pause together, until it has five after it.

A slot is *hot* when its lateness exceeds what is normal for it — the lower of its own baseline
(once learned) and, in a collective group, the group's lower median now — by at least
``min_effect`` and by ``noise_k`` times its usual fluctuation (in a group of three or more,
never less than the group's: the upper median of its members'), and the evidence (a CUSUM of
that excess over time, each bucket counted once) has added up to ``cusum_h``; evidence that
opens at twice the threshold in a steady slot counts the three late buckets its median stands for.

Lateness propagates: a rank that waited for a straggler in its tensor-parallel group arrives late
at its data-parallel all-reduce. So a hot slot counts against its rank only if the rank did not,
at the same time, spend about as much extra time inside another group's ops (waiting there, or
in a slow transfer). What is left are the roots.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

from rankwatch.detector.cells import CellStats
from rankwatch.detector.config import DetectorConfig
from rankwatch.detector.topology import Topology

__all__ = ["RECENT_BUCKETS", "LatenessTracker", "Straggler"]

_WIN = 10  # buckets (4 s) a slot is judged over, and its shares of time inside ops measured over...
_K = 40  # ...and kept per slot (16 s): a group that runs one burst of ops a step, of steps of a
# second or longer, has under five non-empty buckets in ``_WIN``; it is judged over the older ones
_SPARSE = 3.0  # ...if its recent non-empty buckets lie this many buckets apart (1.2 s; the median gap)
RECENT_BUCKETS = 5  # most recent non-empty buckets the median is taken over...
_MIN_OPS = 8  # ...and at least this many ops in them
_DENSE = 8  # buckets of ``_WIN`` with ops (or five or more side by side, a run of steps since the
# last pause, once learned): a group that runs ops often (not in bursts a step apart)
_RUN_MIN_BUCKETS = 2  # a run since a pause that spans this many buckets is read at its own rate
_AS_LATE = 0.75  # a rank as late as another: its evidence open, at this share of its threshold or more
_STAGE_WIN = 20  # buckets (8 s) the slow-stage test's share of time inside ops is read over...
_STAGE_RAMP = 5  # ...weighted up and down over this many at either end (2 s): see ``_learn_extra``
_STAGE_W = np.minimum(
    1.0, np.minimum(np.arange(1, _STAGE_WIN + 1), np.arange(_STAGE_WIN, 0, -1)) / (_STAGE_RAMP + 1.0)
).astype(np.float32)
_ROWS = 16384  # slots per block of the recent-bucket medians (a few MB of intermediates)


@dataclass(slots=True)
class Straggler:
    """A rank whose own slowness holds others up, as seen at one evaluation."""

    rank: int
    excess: float  # seconds per second the others wait on it (its worst group)
    threshold: float
    slots: list[int] = field(default_factory=list)
    onset: float = float("nan")
    held: bool = False  # it has already held its own test's hold (a slow pipeline stage)
    paused: bool = False  # its groups have paused since it was found: no fresh evidence either way
    between: bool = False  # ...or, running, its group is between bursts (``LatenessTracker.between``)
    steady: bool = False  # late in four in five recent buckets of a group it is late in, not just three


def as_late(cusum: np.ndarray, ex_late: np.ndarray, thr: np.ndarray) -> np.ndarray:
    """Per slot: late as a root's node-mate is for the node tests (its evidence open, its excess at
    ``_AS_LATE`` of its threshold or more)."""
    return (cusum > 0) & (ex_late >= _AS_LATE * thr)


def _median_taken(x: np.ndarray, cnt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row medians of ``x`` whose first ``cnt`` sorted values are real (the rest are +inf), and the
    value four in five of them reach (the second lowest of five); nan if none."""
    xs = np.sort(x, axis=1)
    rows = np.arange(x.shape[0])
    lo = np.clip((cnt - 1) // 2, 0, x.shape[1] - 1)
    hi = np.clip(cnt // 2, 0, x.shape[1] - 1)
    med = 0.5 * (xs[rows, lo] + xs[rows, hi])
    low = xs[rows, np.clip(cnt // 5, 0, x.shape[1] - 1)]
    return np.where(cnt > 0, med, np.nan), np.where(cnt > 0, low, np.nan)


def _grow(a: np.ndarray, n: int, fill: float) -> np.ndarray:
    if a.shape[0] >= n:
        return a
    out = np.full((max(n, 2 * a.shape[0]), *a.shape[1:]), fill, a.dtype)
    out[: a.shape[0]] = a
    return out


class LatenessTracker:
    """Bucketed lateness per slot, baselines, and the roots they point to."""

    _NAN = (
        "base_late",
        "base_dur",
        "base_wide",
        "noise_wide",
        "level_wide",
        "noise",
        "level",
        "onset",
        "first_data",
        "usual_extra",
        "usual_wd",
        "usual_wo",
        "usual_share",
        "usual_stage",
        "judged",
    )

    def __init__(self, cfg: DetectorConfig) -> None:
        self.cfg = cfg
        self.n = 0
        self.bl = np.zeros((0, _K), np.float32)  # lateness seconds per bucket
        self.bd = np.zeros((0, _K), np.float32)  # in-collective seconds
        self.bo = np.zeros((0, _K), np.float32)  # ops
        self.bid = np.full(_K, -(2**62), np.int64)  # absolute bucket id held by each ring position
        self.base_late = np.full(0, np.nan)
        self.base_dur = np.full(0, np.nan)
        # per slot of a pipeline's sends too sparse for the window (``ml_wide``): its usual per-op
        # lateness so read, for the slow-stage test alone, and the rest as for ``base_late``
        self.base_wide = np.full(0, np.nan)
        self.wide_age = np.zeros(0)
        self.ml_wide = np.zeros(0)
        self.ex_wide = np.zeros(0)
        self.noise_wide = np.full(0, np.nan)  # ...and its usual fluctuation (around ``level_wide``)
        self.level_wide = np.full(0, np.nan)
        self.thr_wide = np.zeros(0)
        self.noise = np.full(0, np.nan)  # usual fluctuation of the excess lateness (s/s)
        self.level = np.full(0, np.nan)  # ...around this running level of it
        # per slot: samples held back while its evidence is open (sum a, a*d, a*d*d; seconds held)
        self.pend = np.zeros((0, 4))
        self.onset = np.full(0, np.nan)
        self.first_data = np.full(0, np.nan)
        self.judged = np.full(0, np.nan)  # per slot: server time it was last judged (had enough recent data)
        self.usual_extra = np.full(0, np.nan)  # seconds inside ops over the per-op baseline, per window, while calm
        self.usual_wd = np.full(0, np.nan)  # ...seconds inside ops per window, learned with it
        self.usual_wo = np.full(0, np.nan)  # ...and ops per window
        self.extra_age = np.zeros(0)
        self.usual_share = np.full(0, np.nan)  # per slot: share of wall-clock inside its ops, while calm
        self.usual_in = np.full(0, np.nan)  # per rank: the sum of its slots' (inside any op)
        self.usual_stage = np.full(0, np.nan)  # per slot: its share as the slow-stage test reads it, while calm
        self.stage_in = np.zeros(0)  # per rank: the sum of its slots' share so read now, over their usual
        self.d_slot = np.zeros(0)  # per slot: share inside its ops now, over the usual
        self.in_age = np.zeros(0)
        self.stage_in_age = np.zeros(0)  # per rank: how long ``usual_stage`` has been learned since it (re)started
        self.stage_restarted = False  # the last analysis started the slow-stage test's usuals again
        self.stage_restart_at = np.nan  # ...and when it will (once the window has left the old level)
        self.d_in = np.zeros(0)  # per rank: share of wall-clock inside ops now, over the usual
        self.base_age = np.zeros(0)
        self.noise_age = np.zeros(0)
        self.ncells = np.zeros(0)
        self.onset_seq = np.zeros(0, np.int64)
        self.hot = np.zeros(0, bool)
        self.busy = np.zeros(0, bool)
        self.cusum = np.zeros(0)
        self.newest = np.zeros(0, np.int64)
        self.last_bid = np.zeros(0, np.int64)  # per slot: newest bucket id it has data in
        self.ch_ops = np.zeros(0)  # per channel: decayed op count (rate = / ops_tau)
        self.ch_new = np.full(0, -np.inf)  # per channel: server time of its newest analysed op
        self.ch_ref = np.full(0, np.nan)  # per channel: its own clock's time its op count is decayed to
        self.ch_skip = np.zeros(0)  # per channel: seconds of pauses its clock has left out
        self.ch_first = np.full(0, np.inf)  # per channel: server time of its first analysed op
        self.ch_start = np.full(0, np.inf)  # ...and of the first of its run since its latest pause
        # per channel: the part of ``ch_ops`` from before its run since its latest pause, where that
        # run is read at its own rate (``run_rate_now``); nan where not
        self.ch_pre = np.full(0, np.nan)
        self._by_size: tuple[tuple[int, int, int], list[tuple[int, np.ndarray, np.ndarray]]] = ((-1, -1, -1), [])
        # results of the last ``analyse``
        self.late_rate = np.zeros(0)
        self.ref_lop = np.zeros(0)
        self.dur_rate = np.zeros(0)
        self.ex_late = np.zeros(0)
        self.imposed = np.zeros(0)  # per slot: ex_late at the op rate as of its group's newest op
        self.steady = np.zeros(0, bool)  # per slot: late in four in five of its recent buckets
        self.ex_dur = np.zeros(0)
        self.paused = np.zeros(0, bool)  # per slot: its group has paused since it was last judged
        self.between = np.zeros(0, bool)  # per slot: ...or runs, but is a bucket short of its median
        self.nb_judged = np.zeros(0, np.int64)  # per slot: its buckets with ops when last judged (-1: side by side)
        self.waiting = np.zeros(0, bool)  # per slot: old enough to judge, but too few recent buckets
        self.sparse_rate = np.zeros(0)  # per slot judged over bursts a second or more apart: their op rate
        self.gap = np.zeros(0, bool)  # per slot: its group went quiet since the slot was last judged
        self.bridged = np.zeros(0, bool)  # per slot: ...and has not had RECENT_BUCKETS buckets since
        # per slot, when last running: ran ops often (2: ``_DENSE``; 1: only a short run, side by side)
        self.dense = np.zeros(0, np.int8)
        self.runs = np.zeros(0, bool)  # per slot, when last running: its ops came in one run side by side
        self.short = np.zeros(0, bool)  # per slot: bridged only because its runs between pauses are short
        self.run_rate = np.zeros(0)  # per slot so bridged, as judged now: the op rate of its fullest bucket
        self._prev_roots: dict[int, Straggler] = {}
        self.thr = np.zeros(0)
        self.stage_run = np.zeros(0)  # per node: seconds its slow-stage evidence has held
        self.lean_run = np.zeros(0)  # per node: seconds its ranks have leaned late together (``_lean_nodes``)
        self.lean_out = np.zeros(0)  # per node: seconds since they last did (while run > 0)
        self.stage_out = np.zeros(0)  # per node: seconds since that evidence last held (while run > 0)
        self.stage_z = np.full(0, np.nan)  # per node: change of its share inside ops against the other nodes'
        self.stage_late = np.full(0, np.nan)  # per node: usual lateness at its cross-node point-to-point channels
        self.stage_age = np.zeros(0)
        self.stage_lean = np.zeros(0)  # per node: seconds its signs have leaned towards a slow stage without learning
        self.stage_var = np.zeros((0, 2))  # per node: usual spread of the two (share drop, lateness)
        self.stage_line = np.zeros((0, 2))  # per node: the two lines at the last analysis (for reading)
        self.stage_zn = np.zeros(0)  # per node: change of its share inside ops against its pipeline neighbours'

    def reset(self) -> None:
        self.__init__(self.cfg)  # type: ignore[misc]

    def _ensure(self, n: int, n_ch: int) -> None:
        self.ch_ops = _grow(self.ch_ops, n_ch, 0.0)
        self.ch_new = _grow(self.ch_new, n_ch, -np.inf)
        self.ch_ref = _grow(self.ch_ref, n_ch, np.nan)
        self.ch_skip = _grow(self.ch_skip, n_ch, 0.0)
        self.ch_first = _grow(self.ch_first, n_ch, np.inf)
        self.ch_start = _grow(self.ch_start, n_ch, np.inf)
        self.ch_pre = _grow(self.ch_pre, n_ch, np.nan)
        if n <= self.n:
            return
        for name in ("bl", "bd", "bo"):
            setattr(self, name, _grow(getattr(self, name), n, 0.0))
        for name in self._NAN:
            setattr(self, name, _grow(getattr(self, name), n, np.nan))
        self.base_age = _grow(self.base_age, n, 0.0)
        self.wide_age = _grow(self.wide_age, n, 0.0)
        self.extra_age = _grow(self.extra_age, n, 0.0)
        self.noise_age = _grow(self.noise_age, n, 0.0)
        self.pend = _grow(self.pend, n, 0.0)
        self.ncells = _grow(self.ncells, n, 0.0)
        self.onset_seq = _grow(self.onset_seq, n, 0)
        self.hot = _grow(self.hot, n, False)
        self.gap = _grow(self.gap, n, False)
        self.nb_judged = _grow(self.nb_judged, n, 0)
        self.bridged = _grow(self.bridged, n, False)
        self.dense = _grow(self.dense, n, 0)
        self.runs = _grow(self.runs, n, False)
        self.short = _grow(self.short, n, False)
        self.busy = _grow(self.busy, n, False)
        self.cusum = _grow(self.cusum, n, 0.0)
        self.newest = _grow(self.newest, n, -(2**62))
        self.last_bid = _grow(self.last_bid, n, -(2**62))
        self.n = n

    def update(
        self,
        now: float,
        st: CellStats,
        seq_lo: np.ndarray,
        n_slots: int,
        n_ch: int,
        topo_ch: np.ndarray | None = None,
        topo_p2p: np.ndarray | None = None,
        spread: bool = False,
    ) -> None:
        """Add analysed blocks.

        Args:
            now: server time.
            st: the blocks.
            seq_lo: first sequence number of each row's block.
            n_slots: slots in the topology.
            n_ch: channels in the topology.
            topo_ch: each row's channel.
            topo_p2p: whether each row's channel is point-to-point.
            spread: spread blocks longer than a bucket over the buckets they cover (blocks the ranks
                cut themselves; raw records are cut here, at ``raw_block_s``).
        """
        cfg = self.cfg
        self._ensure(n_slots, n_ch)
        # a group's op rate is its rate while it runs: its count decays with the group's own
        # clock, server time less the group's pauses (a gap between its ops longer than
        # ``stale_s``, less that), and stops ``stale_s`` after its newest analysed op (a block is
        # analysed a second or so after its ops ran) until it runs again — a checkpoint's save is
        # not a slower rate. Decayed through pauses, every straggler read small after each one,
        # and every rank's share of time inside ops (time inside over ops at the rate) swung
        # with them. A group whose blocks come late but without gaps is not paused: its count
        # decays as it runs
        if len(st):
            first = np.full(n_ch, np.inf)
            np.minimum.at(first, st.c_ch, st.c_t)
            was = self.ch_new[:n_ch]
            gap = np.where(np.isfinite(was) & np.isfinite(first), first - was - cfg.stale_s, 0.0)
            # (how long it had run before, and its run before the pause: ``run_rate_now``)
            grown = was - self.ch_first[:n_ch] - self.ch_skip[:n_ch] >= cfg.baseline_warm_s
            brief = was - self.ch_start[:n_ch] < 2 * cfg.ops_tau_s
            self.ch_first[:n_ch] = np.fmin(self.ch_first[:n_ch], first)
            self.ch_start[:n_ch] = np.where((gap > 0) | ~np.isfinite(self.ch_start[:n_ch]), first, self.ch_start[:n_ch])
            self.ch_skip[:n_ch] += np.clip(gap, 0.0, None)
            np.maximum.at(self.ch_new, st.c_ch, np.minimum(st.c_t, now))
        ref = np.minimum(now, self.ch_new[:n_ch] + cfg.stale_s)  # -inf: no op yet
        clock = ref - self.ch_skip[:n_ch]
        old = self.ch_ref[:n_ch]
        ran = np.where(np.isfinite(clock) & np.isfinite(old), clock - old, 0.0)
        k = np.exp(-np.clip(ran, 0.0, None) / cfg.ops_tau_s)
        self.ch_ops[:n_ch] *= k
        self.ch_pre[:n_ch] *= k
        self.ch_ref[:n_ch] = np.where(np.isfinite(clock), clock, old)
        if len(st):
            # a run after a pause: its first block marks where it began, and is counted with what
            # the count held before it (``run_rate_now``: the ops after that block over the time
            # since it, which counts a group running a burst a step right, not its first burst
            # over no time)
            self.ch_pre[:n_ch][gap > 0] = np.nan
            resumed = (gap > 0) & grown & brief
            if resumed.any():
                back = np.flatnonzero(resumed)
                self.ch_pre[back] = self.ch_ops[back]
                lead = resumed[st.c_ch] & (st.c_t == first[st.c_ch])
                w0 = np.exp(-np.clip(ref[st.c_ch[lead]] - st.c_t[lead], 0.0, None) / cfg.ops_tau_s)
                self.ch_pre[:n_ch] += np.bincount(st.c_ch[lead], st.c_cnt[lead] * w0, n_ch)
            w = np.exp(-np.clip(ref[st.c_ch] - st.c_t, 0.0, None) / cfg.ops_tau_s)
            self.ch_ops[:n_ch] += np.bincount(st.c_ch, st.c_cnt * w, n_ch)
        if not st.slot.shape[0]:
            return
        t = np.minimum(st.t, now)
        ids = np.floor(t / cfg.bucket_s).astype(np.int64)
        top = int(ids.max())
        cur = int(self.bid.max())
        new_b = np.arange(max(cur + 1, top - _K + 1), top + 1)
        if new_b.shape[0]:
            # the ring positions these buckets take, emptied a run of adjacent columns at a time
            # (one pass over a big job's ring, not one per bucket); rows past the slots in use were
            # never written
            p = new_b % _K
            for run in np.split(p, np.flatnonzero(np.diff(p) != 1) + 1):
                for arr in (self.bl, self.bd, self.bo):
                    arr[: self.n, run[0] : run[-1] + 1] = 0.0
            self.bid[p] = new_b
        # rows per slot in this update: a slot with one row (the usual case) touches each of its
        # ring cells at most once, and those are added at once; ``np.add.at`` (slow) is left for
        # the cells of slots with several rows
        per_slot = np.bincount(st.slot, minlength=self.ncells.shape[0])
        t0 = np.minimum(st.t0, t) if spread else t
        # a big ring (a 100k-rank job's) a block of rows at a time: the same arithmetic, but its
        # intermediates stay in cache; a smaller one in one go (one pass over the ring, if any)
        step = _ROWS if self.bl.shape[0] * _K >= 1 << 20 else max(1, t.shape[0])
        for lo in range(0, t.shape[0], step):
            r = slice(lo, lo + step)
            self._add_rows(st.slot[r], ids[r], t0[r], t[r], st.late[r], st.dur[r], st.cnt[r], per_slot, spread)
        # each row's newest bucket is its slot's newest (a row whose newest is older than the ring
        # has no bucket in it)
        in_ring = self.bid[ids % _K] == ids
        np.maximum.at(self.last_bid, st.slot[in_ring], ids[in_ring])
        unseen = np.isnan(self.first_data[st.slot])
        if unseen.any():
            first = self.first_data
            first[st.slot[unseen]] = np.inf
            np.minimum.at(first, st.slot[unseen], st.t[unseen])
        # each slot's usual time inside one op, learned block by block (a group that runs one op a
        # second has too few in the bucket ring): drops are followed at once, rises slowly — a
        # fault only ever adds time inside ops, and compilation or the first step must not stay
        # in it. For ops that differ (a pipeline's microbatches) this is their lower envelope,
        # which group-mates share. Nothing is learned while the rank is, or waits on, a suspect.
        per_op = st.dur / np.maximum(st.cnt, 1.0)
        learn = ~self.busy[st.slot] & (self.ncells[st.slot] >= 2)
        if learn.any():
            sl_, x = st.slot[learn], per_op[learn]
            base = self.base_dur[sl_]
            fresh = np.isnan(base)
            d = np.where(fresh, 0.0, x - base)
            # about ``baseline_tau_s`` worth of the group's ops (at least 50) make a baseline
            rate = self.ch_ops[topo_ch[learn]] / cfg.ops_tau_s if topo_ch is not None else 0.0
            span = np.maximum(50.0, rate * cfg.baseline_tau_s)
            up = np.minimum(1.0, st.cnt[learn] / span)
            a = np.where(d < 0, np.maximum(5.0 * up, 0.2), up)
            new = np.where(fresh, x, base + np.minimum(a, 1.0) * d)
            np.put(self.base_dur, sl_, new)  # several blocks of one slot: the last one stands
        self.ncells[: per_slot.shape[0]] += per_slot
        # where a streak of being late starts: the earliest late block after a quiet spell
        fl = np.flatnonzero(st.lateflag)
        if fl.shape[0]:
            order = fl[np.argsort(st.t[fl], kind="stable")]
            slots, idx0 = np.unique(st.slot[order], return_index=True)
            idx = order[idx0]
            quiet = ~self.hot[slots] | np.isnan(self.onset[slots])
            self.onset[slots[quiet]] = st.t[idx[quiet]]
            self.onset_seq[slots[quiet]] = seq_lo[idx[quiet]]

    def _add_rows(
        self,
        st_slot: np.ndarray,
        ids: np.ndarray,
        t0: np.ndarray,
        t: np.ndarray,
        late: np.ndarray,
        dur: np.ndarray,
        cnt: np.ndarray,
        per_slot: np.ndarray,
        spread: bool,
    ) -> None:
        """Add blocks (their slot, newest bucket id, first and last op time, sums) into the ring."""
        cfg = self.cfg
        if spread:
            # a block longer than a bucket (ranks' own blocks may span 64 ops) is spread over the
            # buckets it covers, in proportion to time: all in its last bucket, it would leave most
            # of the ring empty and its slot never judged
            span = t - t0
            long = span > cfg.bucket_s
            if long.any():
                k = np.where(long, np.minimum(ids - np.floor(t0 / cfg.bucket_s).astype(np.int64), _K - 1) + 1, 1)
                # row by row, its buckets newest first: one row of a (rows, most buckets) table
                # each, the cells past a row's own count masked out
                back = np.arange(int(k.max()))
                b2 = ids[:, None] - back
                lo = np.maximum(t0[:, None], b2 * cfg.bucket_s)
                hi = np.minimum(t[:, None], (b2 + 1) * cfg.bucket_s)
                w2 = np.where(long[:, None], np.clip(hi - lo, 0.0, None) / np.maximum(span, 1e-12)[:, None], 1.0)
                cover = back < k[:, None]
                st_slot = np.broadcast_to(st_slot[:, None], cover.shape)[cover]
                ids = b2[cover]
                w = w2[cover]
                late = np.broadcast_to(late[:, None], cover.shape)[cover] * w
                dur = np.broadcast_to(dur[:, None], cover.shape)[cover] * w
                cnt = np.broadcast_to(cnt[:, None], cover.shape)[cover] * w
        pos = ids % _K
        keep = self.bid[pos] == ids  # drop blocks older than the ring
        if not keep.all():
            st_slot, pos = st_slot[keep], pos[keep]
            late, dur, cnt = late[keep], dur[keep], cnt[keep]
        flat = st_slot * _K + pos
        size = self.bl.shape[0] * _K
        # few rows, or a big ring (a 100k-rank job's, with long blocks spread): adding at the rows
        # beats a pass over the whole ring
        if flat.shape[0] * 8 < size or size >= 1 << 20:
            once = per_slot[st_slot] == 1
            one, many = (slice(None), None) if once.all() else (once, ~once)
            f1 = flat[one]
            for arr, x in ((self.bl, late), (self.bd, dur), (self.bo, cnt)):
                a = arr.reshape(-1)
                a[f1] += x[one].astype(np.float32)
                if many is not None:
                    np.add.at(a, flat[many], x[many].astype(np.float32))
        else:
            for arr, x in ((self.bl, late), (self.bd, dur), (self.bo, cnt)):
                arr.reshape(-1)[:] += np.bincount(flat, x, size).astype(np.float32)

    def run_rate_now(self, n_ch: int) -> np.ndarray:
        """Per channel: its op rate as the detection reads it, the count decayed over ``ops_tau_s``
        (to now: low by the lag behind its newest analysed op), and for a group that has run for a
        short while since a pause, that count's share from its run alone over the share a group
        running at one rate all along would have (its ops weighted as the count weights them,
        from its run's first op to its newest). Its count held through the pause what it had
        from the run before, decayed over ``stale_s`` at its end, and read the run after it low
        for seconds: in a job that saves 5 s after every 1.2 s of steps, half what it runs at,
        and a 1.1x straggler's excess a third (unseen-straggler_mild-003, dp32 ``checkpoint~``).
        The run counts from its first block's newest op, that block's ops with what came before
        (a group running one burst a step would otherwise count its first burst over no time),
        once it spans ``_RUN_MIN_BUCKETS``. Only after a pause that ended a brief run (under twice
        ``ops_tau_s``: a job that mostly saves), and once the group had run for ``baseline_warm_s``:
        - after a long run the count had settled, and the first seconds after a save (its ranks back
          from it at different times) read at the run's rate named healthy ranks and nodes in
          pipelines that save every 50 steps (``bench/probe_classes.py`` seeds 61206-61208: 4 -> 11
          false suspects);
        - the run after a slow first step is its ranks settling in: read at its own rate, that named
          healthy ranks (unseen-slow_link-002, tp4pp4dp2 ``first_step~``, rank 11 at 14.5 s; two
          more of tp4pp4dp2 by knock-on effects).
        A long run's reading tends to the plain count's."""
        cfg = self.cfg
        ops = self.ch_ops[:n_ch]
        rate = ops / cfg.ops_tau_s
        # (nan: not read so; ``ch_start`` is the run's first block's newest op)
        span = np.where(np.isfinite(self.ch_pre[:n_ch]), self.ch_new[:n_ch] - self.ch_start[:n_ch], np.nan)
        young = np.flatnonzero(np.nan_to_num(span, nan=-1.0) >= _RUN_MIN_BUCKETS * cfg.bucket_s)
        if young.shape[0]:
            seen = -np.expm1(-span[young] / cfg.ops_tau_s)
            rate[young] = (ops[young] - self.ch_pre[young]) / (cfg.ops_tau_s * seen)
        return rate

    def _recent(
        self, now: float, n: int, collective: np.ndarray, slot_rank: np.ndarray, running: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per slot: median per-op lateness and time inside over its recent buckets, their count,
        and the per-op lateness four in five of those buckets reach (``collective``: per slot,
        whether its group is a collective one; ``slot_rank``: its rank; ``running``: whether its
        group has run within ``stale_s``). Also moves on ``dense`` and ``bridged``."""
        cfg = self.cfg
        ml = np.full(n, np.nan)
        lo_l = np.full(n, np.nan)
        md = np.full(n, np.nan)
        cnt = np.zeros(n, np.int64)
        self.sparse_rate = np.full(n, np.nan)
        self.run_rate = np.full(n, np.nan)
        self.ml_wide = np.full(n, np.nan)
        every = np.argsort(-self.bid)  # ring positions, newest first
        # the window: the newest ``_WIN`` positions; a slot with too few non-empty buckets there
        # is judged over the whole ring if that finds them a second or more apart: a collective
        # group running one burst of ops a step, of steps of a second or longer (a pipeline's
        # sends, in bursts of their schedule's, still wait for enough). Not a group that paused
        # (a checkpoint's save: its buckets before it lie side by side), nor one that has stopped
        # (its newest bucket must be in the window): those keep their last judgement (``pause_s``).
        # Nor a rank with another group that has data but is not judged (a pipeline's sends; a
        # rare collective, for the 6 s its op stays in the window): the victim tests would lack
        # whom it waited on there, and name it (probe seed 6401, tp2pp2dp8)
        order = every[:_WIN][self.bid[every[:_WIN]] * cfg.bucket_s >= now - cfg.bucket_s * _WIN - cfg.stale_s]
        if not order.shape[0]:
            return ml, md, cnt, lo_l
        # only slots with data in the ring (most slots of a big job's default group are idle)
        active = np.flatnonzero(self.last_bid[:n] >= self.bid[order].min())
        filled, side, runs = np.zeros(n, np.int64), np.zeros(n, bool), np.zeros(n, bool)
        self._recent_rows(active, order, ml, md, cnt, lo_l, filled=filled, side=side, runs=runs)
        on = active[running[active]]
        self.dense[on] = np.where(filled[on] >= _DENSE, 2, np.where(side[on], 1, 0))
        self.runs[on] = runs[on]
        wide = every[self.bid[every] * cfg.bucket_s >= now - cfg.bucket_s * _K - cfg.stale_s]
        short = active[(cnt[active] < RECENT_BUCKETS) & collective[active]]
        if short.shape[0] and wide.shape[0] > order.shape[0]:
            was = ml[short], md[short], cnt[short], lo_l[short]
            self._recent_rows(short, wide, ml, md, cnt, lo_l, _SPARSE)
            blind = active[cnt[active] < RECENT_BUCKETS]
            back = short[np.isin(slot_rank[short], slot_rank[blind]) & np.isfinite(self.sparse_rate[short])]
            if back.shape[0]:
                i = np.searchsorted(short, back)
                ml[back], md[back], cnt[back], lo_l[back] = (x[i] for x in was)
                self.sparse_rate[back] = np.nan
        # a pipeline's sends and receives with too few buckets in the window (a four-stage
        # pipeline at 10 ops a second carries an op every two or three buckets on each): the per-op
        # lateness four in five of the ring's newest RECENT_BUCKETS buckets with ops reach, for the
        # slow-stage test's late sign only (``late_at_stages``). Judged like any slot, they moved
        # the victim tests and the stage test's lines, set with them unjudged (docs/decisions.md).
        # Not their median: read over that many buckets, a run of GC pauses stayed in it for
        # seconds after it ended, and a healthy stage's hold ran on to a false slow node
        thin = active[(cnt[active] < RECENT_BUCKETS) & ~collective[active] & running[active]]
        if thin.shape[0] and wide.shape[0] > order.shape[0]:
            c_w, spare = np.zeros(n, np.int64), np.full(n, np.nan)
            self._recent_rows(thin, wide, spare, spare.copy(), c_w, self.ml_wide)
            self.ml_wide[c_w < RECENT_BUCKETS] = np.nan
        # a slot whose group paused (a checkpoint's save) and has run again since: its newest buckets
        # before the pause count with those after it, as if the pause had not been (the group's own
        # clock), until it has RECENT_BUCKETS after it. Waiting for those, a straggler that began
        # during a save was judged two seconds into the run after it, and named a second or two later
        full = active[cnt[active] >= RECENT_BUCKETS]
        self.bridged[full] = False
        self.short[full] = False
        back = on[(cnt[on] < RECENT_BUCKETS) & self.bridged[on] & collective[on]]
        if back.shape[0] and wide.shape[0] > order.shape[0]:
            # (a group bridged for its short runs: its op rate is what it runs at, not its count
            # decayed over the pauses, which are most of its time)
            rr = np.full(n, np.nan)
            self._recent_rows(back, wide, ml, md, cnt, lo_l, run_rate=rr)
            brief = back[self.short[back]]
            self.run_rate[brief] = rr[brief]
        return ml, md, cnt, lo_l

    def _recent_rows(
        self,
        active: np.ndarray,
        order: np.ndarray,
        ml: np.ndarray,
        md: np.ndarray,
        cnt: np.ndarray,
        lo_l: np.ndarray,
        apart: float = 0.0,
        filled: np.ndarray | None = None,
        side: np.ndarray | None = None,
        runs: np.ndarray | None = None,
        run_rate: np.ndarray | None = None,
    ) -> None:
        """``_recent`` for these rows over these ring positions (newest first), into the arrays; with
        ``apart``, only rows whose buckets taken lie evenly, their median gap that many buckets or
        more, and those rows' op rates into ``sparse_rate``; ``filled``: how many of the positions
        have ops, per row; ``side``: whether five or more do and lie side by side; ``runs``: whether
        two or more do, all side by side; ``run_rate``: the ops per second of the fullest bucket
        taken."""
        inf = np.float32(np.inf)
        ids = self.bid[order]
        # a block of rows at a time: the same arithmetic, but its intermediates stay in cache
        for lo in range(0, active.shape[0], _ROWS):
            rows = active[lo : lo + _ROWS]
            ops = np.take(self.bo[rows], order, axis=1)
            has = ops > 0
            if filled is not None:
                filled[rows] = np.count_nonzero(has, axis=1)
            if side is not None:
                # five or more, side by side (a run of steps since the group last paused, no empty
                # bucket between)
                n_has = np.count_nonzero(has, axis=1) if filled is None else filled[rows]
                first = np.argmax(has, axis=1)
                last = has.shape[1] - 1 - np.argmax(has[:, ::-1], axis=1)
                side[rows] = (n_has >= RECENT_BUCKETS) & (last - first + 1 == n_has)
                if runs is not None:
                    runs[rows] = (n_has >= 2) & (last - first + 1 == n_has)
            # the newest non-empty buckets, at least RECENT_BUCKETS of them and at least _MIN_OPS ops (a group
            # that runs an op a second is judged over several of its steps, not over one)
            before_b: np.ndarray = np.cumsum(has, axis=1, dtype=np.int32) - has
            before_o = np.cumsum(ops, axis=1) - ops
            take = has & ((before_b < RECENT_BUCKETS) | (before_o < _MIN_OPS))
            c = take.sum(axis=1)
            if apart:
                # evenly: the bursts of a long step, not the first buckets after a checkpoint's save
                # and the last ones before it (a median gap of one bucket), nor a group's last bursts
                # before it stopped (one gap many times the others)
                oldest = take.shape[1] - 1 - np.argmax(take[:, ::-1], axis=1)
                span = ids[np.argmax(take, axis=1)] - ids[oldest]
                got = -np.sort(np.where(take, -ids[None, :], np.iinfo(np.int64).max), axis=1)
                gaps = (got[:, :-1] - got[:, 1:]).astype(np.float64)
                gaps[np.arange(gaps.shape[1])[None, :] >= (c - 1)[:, None]] = np.nan
                # (the wide window has two positions or more; a row with under two buckets has no
                # gap: nan, and fails the test)
                srt = np.sort(gaps, axis=1)  # nan last
                k, at = np.maximum(c - 1, 1), np.arange(srt.shape[0])
                g_med = 0.5 * (srt[at, (k - 1) // 2] + srt[at, k // 2])
                g_max = srt[at, k - 1]
                ok = (c >= RECENT_BUCKETS) & (g_med >= apart) & (g_max <= 2.0 * g_med + 1.0)
                rows, take, ops, has, c = rows[ok], take[ok], ops[ok], has[ok], c[ok]
                span, oldest = span[ok], oldest[ok]
                # its op rate: the ops of all its bursts but the oldest over the time they span (a
                # count decayed over ``ops_tau_s`` swings several fold between bursts seconds apart)
                run = np.sum(np.where(take, ops, 0.0), axis=1) - ops[np.arange(ops.shape[0]), oldest]
                self.sparse_rate[rows] = run / (span * self.cfg.bucket_s)
            if run_rate is not None:
                # (a run's first and last buckets are partly empty; its fullest one is not)
                run_rate[rows] = np.max(np.where(take, ops, 0.0), axis=1) / self.cfg.bucket_s
            safe = np.where(has, ops, np.float32(1.0))
            ml[rows], lo_l[rows] = _median_taken(np.where(take, np.take(self.bl[rows], order, axis=1) / safe, inf), c)
            md[rows] = _median_taken(np.where(take, np.take(self.bd[rows], order, axis=1) / safe, inf), c)[0]
            cnt[rows] = c

    def analyse(
        self,
        now: float,
        dt: float,
        topo: Topology,
        keep: set[int],
        frozen_ch: np.ndarray | None = None,
        ch_excess: np.ndarray | None = None,
    ) -> dict[int, Straggler]:
        """Hot slots, baselines moved on, and the ranks at the root of what is hot.

        Args:
            now: server time.
            dt: seconds since the previous call.
            topo: the job's topology.
            keep: ranks already reported: they stay hot on weaker evidence (hysteresis).
            frozen_ch: channels whose transfers look slow: their slots' baselines must not learn.
            ch_excess: per channel, seconds per second its slow transfers cost (what they can explain).
        """
        cfg = self.cfg
        n = topo.n_slots
        self._ensure(n, topo.n_channels)
        # the op rate the detection works with is the count decayed to now; a block is analysed
        # once every member has sent it, a second or so after its ops ran, so that reads the rate
        # low by the lag (exp(-1/3): a quarter). The thresholds were set against it and the tests
        # of who is a victim weigh it against shares measured alike, so it stays; what a suspect
        # costs the job (its slowdown, and the hold that depends on it) is scaled back by ``lag_k``
        # (into ``imposed``) to ops per second over the ``ops_tau_s`` before the group's newest analysed op
        lag = np.clip(now - self.ch_new[: topo.n_channels], 0.0, cfg.stale_s)
        lag_k = np.exp(lag / cfg.ops_tau_s)
        ops_rate = self.run_rate_now(topo.n_channels)
        rate = ops_rate[topo.slot_ch]
        collective = topo.ch_parent[topo.slot_ch] < 0
        running = now - self.ch_new[topo.slot_ch] <= cfg.stale_s  # per slot: its group ran within ``stale_s``
        # per op: median lateness and time inside
        ml, md, nb, lo_l = self._recent(now, n, collective, topo.slot_rank, running)
        # a group that runs a burst of ops every second or more (``sparse_rate``), or one judged
        # across the pauses between its short runs (``run_rate``): its rate is what its recent
        # bursts or runs ran at (the members' mean), as of now, not a decayed count. For the
        # short runs that count counts ``stale_s`` of every pause, and read a sixth of their rate
        # in a dp24 job that saves 5 s after every half second of steps (15 against 100 ops a second)
        n_ch = topo.n_channels
        for per_slot in (self.sparse_rate, self.run_rate):
            got = np.isfinite(per_slot)
            if got.any():
                n_got = np.bincount(topo.slot_ch[got], minlength=n_ch)
                ch_rate = np.bincount(topo.slot_ch[got], per_slot[got], n_ch) / np.maximum(n_got, 1)
                rate = np.where(n_got[topo.slot_ch] > 0, ch_rate[topo.slot_ch], rate)
                lag_k = np.where(n_got > 0, 1.0, lag_k)
        has = nb >= RECENT_BUCKETS
        med_lop = self._lower_median(np.nan_to_num(ml, nan=np.inf), topo)
        sl = slice(0, n)
        warm = self.base_age[sl] >= cfg.baseline_warm_s
        # normal lateness per op: its own baseline, or (collectives) the group's lower median now
        ref_lop = np.fmin(
            np.where(warm, self.base_late[sl], np.nan), np.where(collective & np.isfinite(med_lop), med_lop, np.nan)
        )
        self.ref_lop = ref_lop
        late = ml * rate  # seconds per second
        dur = md * rate
        ex_late = (ml - ref_lop) * rate
        ex_dur = (md - self.base_dur[sl]) * rate
        # one rank's own fluctuation counts at most ``noise_cap_k`` times its group's usual one (the
        # lower median of the members'): a rank that is erratic, or late, from the start must not
        # set its own yardstick
        noise = self.noise[sl]
        g_noise = self._lower_median(np.nan_to_num(noise, nan=np.inf), topo)
        cap = cfg.noise_cap_k * np.fmax(g_noise, cfg.min_effect / cfg.noise_k)
        noise = np.where(collective & np.isfinite(g_noise), np.fmin(noise, cap), noise)
        # the excess in units of the slot's usual fluctuation (never finer than the effect that matters):
        # its own, learned over time, and its group's now (the lower median of the members' excess,
        # which a straggler or a slow half of the group does not raise)
        cross = self._lower_median(np.nan_to_num(np.abs(ex_late), nan=np.inf), topo)
        cross = np.where(collective & np.isfinite(cross), cross, 0.0)
        floor = cfg.min_effect / cfg.noise_k
        scale = np.fmax(np.fmax(floor, np.nan_to_num(noise, nan=0.0)), cross)
        # ...and never finer than its group's usual fluctuation, the upper median of the members'
        # (in a group of three or more, which one straggler does not move): the members of one
        # group see the same uneven steps, and a rank whose own was learned low (in the job's
        # first seconds, or held back while its evidence was open) named the chance run of a few
        # slow steps of its own (tp4dp4 with uneven steps, `data+`: rank 9 named at 24 s, its
        # 0.010 against its mates' 0.015-0.043). Not in a pair, where that is the other member's
        # alone (a 1.3x straggler of tp2pp4dp4 `data+` was missed, its mate's twice its own)
        g_up = self._lower_median(np.nan_to_num(noise, nan=-np.inf), topo, upper=True)
        trio = collective & (topo.ch_size[topo.slot_ch] >= 3) & np.isfinite(g_up)
        scale = np.where(trio, np.fmax(scale, g_up), scale)
        scale = np.where(self.noise_age[sl] < cfg.noise_warm_s, np.fmax(scale, 2 * floor), scale)
        scale = np.where(collective, scale, cfg.p2p_k * scale)
        thr = cfg.noise_k * scale
        z = np.nan_to_num(ex_late / scale, nan=0.0)
        # a slot is judged once it has history: start-up and the first steps are not faults
        grown_up = (self.ncells[sl] >= cfg.warm_cells) & (now - self.first_data[sl] >= cfg.baseline_warm_s)
        mature = has & grown_up
        waiting = grown_up & ~has  # a group that paused, or whose bursts of ops are short
        # a slot whose group went quiet (no op analysed for ``stale_s``: a checkpoint's save, an
        # evaluation) since it was last judged keeps that judgement for ``pause_s`` while it lacks
        # recent buckets: a pause is no evidence either way, and in a job that pauses often a
        # straggler started from nothing after each pause. A group that runs an op a step and lacks
        # a bucket now and then has not paused (kept, such a slot carried a GC pause into a suspect)
        judged = self.judged[sl]
        judged[mature] = now
        gap = self.gap[sl]
        gap |= ~has & (now - self.ch_new[topo.slot_ch] > cfg.stale_s)
        # (a group that runs ops often: not the quiet seconds between the bursts of a group that
        # runs one a step. One known only by a short run side by side, once its slot has learned
        # its fluctuation for half of ``noise_warm_s``: a job's slow first step left its groups
        # quiet after such runs, and with them bridged across it the straggler of
        # unseen-slow_link_and_straggler-002, 27 s in, was missed; not traced further. Not the
        # eight of ten: so gated, they came 0.5-5.5 s later on ``bench/probe_saves.py``)
        half_learned = self.noise_age[sl] >= 0.5 * cfg.noise_warm_s
        often = gap & ((self.dense[:n] == 2) | ((self.dense[:n] == 1) & half_learned))
        # A group whose runs between pauses are too short for five buckets with ops (a job that
        # saves every few dozen steps of 10-20 ms: half a second of ops, then seconds of saving)
        # is otherwise never judged at all: one that ran a short run side by side is bridged too,
        # and judged at the rate its runs ran at. Pure data-parallel jobs at 50-100 ops a second
        # that save every 25-40 steps: their stragglers of 1.1-1.4x were missed (``dp16`` at
        # 100/s, seed 2), or named after 17-29 s. Not one judged within ``pause_s`` (at a burst's
        # rate, the fullest bucket, a pipeline's data-parallel group named its stage's neighbour
        # a false node: tune-straggler_node-006), unless its last run was itself too short (four
        # buckets or fewer): so gated, a group whose runs were of four and five buckets was judged
        # at one run in three, its 1.5x straggler of dp16 at 100/s a root 4.6 s after its onset
        # and never named in the 15 s it lasted, late in every run (``bench/probe_short_runs.py``
        # seed 91, straggler_ends-003)
        stale = (~(now - judged <= cfg.pause_s) | (self.dense[:n] == 0)) & grown_up  # never judged (nan): True
        # ...while the whole job is quiet (a save, an evaluation), not the seconds between one
        # step's burst and the next while other groups run (a pipeline of 2-3 s steps: its
        # data-parallel bursts so judged, at a burst's rate, read a 1.03x rank's cost 1.9 times
        # too high and lost a 1.07x one, ``bench/probe_steps.py`` seeds 345 and 364)
        seen = self.ch_new[: topo.n_channels]
        stale &= bool(np.isfinite(seen).any()) and now - float(seen.max()) > cfg.stale_s
        short = gap & stale & self.runs[:n] & ~self.bridged[:n]
        self.short[:n] |= short
        self.bridged[:n] |= often | short
        gap[mature] = False
        paused = ~has & gap & (now - judged <= cfg.pause_s)  # never judged (nan): False
        # ...and so does a collective slot one bucket short of its median while its group runs, if
        # judged within ``stale_s`` with just enough: a group that runs one burst of ops a step, of
        # steps a little under the whole ring's 1.2 s apart (``_SPARSE``), has four or five in the
        # window, and its evidence started from nothing at every four. A 1.3x straggler of
        # tp8pp4dp2, of 0.9 s steps, reached a third of ``cusum_h`` at each five and was never
        # named; tune-two_stragglers-007's second (tp8pp4dp4) neither. Its rank's hold counts only
        # the mild one then (``between``). Not a group that had more when judged: one rank's GC
        # pause thinned a data-parallel group of tp8dp8 from six bursts to four, and its lateness,
        # kept, named the rank (``bench/probe_healthy.py --wide``, seed 5051); nor one whose buckets
        # lay side by side then (``dense``: a data-parallel group of 3 s steps fills two buckets a
        # burst; a healthy member kept moved the victim tests and a 1.3x rank was excused,
        # ``bench/probe_steps.py`` seed 364). Nor a slot that was not late in four of its five
        # buckets then (``steady``): kept open, the evidence of healthy members froze their ranks'
        # baselines (``busy``) and moved the victim tests (a second straggler of tp2pp2dp8 at 0.8 s
        # steps named 18 s later, tune-two_stragglers-004)
        judged_nb = self.nb_judged[:n]
        between = grown_up & ~has & (nb == RECENT_BUCKETS - 1) & (judged_nb == RECENT_BUCKETS)
        between &= collective & running & (now - judged <= cfg.stale_s)
        was_steady = np.zeros(n, bool)
        was_steady[: min(n, self.steady.shape[0])] = self.steady[:n]
        between &= was_steady
        judged_nb[mature] = np.where(self.dense[:n][mature] == 0, nb[mature], -1)
        paused |= between
        imposed = ex_late * lag_k[topo.slot_ch]
        # late in four in five of its recent buckets, not three: a straggler is late at every step,
        # a rank with a cluster of GC pauses at a few (see ``Straggler.steady``)
        steady = np.nan_to_num((lo_l - ref_lop) * rate >= 0.5 * thr, nan=False).astype(bool)
        m = min(n, self.ex_late.shape[0])
        if paused[:m].any():
            p = np.flatnonzero(paused[:m])
            ex_late[p], thr[p], late[p], imposed[p] = self.ex_late[p], self.thr[p], self.late_rate[p], self.imposed[p]
            steady[p] = self.steady[p]
        prev_hot = self.hot[sl] & paused
        # sequential test (CUSUM): evidence adds up while the excess stays above half the threshold,
        # so a large fault is named at once and a mild one in a noisy group takes longer
        # evidence counts once: a slot adds only as much time as it has new buckets since last time
        # (a slot's newest bucket with ops is its last one while that is still in the ring, else none)
        last = self.last_bid[:n]
        newest = np.where(self.bid[last % _K] == last, last, -(2**62))
        prev = self.newest[:n]
        fresh_s = np.where(prev > -(2**61), (newest - prev) * cfg.bucket_s, dt)
        dt_eff = np.clip(fresh_s, 0.0, dt)
        # ...except after a wait for enough recent buckets (a pause, a short burst of ops): the
        # buckets with ops that came in meanwhile count (as far as the median spans), or a job that
        # pauses every few steps never adds up enough. Buckets with ops, not the time they span: a
        # group that runs an op a step has empty buckets between, and they are no evidence
        was_waiting = np.zeros(n, bool)
        was_waiting[: min(n, self.waiting.shape[0])] = self.waiting[:n]
        back = np.flatnonzero(was_waiting & mature)
        if back.shape[0]:
            new_b = (self.bid[None, :] > prev[back, None]) & (self.bid[None, :] <= newest[back, None])
            got = np.count_nonzero(new_b & (self.bo[back] > 0), axis=1)
            dt_eff[back] = np.minimum(got, RECENT_BUCKETS) * cfg.bucket_s
        self.newest[:n] = np.where(waiting, prev, newest)
        self.waiting = waiting
        k = 0.5 * cfg.noise_k
        cs = self.cusum[sl]
        # ...and when a slot's evidence opens far over its line (the median of its window at twice
        # its threshold, late in four of its five buckets: ``steady``), at least three of the
        # window's buckets are that late, and they count, not only the newest: a 2x straggler's
        # evidence took another analysis to add up to the short hold's twice ``cusum_h``, and it
        # was named 3.6 s after its onset, 3.1 s so. Not a mild excess: counted at its opening,
        # the evidence of a rank late for a few uneven steps (``data+``) held for a false
        # straggler (7 more in the 1,200 healthy jobs of ``probe_healthy.py --wide``); nor before
        # the slot's own fluctuation is learned (``noise_warm_s``), as for the short hold
        opens = mature & (cs == 0) & (ex_late >= 2 * thr) & steady & ~was_waiting
        opens &= self.noise_age[sl] >= cfg.noise_warm_s
        dt_eff[opens] = np.maximum(dt_eff[opens], (RECENT_BUCKETS + 1) // 2 * cfg.bucket_s)
        cap = 3 * cfg.cusum_h
        grown = np.clip(cs + dt_eff * (np.minimum(z, 4 * cfg.noise_k) - k), 0.0, cap)
        cs[:] = np.where(mature, grown, np.where(paused, cs, 0.0))
        kept = np.zeros(n, bool)
        if keep:
            kept = np.isin(topo.slot_rank, np.fromiter(keep, np.int64, len(keep)))
        on = (cs >= cfg.cusum_h) & (ex_late >= thr)
        # ...and evidence at its cap (three times what makes a root: over half the threshold for
        # many seconds), late in four of five buckets, is hot at three quarters of the threshold
        # while no straggler is reported in the job: a 1.1x rank of tp8pp2dp2 that saves every 40
        # steps swung between 0.8 and 1.1 of its threshold, out of the roots for seconds at a time,
        # and its 4 s hold never ran out (tune-straggler_mild-002). Not beside a reported straggler,
        # whose victims wait on it by about as much (with neither gate, a slow node's next stage
        # was named a second node: tune-straggler_node-006). Nor for a rank with a node-mate as
        # late (evidence open, at three quarters of its threshold or more): that is its node's
        # lateness, for the node tests (a 1.2x node of tp8dp8, its ranks about their thresholds,
        # was named as the one rank whose evidence had reached the cap: ``bench/probe_nodes.py``
        # seed 410)
        if not keep:
            near = ex_late >= _AS_LATE * thr
            sat = (cs >= cap) & near & steady
            if sat.any():
                rank = topo.slot_rank[:n]
                node_of = topo.node_of[: topo.world]  # -1: not known yet
                alike = np.zeros(topo.world, bool)  # per rank
                alike[rank[as_late(cs, ex_late, thr)]] = True
                per_node = np.bincount(node_of[alike & (node_of >= 0)], minlength=len(topo.node_names))
                node = node_of[rank]
                sat &= (node < 0) | (per_node[np.maximum(node, 0)] - alike[rank] == 0)
            on |= sat
        stay = kept & (cs > 0) & (ex_late >= 0.5 * thr)
        hot = (mature & np.nan_to_num(on | stay, nan=False).astype(bool)) | prev_hot
        self.hot[sl] = hot
        self.paused = paused
        self.between = between
        # baselines learn only from slots that look normal, once past the first blocks
        calm = (
            has
            & ~hot
            & (cs == 0)
            & ~(np.nan_to_num(ex_late, nan=0.0) >= thr)
            & (self.ncells[sl] >= cfg.warm_cells // 2)
        )
        calm &= now - self.first_data[sl] >= 2 * cfg.ops_tau_s  # op rates settled
        # nothing a rank does while it is (or waits on) a suspect is normal: freeze all its baselines
        busy = (cs > 0) | hot
        if frozen_ch is not None and frozen_ch.shape[0]:
            busy |= frozen_ch[topo.slot_ch]
        busy_rank = np.zeros(topo.world, bool)
        busy_rank[topo.slot_rank[busy]] = True
        self.busy[sl] = busy_rank[topo.slot_rank]
        calm &= ~self.busy[sl]
        age = self.base_age[sl]
        a = self._weight(age, dt)
        self._follow(self.base_late[sl], ml, calm & np.isfinite(ml), a)
        age[calm] += dt
        self._learn_wide(now, dt, topo, rate, grown_up)
        # the usual fluctuation of the excess: its spread around the slot's own running level (an
        # exponentially weighted mean and variance), learned from every judged sample but hot ones
        # (learning only from calm samples would never see the fluctuations that matter), outliers
        # clipped. Around the level, not the root mean square of the excess itself: a rank that is
        # slow from (near) the start has a large, steady excess, and that offset is the very thing
        # to find — counted as fluctuation it would become its own yardstick and never stand out.
        nz, lv, n_age = self.noise[sl], self.level[sl], self.noise_age[sl]
        ok = has & ~hot & np.isfinite(ex_late) & (self.ncells[sl] >= cfg.warm_cells // 2)
        ok &= now - self.first_data[sl] >= 2 * cfg.ops_tau_s
        first = ok & np.isnan(nz)
        lv[first] = ex_late[first]
        nz[first] = 0.0
        upd = ok & ~first
        # weights as the baseline's (``a``): while a slot has had no calm spell (start-up, or a rank
        # slow from the start) the newest sample stands alone, so start-up swings are not kept
        d = np.clip(ex_late[upd] - lv[upd], -3.0 * thr[upd], 3.0 * thr[upd])
        au = a[upd]
        # while a slot's evidence is open (its CUSUM above zero) its samples are held back: a
        # straggler's first seconds, before its evidence adds up, are no fluctuation to learn (they
        # doubled its threshold in a few seconds, and it dropped out of the roots). They are learned
        # once the evidence closes without the rank being named (a cluster of GC pauses is learned,
        # a few seconds late), and dropped if it was named. At most ``noise_hold_s``: a rank a
        # little slower than its group for good (under the threshold, over half of it) keeps its
        # evidence open, and its fluctuation must not stop being learned for the rest of the job.
        # Nothing is held while transfers somewhere in the job are slow: the lateness then shifts
        # as their consequence, far from the slow channels too (learned, it named no straggler)
        pend = self.pend[:n]
        slow_net = frozen_ch is not None and bool(frozen_ch[: topo.n_channels].any())
        # A group of a burst a step (one judged over the whole ring, ``sparse_rate`` set) holds back
        # its samples over its threshold the same way, its evidence open or not: its noise is
        # learned from six steps on, it is judged from a dozen (``warm_cells`` ops: seconds to
        # minutes), and its evidence adds up one burst at a time; a straggler that began in between
        # taught it its own lateness (dp16 at 2 s steps: a 1.3x rank's threshold 0.06 -> 0.25 s/s
        # in 8 s; a 1.2x tp8dp4 node at 2 s steps named 28.5 s after its onset, 17 s with the hold)
        young = np.isfinite(self.sparse_rate[:n]) & (ex_late >= thr)
        held = ((cs[upd] > 0) | young[upd]) & (not slow_net)
        iu = np.flatnonzero(upd)
        ih = iu[held]
        pend[ih, 0] += au[held]
        pend[ih, 1] += au[held] * d[held]
        pend[ih, 2] += au[held] * d[held] ** 2
        pend[ih, 3] += dt
        go = ~held
        lv[iu[go]] += au[go] * d[go]
        nz[iu[go]] = np.sqrt((1.0 - au[go]) * (nz[iu[go]] ** 2 + au[go] * d[go] ** 2))
        closed = (((cs == 0) & ~young) | slow_net | (pend[:, 3] >= cfg.noise_hold_s)) & ~hot & (pend[:, 0] > 0)
        commit = np.flatnonzero(closed & ~kept & np.isfinite(nz))
        if commit.shape[0]:
            pa = np.minimum(pend[commit, 0], 1.0)
            lv[commit] += pend[commit, 1]
            nz[commit] = np.sqrt(np.maximum((1.0 - pa) * nz[commit] ** 2 + pend[commit, 2], 0.0))
        pend[closed] = 0.0
        n_age[ok] += dt
        self.late_rate, self.dur_rate, self.ex_late, self.ex_dur = late, dur, ex_late, ex_dur
        self.imposed = imposed
        self.thr = thr
        self.steady = steady
        wd, wo = self._ring_sum(self.bd, n), self._ring_sum(self.bo, n)
        extra = self._learn_extra(now, dt, topo, wd, wo, rate, has, rate * lag_k[topo.slot_ch], slow_net)
        out = self._roots(hot, topo, frozen_ch, ch_excess, wo, extra, keep)
        self._slow_stages(dt, topo, out, frozen_ch, keep)
        self._lean_nodes(dt, topo, out, frozen_ch, keep, grown_up)
        self._prev_roots = out
        return out

    def _learn_extra(
        self,
        now: float,
        dt: float,
        topo: Topology,
        wd: np.ndarray,
        wo: np.ndarray,
        rate: np.ndarray,
        has: np.ndarray,
        rate_new: np.ndarray,
        slow_net: bool,
    ) -> np.ndarray:
        """Per slot: seconds inside its ops over the window beyond what is usual for it; learns the usual.

        The per-op baseline is a lower envelope (``base_dur``), so a slot spends some time over it
        even when nothing is wrong. In a pipeline's sends and receives that is large and steady: a
        stage waits there for the schedule's bubbles, every step, and counted as waiting on
        somebody it made every straggler of a deep pipeline look like a victim. So for point-to-
        point slots the usual amount is learned, while the slot's rank, its group-mates and their
        other groups are calm (a victim of a suspect must not learn its waiting as usual), and
        only what exceeds it counts. In collective groups the excess over the lower envelope is
        the waiting for whoever came last, and it stays whole: jitter there is what makes a
        rank that is late by chance look like the victim it is.

        The usual excess is learned over the envelope of its time, and lags it: after a slow
        first step the envelope falls fast (drops five times faster than rises) and the excess
        follows at ``baseline_tau_s``, so until it has caught up the slot reads waits it did not
        do. Where a slot's envelope sits over twice its parallel slots' (``_far_envelope``), it
        fell late and the lag is large: its usual excess is read at the envelope as it is now,
        from the usual time inside and ops per window (a 1.5x middle stage of tp4pp4dp2
        `first_step~`, its receive's envelope 6 ms against its mates' 1.3 ms when its fault froze
        it, read 0.4 s in 4 s of waiting that it did not do, and the victim test excused it
        throughout). Elsewhere the lagging excess stays: read afresh everywhere, healthy ranks of
        pipelines with uneven steps (`data+`), their envelopes near their mates', lost the
        excuse it gave and were named; nor while transfers anywhere in the job are slow (a first
        stage upstream of a slow link was named: docs/decisions.md).

        Also each rank's share of wall-clock inside ops against its usual, twice: as the victim
        test reads it (``d_in``: over ``_WIN``, at the op rates decayed to now, which its lines
        were tuned on) and as the slow-stage test does (``stage_in``). That one is read over
        ``_STAGE_WIN``, its ends weighted down over ``_STAGE_RAMP`` buckets, at the op rates as
        of each group's newest analysed op (``rate_new``). Over the fixed 4 s window a stage's
        share swung with where the window's edges fell in its steps (a stage waits at its sends
        at one point of each step) and with the analysis's lag behind the sends: in a quiet
        tp2pp4dp4 job at 30/s, each node's change from one analysis to the next had a standard
        deviation of 0.03-0.06 against a line of 0.02, and the last stage of such healthy jobs
        was named (4 of 40). Read so, 0.011-0.014.
        """
        cfg = self.cfg
        n = topo.n_slots
        extra = np.clip(np.nan_to_num(wd - self.base_dur[:n] * wo, nan=0.0), 0.0, None)
        busy = self.busy[:n]
        frozen_ch = np.bincount(topo.slot_ch[busy], minlength=topo.n_channels) > 0
        frozen = frozen_ch[topo.slot_ch]
        frozen_rank = np.zeros(topo.world, bool)
        frozen_rank[topo.slot_rank[frozen | busy]] = True
        sl = slice(0, n)
        p2p = topo.ch_parent[topo.slot_ch] >= 0
        settled = now - self.first_data[sl] >= max(2 * cfg.ops_tau_s, _WIN * cfg.bucket_s)  # nan: False
        learn = has & p2p & ~frozen_rank[topo.slot_rank] & settled
        # per slot: its share of wall-clock inside its group's ops, now against its usual (while
        # calm); a rank's sum over its slots is its share inside any op. As a share of wall-clock:
        # the ring's newest buckets are still filling, so the time it covers is not its length but
        # what its ops took at the groups' op rates
        ops = np.bincount(topo.slot_rank, wo, topo.world)
        cover = ops / np.maximum(np.bincount(topo.slot_rank, rate, topo.world), 1e-9)
        ok_r = cover >= cfg.bucket_s * RECENT_BUCKETS
        share = wd / np.maximum(cover, 1e-9)[topo.slot_rank]
        r_has = np.zeros(topo.world, bool)
        r_has[topo.slot_rank[has]] = True
        r_learn = r_has & ~frozen_rank & ok_r & (np.bincount(topo.slot_rank[settled], minlength=topo.world) > 0)
        self.in_age = _grow(self.in_age, topo.world, 0.0)
        i_age = self.in_age[: topo.world]
        ra = self._weight(i_age, dt)
        s_learn = r_learn[topo.slot_rank]
        u_sl = self.usual_share[sl]
        first_s = s_learn & np.isnan(u_sl)
        u_sl[first_s] = share[first_s]
        upd_s = s_learn & ~first_s
        u_sl[upd_s] += ra[topo.slot_rank[upd_s]] * (share[upd_s] - u_sl[upd_s])
        wd_s, wo_s = self._ring_wsum(self.bd, n, _STAGE_W), self._ring_wsum(self.bo, n, _STAGE_W)
        cover_s = np.bincount(topo.slot_rank, wo_s, topo.world) / np.maximum(
            np.bincount(topo.slot_rank, rate_new, topo.world), 1e-9
        )
        share_s = wd_s / np.maximum(cover_s, 1e-9)[topo.slot_rank]
        u_st = self.usual_stage[sl]
        self.stage_in_age = _grow(self.stage_in_age, topo.world, 0.0)
        s_age = self.stage_in_age[: topo.world]
        rs = self._weight(s_age, dt)
        first_st = s_learn & np.isnan(u_st)
        upd_st = s_learn & ~first_st
        u_st[first_st] = share_s[first_st]
        u_st[upd_st] += rs[topo.slot_rank[upd_st]] * (share_s[upd_st] - u_st[upd_st])
        s_age[r_learn] += dt
        d_st = np.where(np.isfinite(u_st) & ok_r[topo.slot_rank], share_s - np.nan_to_num(u_st, nan=0.0), 0.0)
        self.stage_in = np.where(ok_r, np.bincount(topo.slot_rank, d_st, topo.world), np.nan)
        # the job's ranks, most of them, far under their usual: it was learned on a level the job has
        # left (a slow first step's waits, 1.35-1.48 of wall-clock against 0.5 after it), and the
        # nodes read apart by what each stage waited then for the rest of the job. Learned again
        known_in = self.stage_in[np.isfinite(self.stage_in)]
        if 2 * known_in.shape[0] > topo.world and float(np.median(known_in)) < -cfg.stage_restart:
            if np.isnan(self.stage_restart_at):
                # (once the window the share is read over, ``_STAGE_WIN`` buckets, has left that level)
                self.stage_restart_at = now + _STAGE_WIN * cfg.bucket_s
        self.stage_restarted = bool(now >= self.stage_restart_at)
        if self.stage_restarted:
            self.stage_restart_at = np.nan
            # (from the share as it reads now: while the ranks' evidence is open nothing is learned,
            # and a usual started from nothing left the test blind for the rest of the job)
            u_st[:] = np.where(ok_r[topo.slot_rank], share_s, np.nan)
            s_age[:] = 0.0
            self.stage_in = np.full(topo.world, np.nan)
        i_age[r_learn] += dt
        known = np.isfinite(u_sl)
        self.usual_in = np.where(
            np.bincount(topo.slot_rank, known, topo.world) > 0,
            np.bincount(topo.slot_rank, np.where(known, u_sl, 0.0), topo.world),
            np.nan,
        )
        self.d_slot = np.where(known & ok_r[topo.slot_rank], share - np.nan_to_num(u_sl, nan=0.0), 0.0)
        self.d_in = np.where(ok_r, np.bincount(topo.slot_rank, self.d_slot, topo.world), np.nan)
        u_ex, u_wd, u_wo, age = self.usual_extra[sl], self.usual_wd[sl], self.usual_wo[sl], self.extra_age[sl]
        a = self._weight(age, dt)
        first = learn & np.isnan(u_wd)
        u_ex[first], u_wd[first], u_wo[first] = extra[first], wd[first], wo[first]
        upd = learn & ~first
        u_ex[upd] += a[upd] * (extra[upd] - u_ex[upd])
        u_wd[upd] += a[upd] * (wd[upd] - u_wd[upd])
        u_wo[upd] += a[upd] * (wo[upd] - u_wo[upd])
        age[learn] += dt
        # the usual excess over the per-op baseline: at the baseline as it is now where that
        # baseline sits far above its parallel slots' (above), else as learned over its past
        far = self._far_envelope(topo, n) if not slow_net else np.zeros(n, bool)
        usual = np.where(far, u_wd - self.base_dur[:n] * u_wo, u_ex)
        return np.where(p2p, np.clip(extra - np.nan_to_num(usual, nan=0.0), 0.0, None), extra)

    def _far_envelope(self, topo: Topology, n: int) -> np.ndarray:
        """Per slot: a send or receive whose per-op envelope (``base_dur``) is over twice the lower
        median of its parallel slots' (``Topology.p2p_parallel``), three or more."""
        out = np.zeros(n, bool)
        ps, key = topo.p2p_parallel(n)
        env = self.base_dur[ps]
        ok = np.isfinite(env)
        ps, key, env = ps[ok], key[ok], env[ok]
        if not ps.shape[0]:
            return out
        o = np.lexsort((env, key))
        k_s, e_s = key[o], env[o]
        starts = np.flatnonzero(np.r_[True, k_s[1:] != k_s[:-1]])
        ends = np.r_[starts[1:], k_s.shape[0]]
        med = e_s[(starts + ends - 1) // 2]  # lower median per key
        cnt = ends - starts
        idx = np.searchsorted(starts, np.arange(k_s.shape[0]), side="right") - 1
        far_s = (cnt[idx] >= 3) & (e_s > 2.0 * med[idx])
        out[ps[o[far_s]]] = True
        return out

    @staticmethod
    def _follow(base: np.ndarray, x: np.ndarray, ok: np.ndarray, a: np.ndarray) -> None:
        """In place, where ``ok``: ``base`` takes a first sample of ``x`` as it is, and then follows
        it at the weights ``a``, a drop five times faster than a rise (faults only ever add
        lateness: a slow start, compilation or the first step, must not stay in a baseline)."""
        fresh = ok & np.isnan(base)
        base[fresh] = x[fresh]
        upd = ok & ~fresh
        d = x[upd] - base[upd]
        base[upd] += np.minimum(1.0, np.where(d < 0, 5.0, 1.0) * a[upd]) * d

    def _learn_wide(self, now: float, dt: float, topo: Topology, rate: np.ndarray, grown_up: np.ndarray) -> None:
        """``ex_wide`` and ``thr_wide``: per slot, its lateness over the ring's newest buckets
        (``ml_wide``) beyond its usual, in seconds per second, and the threshold its usual
        fluctuation sets. Learns both as ``base_late`` and ``noise`` are learned, while its rank is
        calm and its node's slow-stage signs do not lean towards a slow stage (nor hold)."""
        cfg = self.cfg
        n = topo.n_slots
        sl = slice(0, n)
        mlw = self.ml_wide[:n]
        base, age = self.base_wide[sl], self.wide_age[sl]
        self.ex_wide = (mlw - base) * rate
        ok = np.isfinite(mlw) & grown_up & ~self.busy[sl] & (now - self.first_data[sl] >= 2 * cfg.ops_tau_s)
        node = topo.node_of[: topo.world][topo.slot_rank[:n]]
        n_nodes = len(topo.node_names)
        if self.stage_lean.shape[0] >= n_nodes and self.stage_run.shape[0] >= n_nodes and n_nodes:
            leaning = (self.stage_lean[:n_nodes] > 0) | (self.stage_run[:n_nodes] > 0)
            ok &= ~((node >= 0) & leaning[np.maximum(node, 0)])
        self._follow(base, mlw, ok, self._weight(age, dt))
        # its usual fluctuation, as ``noise`` is learned (around a running level, outliers clipped);
        # its threshold as a point-to-point slot's: ``p2p_k`` times ``noise_k`` of it, never finer
        # than ``min_effect``'s
        nz, lv = self.noise_wide[sl], self.level_wide[sl]
        floor = cfg.min_effect / cfg.noise_k
        thr = cfg.p2p_k * cfg.noise_k * np.fmax(floor, np.nan_to_num(nz, nan=0.0))
        ex = self.ex_wide
        ok &= np.isfinite(ex)
        first = ok & np.isnan(nz)
        lv[first], nz[first] = ex[first], 0.0
        upd = ok & ~first
        a = self._weight(age[upd], dt)
        dv = np.clip(ex[upd] - lv[upd], -3.0 * thr[upd], 3.0 * thr[upd])
        lv[upd] += a * dv
        nz[upd] = np.sqrt((1.0 - a) * (nz[upd] ** 2 + a * dv**2))
        self.thr_wide = thr
        age[ok] += dt

    def imposed_by(self, mine: np.ndarray) -> float:
        """Seconds per second the job waits on the rank of these slots: the most any of its groups
        does (see ``JobDetector._imposed``)."""
        ex = np.nan_to_num(self.imposed[mine], nan=0.0)
        return float(np.clip(ex, 0.0, None).max(initial=0.0))

    def _slow_stages(
        self, dt: float, topo: Topology, out: dict[int, Straggler], frozen_ch: np.ndarray | None, keep: set[int]
    ) -> None:
        """A slow node that is a whole pipeline stage: its ranks become roots (added to ``out``).

        Its ranks are slow together, so no group they share has a late member and the rank
        test above sees nothing; the stages next to it wait for it at their sends and receives.
        What shows is the causal pair: the node's ranks spend a smaller share of their time
        inside ops than usual, by more than the other nodes' ranks do (those wait more), and they
        are later than usual at their point-to-point channels to other nodes. Each is judged
        against its own usual spread and both must hold ``stage_hold_s``. A node with a rank
        already found on its own is left to that rank, and one whose ranks use a channel with slow
        transfers to the transfer analysis (a slow link shifts both signs the same way). A node
        already reported (``keep``) learns nothing and stays on half the evidence, as slots do.
        """
        cfg = self.cfg
        n = topo.n_slots
        n_nodes = len(topo.node_names)
        self.stage_run = _grow(self.stage_run, n_nodes, 0.0)
        self.stage_out = _grow(self.stage_out, n_nodes, 0.0)
        self.stage_z = _grow(self.stage_z, n_nodes, np.nan)
        self.stage_late = _grow(self.stage_late, n_nodes, np.nan)
        self.stage_age = _grow(self.stage_age, n_nodes, 0.0)
        self.stage_lean = _grow(self.stage_lean, n_nodes, 0.0)
        self.stage_var = _grow(self.stage_var, n_nodes, 0.0)
        var = self.stage_var[:n_nodes]
        run, zs = self.stage_run[:n_nodes], self.stage_z[:n_nodes]
        usual, age = self.stage_late[:n_nodes], self.stage_age[:n_nodes]
        node_of = topo.node_of[: topo.world]
        slot_node = node_of[topo.slot_rank[:n]]  # per slot: its rank's node (-1: not known yet)
        sl, n_p2p, late = self.late_at_stages(topo)
        if self.stage_restarted:
            for arr, v in ((zs, np.nan), (usual, np.nan), (age, 0.0), (var, 0.0), (run, 0.0), (self.stage_lean, 0.0)):
                arr[...] = v
            self.stage_zn[:] = np.nan
        if n_nodes < 2 or not sl.shape[0] or self.stage_in.shape[0] < topo.world:
            run[:] = 0.0
            return
        d_in = self.stage_in[: topo.world]
        ok = np.isfinite(d_in) & (node_of >= 0)
        cnt = np.bincount(node_of[ok], minlength=n_nodes)
        mean_in = np.bincount(node_of[ok], d_in[ok], n_nodes) / np.maximum(cnt, 1)
        mean_in[cnt == 0] = np.nan
        # against the other nodes: their median (the whole job's, when there are many)
        if n_nodes <= 64:
            others = np.array(
                [
                    np.nanmedian(x) if np.isfinite(x).any() else np.nan
                    for x in (np.delete(mean_in, i) for i in range(n_nodes))
                ]
            )
        else:
            others = np.full(n_nodes, np.nanmedian(mean_in) if np.isfinite(mean_in).any() else np.nan)
        z_in = np.nan_to_num(mean_in - others, nan=0.0)
        zs[:] = np.where(np.isnan(zs), z_in, zs + min(1.0, dt / cfg.stage_tau_s) * (z_in - np.nan_to_num(zs)))
        # ...and against its neighbours in the pipeline, the nodes it sends to or receives from:
        # they wait on a slow stage, and their share rises. Two stages of the same replicas that
        # drop together are uneven work (GC pauses, tp4pp2dp4 in heldout's gc+: nodes 1 and 3
        # 0.03-0.05 under the others' for 8 s, and node 3 late at its sends), not a slow stage
        ch_lo, ch_hi = topo.ch_nodes()
        edge = (topo.ch_parent[: topo.n_channels] >= 0) & (ch_lo >= 0) & (ch_lo != ch_hi)
        ea, eb = ch_lo[edge], ch_hi[edge]
        fin = np.nan_to_num(mean_in, nan=0.0)
        known = np.isfinite(mean_in)
        nb_sum = np.bincount(ea, fin[eb], n_nodes) + np.bincount(eb, fin[ea], n_nodes)
        nb_cnt = np.bincount(ea, known[eb], n_nodes) + np.bincount(eb, known[ea], n_nodes)
        # (a node whose own share is not known has no change against anybody: read as 0 there, its
        # neighbours' mean alone came through, and after a save, whose windows each node leaves at
        # its own time, the smoothed change restarted from it)
        z_nb = np.where((nb_cnt > 0) & known, fin - nb_sum / np.maximum(nb_cnt, 1), np.nan)
        self.stage_zn = _grow(self.stage_zn, n_nodes, np.nan)
        zn = self.stage_zn[:n_nodes]
        zn[:] = np.where(np.isnan(zn), z_nb, zn + min(1.0, dt / cfg.stage_tau_s) * (z_nb - zn))
        p2p_node = slot_node[sl]
        found = np.zeros(n_nodes, bool)
        if out:
            on = node_of[np.fromiter(out, np.int64, len(out))]
            found[on[on >= 0]] = True
        if frozen_ch is not None and frozen_ch.shape[0]:
            found[np.unique(slot_node[frozen_ch[topo.slot_ch[:n]] & (slot_node >= 0)])] = True
        n_kept = self._count_per_node(keep, topo, n_nodes)
        kept = n_kept > 0
        held = kept & (run >= cfg.stage_hold_s)  # reported as a slow stage, not for one of its ranks
        # a node some of whose ranks are reported, not all, is left to them: a straggler's share
        # inside ops drops and its node's mean with it (unseen-slow_link_and_straggler-002,
        # tp4pp4dp2: node 2 named beside its 1.5x rank 21, once the share was read steadily)
        found |= kept & (n_kept < np.bincount(node_of[node_of >= 0], minlength=n_nodes))
        usual[:] = np.where(np.isnan(usual), late, usual)
        d_late = late - usual
        # the spread of the share's drop is taken around zero: it is a difference between nodes already
        sd = np.sqrt(var)
        k = np.where(held, 0.5, 1.0) * cfg.stage_noise_k
        floor = np.where(held, 0.5, 1.0)
        # the lines each sign must pass (half the floors and the noise test for a node reported)
        line = self.stage_line = np.stack(
            (np.fmax(floor * cfg.stage_in_drop, k * sd[:, 0]), np.fmax(floor * cfg.stage_late_z, k * sd[:, 1])), axis=1
        )
        cond = (n_p2p > 0) & ~found & (age >= cfg.baseline_warm_s)
        cond &= zs < -line[:, 0]
        cond &= ~(zn >= -line[:, 0])  # (a node with no neighbour known, nan, is not held back)
        # a share far past its line against both (``stage_clear_k`` lines, and ``stage_clear_abs``)
        # needs only part of the late sign's: the two signs of a slow stage differ in strength,
        # heldout-straggler_node-004's share sat twice past its line while its sends were late by
        # 0.05-0.14 of their thresholds, the line's floor 0.15. A run of GC pauses on a stage whose
        # line sits at its floor drops its share 0.04-0.05 for 8 s, and its sends' lateness decays
        # under the line: two lines alone named two such stages in 400 healthy jobs of new seeds
        far = np.fmax(cfg.stage_clear_k * line[:, 0], cfg.stage_clear_abs)
        clear = (zs < -far) & (zn < -far)
        cond &= d_late > np.where(clear, cfg.stage_clear_late, 1.0) * line[:, 1]
        # nothing is learned while either sign leans towards a slow stage (past half its line):
        # learned, a slow stage's lateness became its usual in the seconds before its share's
        # drop had crossed (and the hold started over at every break)
        lean = (zs < -0.5 * np.fmax(cfg.stage_in_drop, k * sd[:, 0])) | (
            d_late > 0.5 * np.fmax(cfg.stage_late_z, k * sd[:, 1])
        )
        leant = self.stage_lean[:n_nodes]
        leant[:] = np.where(lean & ~cond, leant + dt, 0.0)
        lean &= leant <= cfg.stage_hold_s
        spread = (n_p2p > 0) & ~cond & (run == 0) & ~found & ~kept
        learn = spread & ~lean
        a = dt / np.maximum(np.minimum(age + dt, cfg.stage_usual_s), 1e-9)
        usual[learn] += a[learn] * d_late[learn]
        # the spread, though, is learned from the leaning samples too, each cut at its line (on
        # the side a slow stage moves it): from those within half the line alone it saw a
        # truncated spread, shrank to its floor, and healthy stages with uneven steps crossed it
        # for 6 s (8 of 9 false pipeline nodes on 1,200 healthy jobs of our own); a slow stage's
        # first seconds add at most the line each
        cut = (
            np.fmax(zs, -np.fmax(cfg.stage_in_drop, k * sd[:, 0])),
            np.fmin(d_late, np.fmax(cfg.stage_late_z, k * sd[:, 1])),
        )
        for j, x in enumerate(cut):
            var[spread, j] = (1.0 - a[spread]) * (var[spread, j] + a[spread] * x[spread] ** 2)
        age[learn] += dt
        # a break of up to ``root_gap_s`` keeps the time held so far (not counted; nothing learned
        # meanwhile): a stage slower by 10-20% swings across the line, and started afresh at every
        # break its 6 s hold ran out rarely, while the usual it then learned took the fault in
        gone = self.stage_out[:n_nodes]
        self._hold(run, gone, cond, dt)
        for node in np.flatnonzero(cond & (run >= cfg.stage_hold_s)).tolist():
            mine = sl[p2p_node == node]
            for r in np.unique(topo.slot_rank[mine]).tolist():
                slots = mine[topo.slot_rank[mine] == r]
                ex = np.nan_to_num(self.ex_late[slots], nan=0.0)
                best = int(np.argmax(ex))
                st = Straggler(
                    rank=int(r),
                    excess=float(ex[best]),
                    threshold=float(self.thr[slots[best]]),
                    onset=float(np.nanmin(self.onset[slots])) if np.isfinite(self.onset[slots]).any() else np.nan,
                    held=True,
                )
                st.slots.extend(slots[ex > 0].tolist() or [int(slots[best])])
                out.setdefault(int(r), st)

    def late_at_stages(self, topo: Topology) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The slow-stage test's late sign as it reads now: the slots at point-to-point channels to
        other nodes, their count per node, and per node their mean lateness over the threshold (a
        slot not judged counts 0; clipped to -2..4)."""
        n = topo.n_slots
        slot_node = topo.node_of[: topo.world][topo.slot_rank[:n]]
        p2p = (topo.ch_parent[topo.slot_ch[:n]] >= 0) & topo.ch_cross_node()[topo.slot_ch[:n]] & (slot_node >= 0)
        sl = np.flatnonzero(p2p)
        z = self.ex_late[sl] / np.maximum(self.thr[sl], 1e-12)
        if self.ex_wide.shape[0] >= n:
            z = np.where(np.isfinite(z), z, self.ex_wide[sl] / np.maximum(self.thr_wide[sl], 1e-12))
        z_late = np.clip(np.nan_to_num(z, nan=0.0), -2.0, 4.0)
        n_nodes = len(topo.node_names)
        n_p2p = np.bincount(slot_node[sl], minlength=n_nodes)
        return sl, n_p2p, np.bincount(slot_node[sl], z_late, n_nodes) / np.maximum(n_p2p, 1)

    def _lean_nodes(
        self,
        dt: float,
        topo: Topology,
        out: dict[int, Straggler],
        frozen_ch: np.ndarray | None,
        keep: set[int],
        judged: np.ndarray,
    ) -> None:
        """A slow node whose ranks share a group of the job together: its ranks become roots.

        In a pure data-parallel job (dp24: eight ranks of a node in one group of 24) a 1.2x node
        makes each of its ranks late at every reduce by about half the threshold any one of them
        is judged by alone, the threshold its own fluctuation sets; one of them crosses it now and
        then and was named alone, the node never. Eight ranks late together by half a threshold,
        while the group's other members are not late, is no chance: the node is slow. Judged per
        group that holds ``node_share`` of a node's ranks and is at least half other nodes' ranks:
        the node's ranks there late by ``node_lean`` of their thresholds on average (each counting
        at most twice that) and that share of them by half of it, the group's lower median under a
        quarter of it (slots with history, ``judged``; a paused slot keeps its judgement), and its
        ranks' share of time inside ops grown less than the other members' (they compute longer,
        the others wait); held ``mild_hold_s``, through breaks of up to ``root_gap_s``. Not where
        the node's channels carry slow transfers (the transfer analysis speaks for those). A group
        of one node's ranks only (a tensor-parallel group) never qualifies: there the ranks wait
        for each other.
        """
        cfg = self.cfg
        n = topo.n_slots
        n_nodes = len(topo.node_names)
        self.lean_run = _grow(self.lean_run, n_nodes, 0.0)
        self.lean_out = _grow(self.lean_out, n_nodes, 0.0)
        run, gone = self.lean_run[:n_nodes], self.lean_out[:n_nodes]
        if n_nodes < 2 or not n:
            run[:] = 0.0
            return
        node_of = topo.node_of[: topo.world]
        sn = node_of[topo.slot_rank[:n]]
        ch = topo.slot_ch[:n]
        z = np.nan_to_num(self.ex_late[:n] / np.maximum(self.thr[:n], 1e-12), nan=np.nan)
        ok = (topo.ch_parent[ch] < 0) & (sn >= 0) & np.isfinite(z) & judged[:n]
        size = np.bincount(node_of[node_of >= 0], minlength=n_nodes)
        need = np.maximum(2, np.ceil(cfg.node_share * size)).astype(np.int64)
        kept = self._count_per_node(keep, topo, n_nodes) > 0
        cond = np.zeros(n_nodes, bool)
        best: dict[int, np.ndarray] = {}
        # only groups where two members or more lean at all (a healthy job of 100,000 ranks has few)
        lean = ok & (z >= 0.5 * cfg.node_lean)
        lean_ch = np.bincount(ch[lean], minlength=topo.n_channels) >= 2
        sel = ok & lean_ch[ch]
        if sel.any():
            key, inv = np.unique(ch[sel] * n_nodes + sn[sel], return_inverse=True)
            m = key.shape[0]
            ch_of, node_at = key // n_nodes, key % n_nodes
            cnt = np.bincount(inv, minlength=m)
            broad = np.bincount(inv, lean[sel], m)
            line = np.where(kept[node_at], 0.5, 1.0) * cfg.node_lean
            # (a rank counts at most twice the line: one straggler far over its own threshold does
            # not carry its node. dp16 at 10/s, a 1.5x rank at four times its threshold and its
            # seven node-mates at -0.2-0.5 averaged 0.6 of theirs: the node was named, not the rank)
            zsum = np.bincount(inv, np.minimum(z[sel], 2.0 * line[inv]), m)
            # ...and its ranks spend less of their time inside ops than the group's other members
            # (they compute longer; the others wait for them): a pipeline stage that a slow stage
            # before it holds up is as late at its reduces together, but it waited to be
            din = np.nan_to_num(self.d_in[topo.slot_rank[:n]], nan=0.0) if self.d_in.shape[0] else np.zeros(n)
            # ...nor are they late there as the victims the rank test found (hot, not roots): that
            # stage's ranks cross their thresholds and are excused for their waiting
            is_root = np.zeros(topo.world, bool)
            if out:
                is_root[np.fromiter(out, np.int64, len(out))] = True
            victim = self.hot[:n] & ~is_root[topo.slot_rank[:n]]
            vict = np.bincount(inv, victim[sel], m)
            din_node = np.bincount(inv, din[sel], m) / np.maximum(cnt, 1)
            ok_ch = np.bincount(ch[sel], minlength=topo.n_channels)
            din_ch = np.bincount(ch[sel], din[sel], topo.n_channels)
            off = np.maximum(ok_ch[ch_of] - cnt, 1)
            din_off = (din_ch[ch_of] - din_node * cnt) / off
            good = (
                (cnt >= need[node_at])
                & (2 * cnt <= topo.ch_size[ch_of])
                & (zsum >= line * np.maximum(cnt, 1))
                & (broad >= need[node_at])
                & (din_node < din_off)
                & (4 * vict <= cnt)
            )
            for k in np.flatnonzero(good).tolist():
                c = int(ch_of[k])
                lo, hi = int(topo.ch_off[c]), int(topo.ch_off[c] + topo.ch_size[c])
                mid = (hi - lo - 1) // 2
                if float(np.partition(np.where(ok[lo:hi], z[lo:hi], np.inf), mid)[mid]) >= 0.25 * cfg.node_lean:
                    continue  # the group's lower median leans too: the others are late as well
                node = int(node_at[k])
                cond[node] = True
                best.setdefault(node, np.flatnonzero(ok & (ch == c) & (sn == node)))
        self._spread_nodes(topo, ok, z, need, cond, best)
        if frozen_ch is not None and frozen_ch.shape[0]:
            cond[np.unique(sn[frozen_ch[ch] & (sn >= 0)])] = False
        self._hold(run, gone, cond, dt)
        for node in np.flatnonzero(cond & (run >= cfg.mild_hold_s)).tolist():
            for s in best[node].tolist():
                r = int(topo.slot_rank[s])
                st = Straggler(
                    rank=r,
                    excess=float(self.ex_late[s]),
                    threshold=float(self.thr[s]),
                    onset=float(self.onset[s]),
                    held=True,
                )
                st.slots.append(s)
                out.setdefault(r, st)

    def _spread_nodes(
        self,
        topo: Topology,
        ok: np.ndarray,
        z: np.ndarray,
        need: np.ndarray,
        cond: np.ndarray,
        best: dict[int, np.ndarray],
    ) -> None:
        """The lean test of ``_lean_nodes`` for a node whose ranks sit one or two to a group.

        In tp8dp4 a node is one tensor-parallel group and each of its ranks is in a data-parallel
        group of one rank per node: no group holds ``node_share`` of its ranks. A 1.2x node there
        made each of its eight ranks late in its own group by 0.4-0.8 of its threshold for 24 s,
        the groups' other members not late, and nothing was named (``bench/probe_classes.py`` seed
        61209, probe-straggler_node-000). So a node's slots in the groups where it holds fewer than
        ``need`` of its ranks, and no more than half the group, are judged together, by the group
        test's lines: late by ``node_lean`` of their thresholds on average (each counting at most
        twice that), ``need`` of its ranks by half of it, no group it leans in with its lower median
        at a quarter of it, its ranks less of their time inside ops than those groups' other
        members, and few of its slots hot as victims. On fresh buckets only: a group that stopped
        keeps its last judgement, and the ranks of a tp8dp8 node that a GC pause had held up stayed
        late in it for seconds (heldout-two_stragglers-001's node 3, named a second before its own
        straggler's onset). Not a pipeline stage's node (a stage before it or the schedule holds
        all its ranks up at once; the stage test speaks for a slow stage), nor a node with a rank
        standing out inside it (``_stands_out``: a straggler's tensor-parallel mates wait on it and
        arrive late together).
        """
        cfg = self.cfg
        line = cfg.node_lean
        n, n_nodes = z.shape[0], cond.shape[0]
        rank = topo.slot_rank[:n]
        node_of = topo.node_of[: topo.world]
        sn = node_of[rank]
        ch = topo.slot_ch[:n]
        lean = ok & (z >= 0.5 * line)
        if not lean.any() or not self.d_in.shape[0]:
            return
        lr = np.zeros(topo.world, bool)
        lr[rank[lean]] = True
        cand = (np.bincount(node_of[lr & (node_of >= 0)], minlength=n_nodes) >= need) & ~cond
        p2p = topo.ch_parent[ch] >= 0
        cand[sn[p2p & (sn >= 0)]] = False
        if not cand.any():
            return
        mine = (sn >= 0) & cand[np.maximum(sn, 0)]  # (a candidate has no slot in a pipeline's sends)
        at = np.flatnonzero(mine)
        _, inv, cnt = np.unique(ch[at].astype(np.int64) * n_nodes + sn[at], return_inverse=True, return_counts=True)
        k = cnt[inv]  # per slot: how many of its node's ranks share its group
        use = np.zeros(n, bool)
        use[at[(k < need[sn[at]]) & (2 * k <= topo.ch_size[ch[at]])]] = True
        use &= ok
        m = min(n, self.paused.shape[0])
        use[:m] &= ~self.paused[:m] & ~self.between[:m]
        if not use.any():
            return
        # the groups it leans in: their lower median must not lean too (the others late as well)
        chs = np.unique(ch[use & lean])
        size = topo.ch_size[chs].astype(np.int64)
        rep = np.repeat(np.arange(chs.shape[0]), size)
        start = np.cumsum(size) - size
        idx = topo.ch_off[chs][rep] + np.arange(rep.shape[0]) - start[rep]
        zz = np.where(ok[idx], z[idx], np.inf)
        zs = zz[np.lexsort((zz, rep))]
        n_ok = np.bincount(rep, ok[idx], chs.shape[0]).astype(np.int64)
        med = np.where(n_ok > 0, zs[start + np.maximum(n_ok - 1, 0) // 2], np.inf)
        bad_ch = np.zeros(topo.n_channels, bool)
        bad_ch[chs[med >= 0.25 * line]] = True
        bad = np.zeros(n_nodes, bool)
        bad[sn[use & lean & bad_ch[ch]]] = True
        # its ranks' share of time inside ops against the other members of the groups it is judged in
        din = np.nan_to_num(self.d_in[rank], nan=0.0)
        s_ch = np.bincount(ch[ok], din[ok], topo.n_channels)
        c_ch = np.bincount(ch[ok], minlength=topo.n_channels).astype(np.float64)
        pairs = np.unique(ch[use].astype(np.int64) * n_nodes + sn[use])
        pc, pn = pairs // n_nodes, pairs % n_nodes
        own = ok & mine
        own &= np.isin(ch.astype(np.int64) * n_nodes + np.maximum(sn, 0), pairs)
        off_s = np.bincount(pn, s_ch[pc], n_nodes) - np.bincount(sn[own], din[own], n_nodes)
        off_c = np.bincount(pn, c_ch[pc], n_nodes) - np.bincount(sn[own], minlength=n_nodes)
        n_use = np.bincount(sn[use], minlength=n_nodes)
        din_node = np.bincount(sn[use], din[use], n_nodes) / np.maximum(n_use, 1)
        din_off = off_s / np.maximum(off_c, 1)
        lr[:] = False
        lr[rank[use & lean]] = True
        broad = np.bincount(node_of[lr & (node_of >= 0)], minlength=n_nodes)
        zsum = np.bincount(sn[use], np.minimum(z[use], 2.0 * line), n_nodes)
        vict = np.bincount(sn[use], self.hot[:n][use], n_nodes)
        good = cand & (n_use > 0) & ~bad & (broad >= need) & (zsum >= line * n_use)
        good &= (din_node < din_off) & (off_c > 0) & (4 * vict <= n_use)
        for node in np.flatnonzero(good).tolist():
            its = np.flatnonzero(use & (sn == node))
            if not self._stands_out(topo, node, float(self.ex_late[its].mean())):
                cond[node] = True
                best[node] = its

    def _stands_out(self, topo: Topology, node: int, at_reduce: float) -> bool:
        """Whether a rank of ``node`` is late inside it (in a group of its ranks only, a
        tensor-parallel group) by half of ``at_reduce`` (s per s) or more over the group's median.

        A straggler holds its tensor-parallel mates up, and they all reach their data-parallel
        groups late. A 1.1x rank of tp8dp4 made its node's eight ranks late there by 0.02-0.03 s
        per s (0.7-0.9 of their thresholds) while it was late inside the node by 0.05-0.06 and its
        mates by nothing (probe seed 61206, straggler_mild-003); a slow node's ranks are late
        inside it by noise only (0.01-0.03 against 0.09-0.1 at their reduces).
        """
        node_of = topo.node_of[: topo.world]
        n = min(topo.n_slots, self.ex_late.shape[0])
        mine = (node_of[topo.slot_rank[:n]] == node) & (topo.ch_parent[topo.slot_ch[:n]] < 0)
        for c in np.unique(topo.slot_ch[:n][mine]).tolist():
            lo, hi = int(topo.ch_off[c]), int(topo.ch_off[c] + topo.ch_size[c])
            if hi - lo < 2 or bool((node_of[topo.slot_rank[lo:hi]] != node).any()):
                continue
            inside = self.ex_late[lo:hi]
            inside = inside[np.isfinite(inside)]
            if inside.shape[0] >= 2 and float(inside.max() - np.median(inside)) >= 0.5 * at_reduce:
                return True
        return False

    @staticmethod
    def _count_per_node(ranks: set[int], topo: Topology, n_nodes: int) -> np.ndarray:
        """Per node: how many of ``ranks`` it holds."""
        if not ranks:
            return np.zeros(n_nodes, np.int64)
        rs = np.fromiter(ranks, np.int64, len(ranks))
        nodes = topo.node_of[: topo.world][rs[(rs >= 0) & (rs < topo.world)]]
        return np.bincount(nodes[nodes >= 0], minlength=n_nodes)

    def _hold(self, run: np.ndarray, gone: np.ndarray, cond: np.ndarray, dt: float) -> None:
        """Per node, in place: seconds ``cond`` has held (``run``), through breaks of up to
        ``root_gap_s`` that do not count (``gone``: seconds since it last held)."""
        gone[:] = np.where(cond, 0.0, gone + dt)
        run[:] = np.where(cond, run + dt, np.where(gone <= self.cfg.root_gap_s, run, 0.0))

    def _weight(self, age: np.ndarray, dt: float) -> np.ndarray:
        """Weight of a new sample in a baseline ``age`` seconds old: a running average while it
        is younger than ``baseline_warm_s``, then a time constant of ``baseline_tau_s``."""
        cfg = self.cfg
        return np.where(age < cfg.baseline_warm_s, dt / np.maximum(age + dt, 1e-9), min(1.0, dt / cfg.baseline_tau_s))

    def _lower_median(self, x: np.ndarray, topo: Topology, upper: bool = False) -> np.ndarray:
        """Per slot: the lower (or upper) median of ``x`` over its channel's members (nan counts as
        largest in the lower; give -inf for what should count as smallest in the upper)."""
        if not x.shape[0]:
            return x
        # channels of one size at a time, as rows of a matrix: a partial sort per row, not a sort of all slots
        med = np.empty(topo.n_channels, x.dtype)
        for size, chans, idx in self._channels_by_size(topo):
            m = x[idx]
            if size <= 2:
                med[chans] = (np.fmax if upper else np.fmin)(m[:, 0], m[:, -1])
            else:
                k = size // 2 if upper else (size - 1) // 2
                med[chans] = np.partition(m, k, axis=1)[:, k]
        return med[topo.slot_ch]

    def _channels_by_size(self, topo: Topology) -> list[tuple[int, np.ndarray, np.ndarray]]:
        """(size, its channels, their slots as rows) per channel size, kept while the topology stays."""
        key = (topo.version, topo.n_channels, topo.n_slots)
        if self._by_size[0] != key:
            sizes = topo.ch_size
            groups = []
            for size in np.unique(sizes).tolist():
                chans = np.flatnonzero(sizes == size)
                groups.append((size, chans, topo.ch_off[chans][:, None] + np.arange(size)))
            self._by_size = (key, groups)
        return self._by_size[1]

    @staticmethod
    def _elsewhere(x: np.ndarray, topo: Topology) -> np.ndarray:
        """Per slot: ``x`` summed over its rank's other slots."""
        return np.bincount(topo.slot_rank, x, topo.world)[topo.slot_rank] - x

    def _ring_wsum(self, arr: np.ndarray, n: int, w: np.ndarray) -> np.ndarray:
        """Per slot: one bucket ring over its newest ``len(w)`` buckets, weighted by ``w`` (oldest first).

        ``einsum``, not a matrix product: BLAS threads spin after a call, and the CPU they burn
        doubled what ingest cost an 8,192-rank job (``bench/detector_scale.py``)."""
        top = int(self.bid.max())
        lo, hi = (top - len(w) + 1) % _K, top % _K + 1
        if lo < hi:
            return np.einsum("ij,j->i", arr[:n, lo:hi], w).astype(np.float64)
        k = _K - lo
        return (np.einsum("ij,j->i", arr[:n, lo:], w[:k]) + np.einsum("ij,j->i", arr[:n, :hi], w[k:])).astype(
            np.float64
        )

    def _ring_sum(self, arr: np.ndarray, n: int) -> np.ndarray:
        """Per slot: one bucket ring (lateness, time inside or ops) summed over the window (the
        newest ``_WIN`` buckets: at most two runs of adjacent ring positions)."""
        top = int(self.bid.max())
        lo, hi = (top - _WIN + 1) % _K, top % _K + 1
        if lo < hi:
            return arr[:n, lo:hi].sum(axis=1, dtype=np.float64)
        return arr[:n, lo:].sum(axis=1, dtype=np.float64) + arr[:n, :hi].sum(axis=1, dtype=np.float64)

    def _roots(
        self,
        hot: np.ndarray,
        topo: Topology,
        frozen_ch: np.ndarray | None,
        ch_excess: np.ndarray | None,
        wo: np.ndarray,
        extra: np.ndarray,
        keep: set[int],
    ) -> dict[int, Straggler]:
        cand = np.flatnonzero(hot)
        if not cand.shape[0]:
            return {}
        ptr, slots_of = topo.rank_slots()
        wl = self._ring_sum(self.bl, topo.n_slots)
        # a whole-job group's rare ops in the window (fewer than five: the barrier after a
        # checkpoint's save): what a rank waited there is the save's skew, judged on its own
        # (``barriers.py``), and says nothing of where its lateness elsewhere came from; unless the
        # member it waited on there (the latest) is a straggler already named: a slow node writes
        # slower too, and the ranks that waited on it at the barrier are its victims
        rare = topo.ch_whole()[topo.slot_ch] & (wo < RECENT_BUCKETS)
        skew = rare.copy()
        for ch in np.unique(topo.slot_ch[skew]).tolist():
            lo, size = int(topo.ch_off[ch]), int(topo.ch_size[ch])
            if int(topo.slot_rank[lo + int(np.argmax(wl[lo : lo + size]))]) in keep:
                skew[lo : lo + size] = False
        extra = np.where(skew, 0.0, extra)
        # ``extra``: seconds inside ops beyond each slot's own per-op baseline and its usual
        # waiting, over one common recent window
        elsewhere = self._elsewhere(extra, topo)  # per slot: its rank's extra inside other groups' ops
        # ...compared with what the other members of the same group spent elsewhere at the same time:
        # ranks that all waited on the same upstream delay are equals; the one that is later still is not
        rel = elsewhere - self._lower_median(elsewhere, topo)
        # collective groups that cross nodes: where a straggler (or a slow node) shows as lateness
        cross = topo.ch_cross_node()[topo.slot_ch] & (topo.ch_parent[topo.slot_ch] < 0)
        hot_in_ch = np.bincount(topo.slot_ch, hot.astype(np.float64), topo.n_channels)
        # a pipeline neighbour late at its sends by the bar of a collective group (``p2p_k`` times
        # less than what names it: a pipeline's waits follow its schedule) is late enough for the
        # rank that waited on it to have waited on somebody
        ex_now = np.nan_to_num(self.ex_late[: hot.shape[0]], nan=0.0)
        late_p2p = (topo.ch_parent[topo.slot_ch] >= 0) & (ex_now >= self.thr[: hot.shape[0]] / self.cfg.p2p_k)
        late_member = hot | late_p2p
        late_in_ch = np.bincount(topo.slot_ch, late_member.astype(np.float64), topo.n_channels)
        # per channel: the largest excess of a hot member (who is later still than a given one)
        hot_ex = np.where(hot, ex_now, -np.inf)
        hot_max = np.full(topo.n_channels, -np.inf)
        np.maximum.at(hot_max, topo.slot_ch[: hot.shape[0]], hot_ex)
        out: dict[int, Straggler] = {}
        # slots excused only by waiting on somebody later than them: in their own group (a member
        # later still), or elsewhere as much as their group-mates did. Once the first pass has
        # named the roots, those that waited on roots are judged again without that excuse
        behind: list[tuple[int, str, list[tuple[int, float]]]] = []
        # how far the ranks' shares of time inside ops drifted together, where nobody is late: the
        # (upper) median over the ranks of their change in groups with no hot member (nor a save's
        # barrier). The shares move together, by the phase of the analysis and by a usual learned
        # in the job's first seconds, by 0.1 of wall-clock or more, where a mild straggler's drops by
        # 0.02; its part in groups with a late member is waiting on the suspects, which the test
        # below weighs (read over every group, before the gates below, it took the barrier after a
        # save, where every rank waited on a slow node, for drift, and named another node's ranks:
        # tune-straggler_node-006)
        m = min(topo.n_slots, self.d_slot.shape[0])
        calm = ~rare[:m] & (hot_in_ch[topo.slot_ch[:m]] == 0)
        drift = np.bincount(topo.slot_rank[:m], np.where(calm, self.d_slot[:m], 0.0), topo.world)
        drift = drift[np.isfinite(self.d_in[: topo.world])]
        k_mid = drift.shape[0] // 2
        d_common = max(0.0, float(np.partition(drift, k_mid)[k_mid])) if drift.shape[0] else 0.0
        slow_any = frozen_ch is not None and bool(frozen_ch.any())
        # the pipelines (ranks joined by sends and receives) that hold a reported straggler, and
        # those with slow transfers at their sends and receives
        slow_p2p = np.zeros(0, np.int64)
        if slow_any and frozen_ch is not None:
            fz = np.zeros(topo.n_channels, bool)
            fz[: min(topo.n_channels, frozen_ch.shape[0])] = frozen_ch[: topo.n_channels]
            at = topo.slot_ch[: min(topo.n_slots, hot.shape[0])]
            slow_p2p = topo.slot_rank[np.flatnonzero(fz[at] & (topo.ch_parent[at] >= 0))]
        pipe = topo.pipelines() if keep or slow_p2p.shape[0] else np.zeros(0, np.int64)
        pipe_kept = {int(pipe[q]) for q in keep if q < pipe.shape[0]}
        pipe_slow = {int(pipe[q]) for q in slow_p2p.tolist()}
        p2p_slot = topo.ch_parent[topo.slot_ch] >= 0

        def on_p2p(q: int, x: np.ndarray) -> float:
            """Rank ``q``'s ``x`` (per slot: its share's change, or its extra seconds) at its sends
            and receives, over its usual only (clipped at 0)."""
            sl = slots_of[ptr[q] : ptr[q + 1]]
            sl = sl[p2p_slot[sl] & (sl < x.shape[0])]
            return float(np.clip(x[sl], 0.0, None).sum())

        def mates_of(s: int) -> list[int]:
            """The other members of slot ``s``'s group."""
            lo, size = int(topo.ch_off[topo.slot_ch[s]]), int(topo.ch_size[topo.slot_ch[s]])
            return [int(topo.slot_rank[b]) for b in range(lo, lo + size) if b != s]

        def shared_p2p(r: int, mates: list[int], x: np.ndarray) -> float:
            """What rank ``r`` spent at its sends and receives that its ``mates`` spent at theirs as
            well: the least of its own and their median."""
            return min(on_p2p(r, x), float(np.median([on_p2p(q, x) for q in mates])))

        def root_in(ch: int, than: float) -> bool:
            """A member of group ``ch`` later than ``than`` there is a root."""
            lo, size = int(topo.ch_off[ch]), int(topo.ch_size[ch])
            later = np.arange(lo, lo + size)[hot_ex[lo : lo + size] > than]
            return any(int(topo.slot_rank[b]) in out for b in later.tolist())

        # per slot: its rank's extra inside other groups that have a late member, over its mates'
        # (made when a second pass first needs it)
        rel_hot: np.ndarray | None = None
        # the window's ring positions, oldest first (the buckets ``_ring_sum`` adds up)
        w_pos = np.arange(int(self.bid.max()) - _WIN + 1, int(self.bid.max()) + 1) % _K

        def since_late(s: int, others: np.ndarray) -> float:
            """What the slots ``others`` (of slot ``s``'s rank) spent inside ops over their usual
            (``extra``) since ``s`` became late: from its last op before its window's first late
            bucket (late by half its threshold), each slot's ``extra`` cut to the share of its
            window's excess inside ops that came from then on. A wait before that op cannot have
            made it late; a slot late over the whole window keeps all of it."""
            got = np.clip(extra[others], 0.0, None)
            bo_s = self.bo[s, w_pos]
            lb = self.bl[s, w_pos] - np.nan_to_num(self.ref_lop[s]) * bo_s
            late_b = (bo_s > 0) & (lb >= 0.5 * float(self.thr[s]) * self.cfg.bucket_s)
            before = np.flatnonzero(bo_s[: int(np.argmax(late_b))] > 0) if late_b.any() else np.zeros(0, np.int64)
            start = int(before[-1]) if before.shape[0] else 0
            if start == 0 or not others.shape[0]:
                return float(got.sum())
            e = self.bd[np.ix_(others, w_pos)] - self.base_dur[others, None] * self.bo[np.ix_(others, w_pos)]
            tot, part = e.sum(axis=1), e[:, start:].sum(axis=1)
            f = np.clip(np.where(tot > 0, part / np.where(tot > 0, tot, 1.0), 1.0), 0.0, 1.0)
            return float((got * f).sum())

        first = ((s, "") for s in cand.tolist())
        # runs once the first pass is done
        again = ((s, why) for s, why, on in behind if all(root_in(ch, than) for ch, than in on))
        for s, second in itertools.chain(first, again):
            r = int(topo.slot_rank[s])
            if self.paused[s]:
                # its group paused: the ring no longer holds what made it a root; it stays what it was
                was = self._prev_roots.get(r)
                if was is not None and r not in out:
                    was.paused = True
                    was.between = bool(self.between[s])
                    out[r] = was
                continue
            mine = slots_of[ptr[r] : ptr[r + 1]]
            if topo.ch_parent[topo.slot_ch[s]] >= 0 and cross[mine].any():
                continue  # pipeline waits follow the schedule; a straggler also shows in its groups
            if frozen_ch is not None and frozen_ch.shape[0]:
                slow_mine = topo.slot_ch[mine][frozen_ch[topo.slot_ch[mine]]]
                if slow_mine.shape[0]:
                    # its transfers are slow: that is the suspect, its lateness follows from it — as far
                    # as they cost enough to explain it (a straggler's group-mates idle while it is late,
                    # and on a busy host their next transfer starts a little slower: that explains nothing)
                    if ch_excess is None or float(ch_excess[slow_mine].sum()) >= self.cfg.explain_k * float(
                        self.ex_late[s] if np.isfinite(self.ex_late[s]) else 0.0
                    ):
                        continue
            late_s = float(wl[s] - np.nan_to_num(self.ref_lop[s]) * wo[s])
            # a victim spends its lateness inside other ops (waiting, or in slow transfers);
            # a straggler spends it outside any op. Three ways to see it, any one makes a victim:
            # more waiting elsewhere than its group-mates...
            if float(rel[s]) >= self.cfg.explain_k * late_s:
                continue
            d_in = float(self.d_in[r])
            # waiting in another group on a member that is late there is that member's doing: it
            # says nothing of whether this rank is also slow itself (two stragglers in one group);
            # nor does, on the second pass, its waiting in this group on a root later still (a worse
            # straggler beside it: all its mates wait for that one, and it waits too, a little less)
            on_other = mine[
                (topo.slot_ch[mine] != topo.slot_ch[s]) & (hot_in_ch[topo.slot_ch[mine]] - hot[mine] > 0) & ~rare[mine]
            ]
            if second == "in":
                on_other = np.append(on_other, s)
            # what its mates here (a collective group) waited at their own sends and receives as
            # well, where a straggler already reported sits on its pipeline, or where they share its
            # node (a tensor-parallel group: one stage's shards, whose pipelines move in step at each
            # of its ops), for the outright test below
            shared_x = 0.0
            kept_pipe = bool(pipe_kept) and r not in keep and int(pipe[r]) in pipe_kept
            if not p2p_slot[s] and (mates := mates_of(s)) and (kept_pipe or not cross[s]):
                shared_x = shared_p2p(r, mates, extra)
            if kept_pipe and float(rel[s]) < 0.2 * late_s:
                # ...nor, at its pipeline's sends and receives, on a straggler already reported in
                # the same pipeline, where its mates here waited elsewhere about as much: the stages
                # next to it pass its delay along, to it and to them (a 1.3x rank two stages after a
                # reported 1.5x one, judged in its tensor-parallel group, waited 0.1 of its time more
                # at its receives and was excused at every other analysis). Not in a group whose
                # mates did not share that delay (the next stage's data-parallel reduce with the
                # other replica): there the wait is what made it late
                on_other = np.union1d(on_other, mine[p2p_slot[mine]])
            if pipe_slow and r not in keep and int(pipe[r]) in pipe_slow and not p2p_slot[on_other].any():
                # ...nor, at its sends and receives, on slow transfers along its pipeline, as far as
                # its mates here waited at theirs too: a slow link's delay runs along the pipelines
                # that cross it, and a 1.5x straggler at their first stage (the link between the
                # second and third), its waits at its receives 0.05-0.09 of its time over its
                # usual, was excused throughout. Only where every mate's pipeline carries slow
                # transfers too (a stage of a data-parallel group inside one node, upstream of a
                # slow NIC on one replica's pipeline, whose mates' pipelines did not, was named:
                # fresh-slow_rnic-003, rank 13), and only what its mates waited there as well:
                # what a member waited beyond them is what made it late (taken out whole, a first
                # stage that waited more than the other replica's was named a slow node)
                mates = mates_of(s)
                if mates and all(int(pipe[q]) in pipe_slow for q in mates):
                    d_in -= shared_p2p(r, mates, self.d_slot)
            if on_other.shape[0]:
                d_in -= float(np.clip(self.d_slot[on_other], 0.0, None).sum())
            skewed = mine[skew[mine]]  # ...nor does waiting at a save's barrier (above)
            if skewed.shape[0]:
                d_in -= float(np.clip(self.d_slot[skewed], 0.0, None).sum())
            if np.isfinite(d_in) and np.isfinite(self.usual_in[r]):
                # ...more time inside ops than its own usual: a rank whose own work grew by what makes
                # the others wait L seconds a second spends (1 - u) L less of its time inside ops (u:
                # the share of its time it usually spends outside them); one that waits on somebody
                # else spends u L more. Half-way between the two is the line; for a rank that costs
                # the job less than ``mild_slowdown`` (it holds ``mild_hold_s`` to be named), over the
                # job's common drift upwards (``d_common``): a straggler of 1.2x in tp4pp4dp2, costing
                # the job 1.04x, whose share rose 0.0-0.1 over its usual with everybody else's (its
                # usual, like theirs, learned low in the job's first seconds) was excused at every
                # analysis and never named (unseen-straggler-004). Not for the rest, named after
                # ``hold_s``: in pipelined jobs of uneven steps (``data+``) a healthy rank's share
                # swings by 0.1 either way from one analysis to the next, and over the drift four
                # were named in ``bench/probe_healthy.py --wide``'s 1,200 jobs. Nor while transfers
                # anywhere in the job are slow: their waits spread along the pipeline, and a stage
                # upstream of a slow NIC, late by its waits there, was named (fresh-slow_rnic-003,
                # rank 13). Nor for a rank whose waits on a late member elsewhere were taken out
                # above: without them it is left near zero, where the drift made it a straggler (the
                # next stage of a slow node, waiting on it at its receives: ``bench/probe_saves.py``,
                # tp4pp2dp4 `everything` seed 134, rank 29); the outright tests below judge it. A
                # drift downwards excuses nobody more
                u = float(np.clip(1.0 - self.usual_in[r], 0.0, 1.0))
                ex = float(self.ex_late[s]) if np.isfinite(self.ex_late[s]) else 0.0
                mild = self.imposed_by(mine) < self.cfg.mild_share
                over = d_common if mild and not slow_any and not on_other.shape[0] else 0.0
                if d_in - over > (u - 0.5) * ex:
                    if not second and hot_max[topo.slot_ch[s]] > hot_ex[s]:
                        behind.append((s, "in", [(int(topo.slot_ch[s]), float(hot_ex[s]))]))
                    continue
            if second == "out":
                # ...but a wait on somebody late that its mates here did not share is passed on:
                # the tensor-parallel mates of a straggler wait for it and reach their data-parallel
                # reduces late together, where their mates (other nodes) waited on nobody. Their
                # waits overall, jitter included, can be as long by chance, which let them through
                # as second stragglers; a second straggler's mates wait on late members as it does
                if rel_hot is None:
                    w = self._elsewhere(np.where(hot_in_ch[topo.slot_ch] - hot > 0, extra, 0.0), topo)
                    rel_hot = w - self._lower_median(w, topo)
                if float(rel_hot[s]) >= self.cfg.explain_k * late_s:
                    continue
            if second != "out":
                # ...or, outright, much more waiting elsewhere than its lateness; or it waited, in
                # another group, for a member that is late there itself. Not counting what its mates
                # here waited at their own sends and receives as well, where a reported straggler
                # sits on its pipeline: that is the straggler's delay passed along to all of them (a
                # 1.3x rank two stages after a reported 1.5x one waited 0.3-0.45 s of the window at
                # its receives, over one and a half times its lateness in its tensor-parallel group,
                # and its mate there 0.28-0.43 s at its own: excused at nearly every analysis and
                # never named). Only what they share, as for a slow link above: the next stage of a
                # reported straggler, late at its data-parallel reduce where the other replica waited
                # on nobody, is to stay its victim (taking out the whole of its own waits instead
                # printed the same on every split and probe it was run on: no test pins the bound).
                # Nor, likewise, where its mates here share its node, whether or not a straggler is
                # reported: two stragglers of one pipeline each wait along it for the other (with one
                # microbatch every stage waits for all the others), and each was excused outright by
                # 0.25-0.9 s of the window elsewhere against a lateness of 0.15-0.3 s, most of it
                # waits along the pipeline that its tensor-parallel mate had as well: the first named
                # 24.6 s after its onset, the second never. Not across nodes: a data-parallel group's
                # mates there are other replicas, whose waits along their own pipelines are not its
                # (taken out there, a stage waiting on the next stage's second straggler fell under
                # the test and its node was named)
                others = mine[(topo.slot_ch[mine] != topo.slot_ch[s]) & ~hot[mine]]
                waited = others[
                    (late_in_ch[topo.slot_ch[others]] - late_member[others] > 0) & (extra[others] > 0.2 * late_s)
                ]
                # What it waited elsewhere counts from its last op on time (``since_late``): a GC
                # pause of a data-parallel mate held rank 9 of tp8dp4 (`gc~`, 10/s) 0.54 s two
                # seconds before its onset as a 1.5x straggler, inside the window its first
                # lateness (0.27-0.33 s) was judged over, and it passed as that wait's victim for a
                # second (probe seed 61207's straggler_ends-002, named 3.3 s after its onset)
                away = float(elsewhere[s])
                if away - shared_x >= 1.5 * late_s:
                    away = since_late(s, mine[topo.slot_ch[mine] != topo.slot_ch[s]])
                if away - shared_x >= 1.5 * late_s or waited.shape[0]:
                    # (its mates waited about as much elsewhere: on the second pass, if all it waited
                    # on were roots, the wait they shared is not what made it later than them)
                    on = mine[(topo.slot_ch[mine] != topo.slot_ch[s]) & (extra[mine] > 0.2 * late_s)]
                    if not second and float(rel[s]) < 0.2 * late_s and on.shape[0]:
                        behind.append((s, "out", [(int(c), -np.inf) for c in topo.slot_ch[on].tolist()]))
                    continue
            ex = float(self.ex_late[s])
            got = out.get(r)
            if got is None or got.paused:
                got = out[r] = Straggler(rank=r, excess=ex, threshold=float(self.thr[s]), onset=float(self.onset[s]))
            elif ex > got.excess:
                got.excess, got.threshold = ex, float(self.thr[s])
            got.onset = float(np.fmin(got.onset, self.onset[s]))
            got.steady = got.steady or bool(self.steady[s])
            got.slots.append(s)
        self._drop_common_mode(out, hot, topo)
        return out

    def _drop_common_mode(self, out: dict[int, Straggler], hot: np.ndarray, topo: Topology) -> None:
        """Drop roots whose lateness they share with group-mates that are victims.

        Ranks of one collective group (tensor parallel) leave each of its ops together, so a delay
        anywhere upstream of it (a GC pause of one of them, a wait on a pipeline neighbour) makes
        them all equally late at their next groups. The victim tests weigh each rank's lateness
        against its own waiting over a window; a rank whose window also holds one pause of its own
        is left short of an excuse while its mates are excused, and is named for the whole
        group's lateness. A straggler of its own is last in the shared group too (its mates wait
        for it there), and a slow node's ranks are roots together: so a root that is not late in a
        collective group of its own, where most mates are late elsewhere by half its excess or more
        and are not roots, is one of those victims.
        """
        live = [r for r, st in out.items() if not st.paused]
        if not live:
            return
        ptr, slots_of = topo.rank_slots()
        # per rank, its largest excess over its hot slots, the channel of that slot, and the next
        # largest (on another slot): "late elsewhere than in group ch" without a pass over its slots
        ex = np.nan_to_num(self.ex_late[: hot.shape[0]], nan=0.0)
        hs = np.flatnonzero(hot & (ex > 0))
        best, second = np.zeros(topo.world), np.zeros(topo.world)
        best_ch = np.full(topo.world, -1, np.int64)
        if hs.shape[0]:
            hr, hv = topo.slot_rank[hs], ex[hs]
            order = np.lexsort((-hv, hr))
            hr, hv, hc = hr[order], hv[order], topo.slot_ch[hs][order]
            head = np.r_[True, hr[1:] != hr[:-1]]
            best[hr[head]], best_ch[hr[head]] = hv[head], hc[head]
            nxt = np.flatnonzero(~head & np.r_[False, head[:-1]])  # each rank's second hot slot
            second[hr[nxt]] = hv[nxt]
        is_root = np.zeros(topo.world, bool)
        is_root[list(out)] = True
        for r in live:
            st = out[r]
            mine = slots_of[ptr[r] : ptr[r + 1]]
            # the groups where it is judged not late itself: not hot there, and not late by a quarter
            # of its excess either (a straggler's slot there may not have added up its evidence yet);
            # a group with too few recent ops to judge (a world group's rare barriers) says nothing
            mine_ex = self.ex_late[mine]
            shared = mine[
                (topo.ch_parent[topo.slot_ch[mine]] < 0)
                & ~hot[mine]
                & np.isfinite(mine_ex)
                & (mine_ex < 0.25 * st.excess)
            ]
            for b in shared.tolist():
                ch = int(topo.slot_ch[b])
                lo, size = int(topo.ch_off[ch]), int(topo.ch_size[ch])
                mates = topo.slot_rank[lo : lo + size]
                mates = mates[mates != r]
                if not mates.shape[0]:
                    continue
                elsewhere = np.where(best_ch[mates] != ch, best[mates], second[mates])
                late_too = int(np.count_nonzero(~is_root[mates] & (elsewhere >= 0.5 * st.excess)))
                if 2 * late_too > mates.shape[0]:
                    del out[r]
                    is_root[r] = False
                    break
