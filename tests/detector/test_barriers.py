"""The barrier judgement on its own: who held up a whole-job group's rare ops, and who always does."""

from __future__ import annotations

import numpy as np

from rankwatch.detector import DetectorConfig
from rankwatch.detector.barriers import BarrierTracker
from rankwatch.detector.cells import CellStats
from rankwatch.detector.topology import Topology

WORLD = 16  # two nodes of eight


def _topology() -> tuple[Topology, int]:
    topo = Topology()
    topo.ensure_world(WORLD)
    for r in range(WORLD):
        topo.set_node(r, f"node{r // 8}")
    return topo, topo.register_groups([{"id": "world", "ranks": [[0, WORLD, 1]], "desc": "default"}], 0)[0]


def _barrier(ch: int, t: float, late: np.ndarray) -> CellStats:
    """One analysed barrier of the whole-job group: every member's lateness there, in seconds."""
    n = late.shape[0]
    inside = late.max() - late + 0.01  # the last to arrive spends the least time inside
    one = np.ones(n)
    return CellStats(
        slot=np.arange(n),
        cell=np.zeros(n, np.int64),
        cnt=one,
        mean=inside,
        late=late,
        wait=inside - inside.min(),
        dur=inside,
        lateflag=late > 0.5 * late.max(),
        t=np.full(n, t),
        t0=t - late.max() + late,
        c_ch=np.array([ch]),
        c_cls=np.zeros(1, np.int64),
        c_cnt=np.ones(1),
        c_transfer=np.array([0.01]),
        c_max=np.array([inside.max()]),
        c_t=np.array([t]),
        c_n=np.array([n]),
    )


def _run(lateness) -> list[tuple[str, list[int], float]]:  # type: ignore[no-untyped-def]
    """Barriers every 5 s, the i-th with ``lateness(i, rng)``; what is named after each."""
    topo, ch = _topology()
    bt = BarrierTracker(DetectorConfig())
    rng = np.random.default_rng(7)
    named = []
    for i in range(12):
        t = 5.0 * (i + 1)
        bt.update(_barrier(ch, t, lateness(i, rng)), topo, np.array([i]))
        named += [(b.level, b.ranks, t) for b in bt.analyse(t + 0.5, topo)]
    return named


def test_a_rank_that_writes_slower_from_the_fifth_save_is_named_and_the_usual_one_is_not() -> None:
    def lateness(i: int, rng: np.random.Generator) -> np.ndarray:
        late = rng.uniform(0.0, 1.0, WORLD)
        late[0] += 1.5  # rank 0 writes more at every save (the job's way): never a straggler
        if i >= 5:
            late[9] += 3.0  # rank 9 is slower from the sixth save on
        return late

    named = _run(lateness)
    assert {(lv, tuple(rs)) for lv, rs, _ in named} == {("rank", (9,))}, named
    assert min(t for _, _, t in named) <= 35.0  # the second of its saves (30 s, 35 s)


def test_a_node_late_together_is_the_node_and_nobody_before_three_saves() -> None:
    def lateness(i: int, rng: np.random.Generator) -> np.ndarray:
        late = rng.uniform(0.0, 1.0, WORLD)
        late[8:] += 1.0  # node1's ranks write slower from the first save on: learnt, not named
        return late

    assert _run(lateness) == []

    def later(i: int, rng: np.random.Generator) -> np.ndarray:
        late = rng.uniform(0.0, 1.0, WORLD)
        if i >= 4:
            late[:8] += 1.0  # node0 from the fifth save on
        return late

    named = _run(later)
    assert {(lv, tuple(rs)) for lv, rs, _ in named} == {("node", tuple(range(8)))}, named
