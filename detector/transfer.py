"""Communication slowness: transfers slower than the group's own baseline while nobody is late.

The part of a collective nobody waits for — the shortest time any member spends inside it, the
last arriver's — is the transfer. Per (channel, op class) the tracker learns a baseline of its
logarithm (the median of the first blocks, then the running mean of every block while the channel
is not significantly slow, in both directions, so a baseline drawn from a few unlucky blocks of a
warm-up does not stick) and the spread of one block's logarithm around the short-term level, and
keeps short moving averages of the ratio to the baseline, of the share of blocks over
``comm_ratio`` (over half as long: the majority must be recent, and a fault shows in it half a
second sooner), and of the excess seconds per second of wall-clock.

A channel is *slow* when its transfers are over ``comm_ratio`` times their baseline in most blocks,
and by at least ``comm_z`` standard errors of that comparison (the spread over the number of blocks
behind the short average and behind the baseline: a gloo all-reduce on a busy host varies tenfold
from op to op, and a 30% swing of a few blocks' mean is nothing there), and the excess costs at
least ``comm_channel_effect`` of wall-clock (in a group's first ``comm_warm_s``, whose baseline
and spread come from a few blocks, twice the standard errors and at least twice
``comm_min_effect``); *healthy* when an established baseline and recent
blocks put it at or under ``comm_healthy_ratio``. What a slow channel can explain of its
members' lateness (``ex_held``) is its excess as of its last blocks while it is quiet (a pause
keeps the lateness it caused), for up to ``pause_s``. Localisation (``rankwatch.detector.localise``)
takes it from there.
"""

from __future__ import annotations

import numpy as np

from rankwatch.detector.cells import CellStats
from rankwatch.detector.config import DetectorConfig

__all__ = ["TransferTracker"]

_INIT = 8
_SHARE_K = 0.5  # the share of slow blocks is averaged over this part of the ratio's time
_SIG_BLOCKS = 64  # a block's spread is averaged over about this many recent blocks


