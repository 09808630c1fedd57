"""The shortcuts taken for large jobs give exactly what the plain computations give."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from rankwatch.detector import DetectorConfig
from rankwatch.detector import lateness as lateness_mod
from rankwatch.detector import topology as topology_mod
from rankwatch.detector.cells import CellStats
from rankwatch.detector.lateness import LatenessTracker
from rankwatch.detector.topology import Topology
from rankwatch.detector.transfer import TransferTracker


def _topology(world: int, rng: np.random.Generator) -> Topology:
    topo = Topology()
    topo.ensure_world(world)
    for r in range(world):
        topo.set_node(r, f"n{r // 4}")
    perm = rng.permutation(world)
    groups = [{"id": "all", "ranks": [[0, world, 1]]}]
    for size in (2, 3, 4, 8):
        for k in range(world // size):
            members = perm[k * size : (k + 1) * size]
            groups.append({"id": f"g{size}-{k}", "ranks": [[int(m), int(m) + 1, 1] for m in members]})
        perm = rng.permutation(world)
    topo.register_groups(groups, 0)
    parent = topo.channel_id["g8-0"]
    topo.p2p_channels(np.array([parent] * 3), np.array([0, 1, 5]), np.array([1, 0, 6]))
    return topo


def test_slot_lookup_by_rank_table_matches_the_search(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(3)
    topo = _topology(64, rng)
    ch = rng.integers(-2, topo.n_channels + 2, 5000)
    ranks = rng.integers(-3, 70, 5000)
    ch[:64], ranks[:64] = 0, np.arange(64)  # every rank is in the default group
    assert topo.rank_table() is not None
    fast = topo.slot_of(ch, ranks)
    fast_all = topo.slots_of_ranks(np.arange(-2, 70))
    monkeypatch.setattr(topology_mod, "_TABLE_MAX_SLOTS", 0)
    topo._table_world = -1
    assert topo.rank_table() is None
    assert np.array_equal(fast, topo.slot_of(ch, ranks))
    assert np.array_equal(fast_all, topo.slots_of_ranks(np.arange(-2, 70)))
    assert (fast[:64] >= 0).all() and (fast >= 0).sum() > 64
    hit = fast >= 0
    assert np.array_equal(topo.slot_rank[fast[hit]], ranks[hit])
    assert np.array_equal(topo.slot_ch[fast[hit]], ch[hit])


def _stats(rng: np.random.Generator, n_rows: int, n_slots: int, t_hi: float, slot_pool: int) -> CellStats:
    """Rows of blocks: some slots with several rows, blocks from a fraction of a bucket to several."""
    t = np.sort(rng.uniform(t_hi - 3.0, t_hi, n_rows))
    span = rng.choice([0.05, 0.3, 0.9, 1.7, 6.0], n_rows) * rng.uniform(0.5, 1.0, n_rows)
    cnt = rng.integers(1, 64, n_rows).astype(np.float64)
    z = np.zeros(n_rows)
    return CellStats(
        slot=rng.integers(0, min(slot_pool, n_slots), n_rows),
        cell=np.arange(n_rows),
        cnt=cnt,
        mean=z,
        late=rng.exponential(0.01, n_rows) * cnt,
        wait=z,
        dur=rng.exponential(0.02, n_rows) * cnt,
        lateflag=rng.random(n_rows) < 0.3,
        t=t,
        t0=t - span,
        c_ch=np.zeros(n_rows, np.int64),
        c_cls=np.zeros(n_rows, np.int64),
        c_cnt=cnt,
        c_transfer=z,
        c_max=z,
        c_t=t,
        c_n=np.full(n_rows, 2),
    )


@pytest.mark.parametrize(
    "n_rows, slot_pool, n_slots, chunk",
    [
        (40, 10_000, 20_000, 16384),  # few rows: added at the rows
        (400, 50, 20_000, 16384),  # ...slots with several rows among them
        (3000, 50, 300, 16384),  # many rows for a small ring: one pass over it
        (3000, 100_000, 110_000, 7),  # a big ring: a block of rows at a time
    ],
)
def test_ring_adds_match_a_block_by_block_sum(
    monkeypatch: pytest.MonkeyPatch, n_rows: int, slot_pool: int, n_slots: int, chunk: int
) -> None:
    """Blocks spread over the buckets they cover, added row block by row block (slots with one row
    at once, slots with several one by one): the ring holds each (slot, bucket)'s plain sum."""
    monkeypatch.setattr(lateness_mod, "_ROWS", chunk)
    cfg = DetectorConfig()
    rng = np.random.default_rng(n_rows)
    k = lateness_mod._K
    tr = LatenessTracker(cfg)
    want: dict[tuple[int, int], np.ndarray] = {}
    for now in (10.0, 11.3, 12.1):
        st = _stats(rng, n_rows, n_slots, now, slot_pool)
        tr.update(now, st, np.zeros(n_rows, np.int64), n_slots, 1, np.zeros(n_rows, np.int64), None, spread=True)
        for i in range(n_rows):
            t = min(float(st.t[i]), now)
            t0 = min(float(st.t0[i]), t)
            top = int(np.floor(t / cfg.bucket_s))
            n_b = min(top - int(np.floor(t0 / cfg.bucket_s)), k - 1) + 1 if t - t0 > cfg.bucket_s else 1
            for j in range(n_b):
                b = top - j
                lo, hi = max(t0, b * cfg.bucket_s), min(t, (b + 1) * cfg.bucket_s)
                w = max(hi - lo, 0.0) / max(t - t0, 1e-12) if n_b > 1 else 1.0
                x = np.array([st.late[i], st.dur[i], st.cnt[i]]) * w
                key = (int(st.slot[i]), b)
                want[key] = want.get(key, np.zeros(3)) + x
    held = 0
    for p in range(k):
        b = int(tr.bid[p])
        got = np.stack([tr.bl[:n_slots, p], tr.bd[:n_slots, p], tr.bo[:n_slots, p]], axis=1)
        exp = np.zeros((n_slots, 3))
        for (slot, bb), x in want.items():
            if bb == b:
                exp[slot] = x
                held += 1
        np.testing.assert_allclose(got, exp, rtol=1e-5, atol=1e-7)
    assert held > min(n_rows, slot_pool * k) // 2  # most of what came in is still in the ring
    last = {}
    for slot, b in want:
        if b >= int(tr.bid.max()) - k + 1:
            last[slot] = max(last.get(slot, b), b)
    assert all(int(tr.last_bid[s]) == b for s, b in last.items())


