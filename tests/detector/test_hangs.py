"""Hang analysis on its own: which stuck groups are communication hangs."""

from __future__ import annotations

import numpy as np

from rankwatch.detector import DetectorConfig
from rankwatch.detector.hangs import ProgressTracker
from rankwatch.detector.topology import Topology


def _stuck_world(cfg: DetectorConfig) -> tuple[Topology, ProgressTracker, float]:
    """Four ranks on two nodes, all inside all-reduce 122 since t=100."""
    topo = Topology()
    topo.ensure_world(4)
    for r in range(4):
        topo.set_node(r, "nodeA" if r < 2 else "nodeB")
    topo.register_groups([{"id": "0", "ranks": [[0, 4, 1]]}], 0)
    prog = ProgressTracker(cfg)
    prog.ensure(topo.n_slots, topo.n_channels)
    prog.entered[:] = 122
    prog.completed[:] = 121
    prog.since[:] = 100.0
    return topo, prog, 100.0 + cfg.hang_warm_floor_s + 5.0


def test_a_member_silent_inside_the_stuck_op_is_not_a_communication_hang() -> None:
    # a rank SIGSTOPped inside an all-reduce: its last heartbeat said it had entered, like every
    # other member, so all are in and none finishes, the shape of a communication hang. A real
    # four-rank gloo job (tests/e2e, under load) had it named on the link between its two nodes a
    # second before the rank was named dead; its silence is what the others wait for
    cfg = DetectorConfig()
    topo, prog, now = _stuck_world(cfg)
    none = np.zeros(4, bool)
    silent = np.array([False, True, False, False])
    rep = prog.analyse(now, topo, silent, none, none)
    assert [g.seq for g in rep.stuck] == [122]
    assert not rep.comm_roots and not rep.noncomm_roots and rep.deferred == {1}
    # a member that left (crashed, terminated) inside it alike
    rep = prog.analyse(now, topo, none, none, silent)
    assert not rep.comm_roots and rep.deferred == {1}
    # with every member alive it is a communication hang
    rep = prog.analyse(now, topo, none, none, none)
    assert [g.seq for g in rep.comm_roots] == [122] and sorted(rep.comm_roots[0].waiting) == [0, 1, 2, 3]
