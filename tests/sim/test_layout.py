"""Layout: Megatron rank order, groups, nodes, rings."""

from __future__ import annotations

import numpy as np

from rankwatch.sim import Layout


def test_rank_order_and_groups() -> None:
    lay = Layout(tp=2, pp=2, dp=4)
    assert lay.world == 16 and lay.n_nodes == 2
    assert lay.rank(1, 2, 1) == 1 + 2 * (2 + 4 * 1)
    descs = [g.desc for g in lay.groups]
    assert descs.count("tp") == 8 and descs.count("dp") == 4 and descs.count("pp") == 8
    assert descs[0] == "default_pg" and lay.groups[0].size == 16
    # every rank is in exactly one group of each kind
    for r in range(lay.world):
        kinds = sorted(lay.groups[g].desc for g in lay.rank_groups[r])
        assert kinds == ["default_pg", "dp", "pp", "tp"]
    # tensor-parallel groups stay inside a node, data-parallel ones may not
    for g in lay.groups:
        if g.desc == "tp":
            assert len(set(lay.node_of_ranks(g.members).tolist())) == 1


def test_ring_edges() -> None:
    lay = Layout(tp=1, pp=1, dp=4)
    e = lay.ring_edges(np.array([0, 1, 2, 3]))
    assert e.tolist() == [[0, 1], [1, 2], [2, 3], [3, 0]]
    assert lay.ring_edges(np.array([5, 9])).tolist() == [[5, 9]]
