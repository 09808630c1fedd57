"""The shortcuts taken for large jobs give exactly what the plain computations give."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from rankwatch.detector import DetectorConfig
from rankwatch.detector import topology as topology_mod
from rankwatch.detector.job import _max_per, _raise_to
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


def test_raise_to_is_maximum_at() -> None:
    rng = np.random.default_rng(4)
    for dtype in (np.int64, np.float64):
        a = rng.integers(0, 50, 40).astype(dtype)
        idx = rng.integers(0, 40, 300)
        v = rng.integers(0, 60, 300).astype(dtype)
        if dtype is np.float64:
            v[7] = np.nan
        want = a.copy()
        with np.errstate(invalid="ignore"):
            np.maximum.at(want, idx, v)
            _raise_to(a, *_max_per(idx, v))
        assert np.array_equal(a, want, equal_nan=True)


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
