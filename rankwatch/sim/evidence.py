"""What the timing evidence can and cannot tell apart: the finest answer a slow network fault supports.

A slow NIC, a slow GPU NIC or a slow link shows only through the channels (ring collectives of a
group, point-to-point pairs, the world barrier) whose transfers cross it: every collective on such
a channel takes longer, for every member alike. Two places that lie on exactly the same channels
are indistinguishable from timings: in a pure data-parallel job the single ring crosses every
node's NIC and every link between neighbours, so a slow NIC on node 3 and one on node 0 slow the
same ring by the same amount. There the finest answer the evidence supports is the set of nodes of
all the places that share the evidence (or one link: a NIC whose node talks to one other node
looks exactly like the link between them), and that is what the evaluation expects; the engine
still slows exactly the fault's place.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from rankwatch.sim.engine import channel_uses
from rankwatch.sim.faults import Expected, Fault
from rankwatch.sim.layout import Layout, node_name

__all__ = ["channels", "expected_answer", "signature"]


def channels(lay: Layout) -> list[np.ndarray]:
    """Every channel of the layout as the rank pairs its transfers use, in the engine's order."""
    out: list[np.ndarray] = []
    for p in range(lay.pp):
        st = lay.stage_ranks(p)
        out.extend(lay.ring_edges(row) for row in st)
        out.extend(lay.ring_edges(col) for col in st.T)
        if p + 1 < lay.pp:
            nxt = lay.stage_ranks(p + 1)
            out.extend(np.array([[a, b]]) for a, b in zip(st.ravel().tolist(), nxt.ravel().tolist(), strict=True))
    out.append(lay.ring_edges(np.arange(lay.world)))
    return out


def signature(fault: Fault, lay: Layout, chans: list[np.ndarray] | None = None) -> frozenset[int]:
    """The channels whose transfers cross the fault's place."""
    chans = channels(lay) if chans is None else chans
    return frozenset(i for i, e in enumerate(chans) if channel_uses(fault, e, lay.gpus_per_node))


def _places(fault: Fault, lay: Layout) -> list[Fault]:
    n = lay.n_nodes
    nodes = [dataclasses.replace(fault, where="nic", nodes=(i,), ranks=()) for i in range(n)]
    gpus = [dataclasses.replace(fault, where="rnic", ranks=(r,), nodes=()) for r in range(lay.world)]
    links = [
        dataclasses.replace(fault, where="link", nodes=(a, b), ranks=()) for a in range(n) for b in range(a + 1, n)
    ]
    return nodes + gpus + links


def expected_answer(fault: Fault, lay: Layout) -> Expected:
    """What a correct detector reports for ``fault``: its own place, or the finest the evidence supports.

    Only slow network faults (``slow_comm`` on a NIC, a GPU's NIC or a link) can share their
    evidence with another place; everything else is answered at its own place.
    """
    own = fault.expected(lay.gpus_per_node, lay.world)
    if fault.kind != "slow_comm" or fault.where not in ("nic", "rnic", "link"):
        return own
    chans = channels(lay)
    sig = signature(fault, lay, chans)
    twins = [p for p in _places(fault, lay) if signature(p, lay, chans) == sig]
    if not sig or twins == [fault]:
        return own
    gpn = lay.gpus_per_node

    def nodes_of(p: Fault) -> set[int]:
        return {r // gpn for r in p.ranks} if p.where == "rnic" else set(p.nodes)

    links = [p for p in twins if p.where == "link"]
    if len(links) == 1 and all(nodes_of(p) <= set(links[0].nodes) for p in twins):
        spanned = set(links[0].nodes)  # a NIC whose traffic all goes over one link: that link
    else:
        spanned = set().union(*(nodes_of(p) for p in twins))
    names = tuple(node_name(x) for x in sorted(spanned))
    if len(names) == 2:
        return Expected(own.kind, "link", (), names, (names[0], names[1]))
    ranks = tuple(r for x in sorted(spanned) for r in lay.ranks_on_node(x))
    return Expected(own.kind, "node", ranks, names, None)
