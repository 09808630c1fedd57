"""What the detector's topology derives from the groups the ranks register."""

from __future__ import annotations

import numpy as np

from rankwatch.detector.topology import Topology


def test_a_pipeline_is_the_ranks_joined_by_sends_and_receives() -> None:
    topo = Topology()
    topo.ensure_world(8)
    topo.register_groups([{"id": "all", "ranks": [[0, 8, 1]]}], 0)
    parent = topo.channel_id["all"]
    topo.p2p_channels(np.array([parent] * 3), np.array([0, 2, 6]), np.array([1, 1, 5]))
    assert topo.pipelines().tolist() == [0, 0, 0, 3, 4, 5, 5, 7]
    # a new channel joins two pipelines into one, and a new rank stands alone
    topo.p2p_channels(np.array([parent]), np.array([3]), np.array([2]))
    topo.ensure_world(9)
    assert topo.pipelines().tolist() == [0, 0, 0, 0, 4, 5, 5, 7, 8]