def test_lower_median_by_channel_size_matches_a_sort() -> None:
    rng = np.random.default_rng(5)
    topo = _topology(64, rng)
    late = LatenessTracker(DetectorConfig())
    x = rng.normal(size=topo.n_slots)
    x[rng.random(topo.n_slots) < 0.2] = np.nan
    x[rng.random(topo.n_slots) < 0.1] = np.inf
    order = np.lexsort((x, topo.slot_ch))
    want = x[order][topo.ch_off + (topo.ch_size - 1) // 2][topo.slot_ch]
    assert np.array_equal(late._lower_median(x, topo), want, equal_nan=True)


def _learn_init_one_by_one(xfer: TransferTracker, e: np.ndarray, lt: np.ndarray) -> None:
    """The first-block baselines as they were learned before: entry by entry, in order."""
    for j, v in zip(e.tolist(), lt.tolist(), strict=True):
        if xfer.n_init[j] < 8:
            xfer.init_buf[j, xfer.n_init[j]] = v
            xfer.n_init[j] += 1
            if xfer.n_init[j] >= min(8, xfer.cfg.comm_warm_cells):
                buf = xfer.init_buf[j, : xfer.n_init[j]]
                xfer.base[j] = float(np.nanmedian(buf))
                xfer.sig[j] = 1.4826 * float(np.nanmedian(np.abs(buf - xfer.base[j])))
                xfer.nb[j] = float(xfer.n_init[j])


@pytest.mark.parametrize("warm", [1, 3, 8, 12])
def test_transfer_baselines_from_first_blocks_match_one_by_one(warm: int) -> None:
    rng = np.random.default_rng(warm)
    fast = TransferTracker(DetectorConfig(comm_warm_cells=warm))
    fast._entries(np.arange(30, dtype=np.int64) << 11)
    slow = copy.deepcopy(fast)
    for _ in range(6):
        e = rng.integers(0, 30, int(rng.integers(1, 40)))  # repeats: several blocks of one entry at once
        lt = rng.normal(-8.0, 0.3, e.shape[0])
        learning = fast.n_init[e] < 8
        fast._learn_init(e[learning], lt[learning])
        _learn_init_one_by_one(slow, e, lt)
        for name in ("n_init", "init_buf", "base", "sig", "nb"):
            assert np.array_equal(getattr(fast, name), getattr(slow, name), equal_nan=True), name
    assert (fast.n_init == 8).any() and not np.isnan(fast.base).all()