def _row_median(x: np.ndarray) -> np.ndarray:
    """Median of each row (no nan), as ``np.median`` computes it."""
    xs = np.sort(x, axis=1)
    k = x.shape[1]
    return 0.5 * (xs[:, (k - 1) // 2] + xs[:, k // 2])


class TransferTracker:
    """Baselines and moving averages of transfer time per (channel, op class)."""

    def __init__(self, cfg: DetectorConfig) -> None:
        self.cfg = cfg
        self.t = float("nan")
        self._keys = np.zeros(0, np.int64)  # sorted (channel << 11 | class)
        self._perm = np.zeros(0, np.int64)  # entry of each sorted key
        self.n = 0
        self.ch = np.zeros(0, np.int64)
        self.base = np.zeros(0)
        self.sig = np.zeros(0)  # spread (sd) of one block's log transfer around the short-term level
        self.nb = np.zeros(0)  # blocks behind the baseline
        self.n_init = np.zeros(0, np.int64)
        self.init_buf = np.zeros((0, _INIT))
        self.S = np.zeros(0)
        self.W = np.zeros(0)
        self.EX = np.zeros(0)
        self.SF = np.zeros(0)
        self.SW = np.zeros(0)  # weight behind SF (a shorter average than W's)
        self.last = np.zeros(0)
        self.first = np.zeros(0)
        self.ncell = np.zeros(0)
        self.cur = np.zeros(0)  # latest block transfer time, seconds per op
        # per channel results of the last ``status``
        self.ratio = np.zeros(0)
        self.ex_rate = np.zeros(0)
        # per channel: its excess as of the last analysis that brought it blocks, and when
        self.ex_last = np.zeros(0)
        self.ex_last_t = np.zeros(0)
        self.ex_held = np.zeros(0)
        self._fresh: list[np.ndarray] = []
        self.slow_frac = np.zeros(0)
        self.weight = np.zeros(0)
        self.base_s = np.zeros(0)
        self.now_s = np.zeros(0)
        self.established = np.zeros(0, bool)
        self.se = np.zeros(0)

    def reset(self) -> None:
        self.__init__(self.cfg)  # type: ignore[misc]

    def _entries(self, keys: np.ndarray) -> np.ndarray:
        if self._keys.shape[0]:  # usually every key is known: no need to find the new ones
            pos = np.minimum(np.searchsorted(self._keys, keys), self._keys.shape[0] - 1)
            if (self._keys[pos] == keys).all():
                return self._perm[pos]
        uniq = np.unique(keys)
        if self._keys.shape[0]:
            pos = np.minimum(np.searchsorted(self._keys, uniq), self._keys.shape[0] - 1)
            new = uniq[self._keys[pos] != uniq]
        else:
            new = uniq
        if new.shape[0]:
            k = new.shape[0]
            start = self.n
            self.n += k
            grow = lambda a, fill: np.concatenate([a, np.full((k, *a.shape[1:]), fill, a.dtype)])  # noqa: E731
            self.ch = grow(self.ch, 0)
            self.ch[start:] = new >> 11
            self.base = grow(self.base, np.nan)
            self.sig = grow(self.sig, np.nan)
            self.nb = grow(self.nb, 0.0)
            self.first = grow(self.first, np.nan)
            self.n_init = grow(self.n_init, 0)
            self.init_buf = grow(self.init_buf, np.nan)
            for name in ("S", "W", "EX", "SF", "SW", "last", "cur", "ncell"):
                setattr(self, name, grow(getattr(self, name), 0.0))
            allk = np.concatenate([self._keys, new])
            allp = np.concatenate([self._perm, np.arange(start, self.n)])
            o = np.argsort(allk, kind="stable")
            self._keys, self._perm = allk[o], allp[o]
        return self._perm[np.searchsorted(self._keys, keys)]

    def _tau(self) -> np.ndarray:
        """Per entry: the averaging time, at least four of its own blocks apart."""
        interval = np.where(self.ncell > 1, (self.last - self.first) / np.maximum(self.ncell - 1, 1), 0.0)
        return np.maximum(self.cfg.tau_s, 4.0 * np.nan_to_num(interval, nan=0.0))

    def update(self, now: float, st: CellStats, frozen_ch: np.ndarray) -> None:
        """Add analysed blocks; ``frozen_ch`` marks channels whose baselines must not learn now."""
        cfg = self.cfg
        dt = 0.0 if np.isnan(self.t) else max(0.0, now - self.t)
        # each (channel, class) averages over at least four of its own blocks: a group that runs
        # one op a second is judged over seconds, one that runs hundreds over ``tau_s``
        tau_e = self._tau()
        if dt:
            k = np.exp(-dt / tau_e)
            self.S *= k
            self.W *= k
            self.EX *= k
            k2 = np.exp(-dt / (_SHARE_K * tau_e))
            self.SF *= k2
            self.SW *= k2
        self.t = now
        m = st.c_transfer > 0
        if not m.any():
            return
        ch, cls = st.c_ch[m], st.c_cls[m]
        tr, cnt, t = st.c_transfer[m], st.c_cnt[m], st.c_t[m]
        e = self._entries((ch << 11) | cls)
        lt = np.log(tr)
        self.last[e] = np.maximum(self.last[e], t)
        self.first[e] = np.fmin(self.first[e], t)
        np.add.at(self.ncell, e, 1.0)
        self.cur[e] = tr
        # entries still learning their baseline: keep the first blocks, take their median
        learning = self.n_init[e] < _INIT
        if learning.any():
            self._learn_init(e[learning], lt[learning])
        est = ~np.isnan(self.base[e])
        if not est.any():
            return
        e, lt, tr, cnt, t, ch = e[est], lt[est], tr[est], cnt[est], t[est], ch[est]
        self._fresh.append(ch)
        age = np.clip(now - t, 0.0, None)
        tau_b = self._tau()[e]
        w = np.exp(-age / tau_b)
        w2 = np.exp(-age / (_SHARE_K * tau_b))
        lr = lt - self.base[e]
        np.add.at(self.S, e, lr * w)
        np.add.at(self.W, e, w)
        np.add.at(self.EX, e, (tr - np.exp(self.base[e])) * cnt * w)
        np.add.at(self.SF, e, (lr > np.log(cfg.comm_ratio)) * w2)
        np.add.at(self.SW, e, w2)
        u, inv = np.unique(e, return_inverse=True)
        cnts = np.bincount(inv, None, u.shape[0])
        chu = self.ch[u]
        fz = np.where(chu < frozen_ch.shape[0], frozen_ch[np.minimum(chu, max(0, frozen_ch.shape[0] - 1))], False)
        cur = self.S[u] / np.maximum(self.W[u], 1e-12)
        # a block's spread: its distance from the short-term level (not from the baseline: an offset
        # is what the comparison is for, not noise), large swings clipped, over the recent blocks
        sig = np.nan_to_num(self.sig[u], nan=0.0)
        dev = np.abs(lr - cur[inv])
        dev = np.minimum(dev, np.maximum(4.0 * sig[inv], 0.05))
        mdev = np.bincount(inv, dev, u.shape[0]) / cnts
        learn = ~fz
        a_s = np.minimum(1.0, cnts / np.maximum(np.minimum(self.ncell[u], _SIG_BLOCKS), 1.0))
        self.sig[u[learn]] = sig[learn] + a_s[learn] * (1.2533 * mdev[learn] - sig[learn])
        # the baseline follows drift, never a fault: it learns while the channel is not significantly
        # slow — at first as the running mean of every block seen (the first blocks may all be a
        # warm-up's, or just unlucky), later with ``baseline_tau_s``
        if dt:
            se = self._se(u)
            upd = (self.n_init[u] >= _INIT) & ~fz & (cur < np.maximum(np.log(cfg.comm_healthy_ratio), cfg.comm_z * se))
            sums = np.bincount(inv, np.clip(lr, -0.5, 0.5), u.shape[0])
            uu = u[upd]
            # blocks behind the baseline, at most about what ``baseline_tau_s`` holds
            span = np.maximum(self.last[uu] - self.first[uu], 1e-9)
            per_s = np.maximum(self.ncell[uu] - 1.0, 1.0) / span
            self.nb[uu] = np.minimum(self.nb[uu] + cnts[upd], np.maximum(_INIT, per_s * cfg.baseline_tau_s))
            a = np.maximum(min(1.0, dt / cfg.baseline_tau_s), cnts[upd] / self.nb[uu])
            self.base[uu] += np.minimum(a, 1.0) * sums[upd] / cnts[upd]

    def _learn_init(self, e: np.ndarray, lt: np.ndarray) -> None:
        """Keep the first blocks of entries still learning (in arrival order); once there are
        enough, their median is the baseline and their MAD the spread. All entries at once: a big
        job's channels all reach their first blocks within a few seconds of each other."""
        order = np.argsort(e, kind="stable")
        es, ls = e[order], lt[order]
        idx = np.arange(es.shape[0])
        start = np.ones(es.shape[0], bool)
        start[1:] = es[1:] != es[:-1]
        pos = self.n_init[es] + idx - np.maximum.accumulate(np.where(start, idx, 0))
        keep = pos < _INIT
        self.init_buf[es[keep], pos[keep]] = ls[keep]
        u = es[start]
        self.n_init[u] = np.minimum(_INIT, self.n_init[u] + np.diff(np.r_[np.flatnonzero(start), es.shape[0]]))
        done = u[self.n_init[u] >= min(_INIT, self.cfg.comm_warm_cells)]
        for k in np.unique(self.n_init[done]).tolist():
            j = done[self.n_init[done] == k]
            buf = self.init_buf[j, :k]
            base = _row_median(buf)
            self.base[j] = base
            self.sig[j] = 1.4826 * _row_median(np.abs(buf - base[:, None]))
            self.nb[j] = float(k)

    def _se(self, e: np.ndarray) -> np.ndarray:
        """Per entry: standard error of its short-term mean log ratio to the baseline."""
        sig = np.nan_to_num(self.sig[e], nan=0.0)
        return sig * np.sqrt(1.0 / np.maximum(self.W[e], 1.0) + 1.0 / np.maximum(self.nb[e], 1.0))

    def status(self, n_channels: int) -> tuple[np.ndarray, np.ndarray]:
        """(slow, healthy) boolean arrays over channels, from the moving averages."""
        cfg = self.cfg
        est = ~np.isnan(self.base)
        ch = self.ch
        W = np.bincount(ch, self.W * est, n_channels).astype(np.float64)
        S = np.bincount(ch, self.S * est, n_channels)
        tau_e = self._tau()
        EX = np.bincount(ch, self.EX * est / tau_e, n_channels)
        SF = np.bincount(ch, self.SF * est, n_channels)
        SW = np.bincount(ch, self.SW * est, n_channels)
        wb = np.bincount(ch, np.nan_to_num(np.exp(self.base)) * self.W, n_channels)
        wc = np.bincount(ch, self.cur * self.W, n_channels)
        nest = np.bincount(ch, est.astype(np.float64), n_channels)
        safe = np.maximum(W, 1e-12)
        # the channel's mean is its entries' weighted by W: its variance theirs weighted by W squared
        var = np.bincount(ch, np.where(est, (self.W * self._se(np.arange(self.n))) ** 2, 0.0), n_channels)
        self.se = np.sqrt(var) / safe
        self.ratio = np.exp(S / safe)
        self.ex_rate = EX.astype(np.float64)
        # what a slow channel can explain of its members' lateness: its excess as of its last
        # blocks while it is quiet (a pause keeps the lateness it caused, so it keeps the excuse)
        if self.ex_last.shape[0] < n_channels:
            grow = n_channels - self.ex_last.shape[0]
            self.ex_last = np.r_[self.ex_last, np.zeros(grow)]
            self.ex_last_t = np.r_[self.ex_last_t, np.full(grow, -np.inf)]
        if self._fresh:
            fresh = np.unique(np.concatenate(self._fresh))
            fresh = fresh[fresh < n_channels]
            self._fresh = []
            self.ex_last[fresh] = self.ex_rate[fresh]
            self.ex_last_t[fresh] = self.t
        quiet_ok = (self.t - self.ex_last_t[:n_channels]) <= cfg.pause_s
        self.ex_held = np.where(quiet_ok, np.maximum(self.ex_rate, self.ex_last[:n_channels]), self.ex_rate)
        self.slow_frac = SF / np.maximum(SW, 1e-12)
        self.weight = W
        self.base_s = wb / safe
        self.now_s = wc / safe
        self.established = nest > 0
        enough = W >= 1.0
        # a young group's baseline and spread come from a few blocks of its first seconds (on a
        # busy host these swing together for seconds at a time): it must be slower, and cost more
        first = np.full(n_channels, np.inf)
        np.minimum.at(first, ch, np.where(np.isnan(self.first), np.inf, self.first))
        young = (self.t - first) < cfg.comm_warm_s
        z = np.where(young, 2.0 * cfg.comm_z, cfg.comm_z)
        effect = np.where(young, max(cfg.comm_channel_effect, 2.0 * cfg.comm_min_effect), cfg.comm_channel_effect)
        slow = (
            enough
            & (self.ratio >= cfg.comm_ratio)
            & (np.log(self.ratio) >= z * self.se)
            & (self.ex_rate >= effect)
            & (self.slow_frac >= 0.5)
        )
        healthy = enough & self.established & (self.ratio <= cfg.comm_healthy_ratio)
        return slow, healthy
