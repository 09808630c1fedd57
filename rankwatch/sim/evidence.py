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

A communication *hang* shows only through the channels it stops: an op every member entered and
none completes. Which channels that is depends on when it strikes, so ``expected_answers`` reads it
from the engine's own run: a hang on a node's NVLink that strikes while the job is saving a
checkpoint is first met by the barrier of the whole job after the save, whose ring crosses every
node's NVLink and every link between neighbours; every rank enters it, none leaves, nothing else
runs again, and no timing or stack tells which place on that ring stopped. The places (of any
kind: a node's NVLink or NIC, a GPU's NIC, a link between two nodes) that lie on every channel that
stopped and on none that completed a transfer begun after the onset share the evidence, and the
answer is the nodes they span (the fault's own place when it is the only one).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from rankwatch.sim.engine import _RECV, _SEND, Engine, OpChunk, channel_uses
from rankwatch.sim.faults import Expected, Fault
from rankwatch.sim.layout import Layout, node_name
from rankwatch.sim.scenario import Scenario

__all__ = ["channels", "expected_answer", "expected_answers", "signature"]


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
    return _spanned_answer(own, twins, lay)


def _spanned_answer(own: Expected, twins: list[Fault], lay: Layout) -> Expected:
    """The nodes every place sharing the evidence spans (one link when that is all they are)."""
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


def _run_ops(sc: Scenario) -> OpChunk:
    eng = Engine(sc)
    out = []
    for chunk in eng.steps(sc.duration):
        out.append(chunk)
        if not np.isfinite(eng.t_free).any():
            break
    return OpChunk.concat(out)


def _stopped_and_working(ops: OpChunk, lay: Layout, onset: float) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Channels (as rank pairs) with an op begun after ``onset`` that every member entered and none
    left, and channels that completed such an op."""
    groups = lay.groups
    stopped: dict[tuple[object, ...], np.ndarray] = {}
    working: dict[tuple[object, ...], np.ndarray] = {}
    p2p = (ops.kind == _SEND) | (ops.kind == _RECV)
    # collectives: one op is (group, sequence number)
    coll = np.flatnonzero(~p2p & (ops.gidx >= 0))
    if coll.shape[0]:
        key = ops.gidx[coll] * (int(ops.seq.max()) + 1) + ops.seq[coll]
        order = np.argsort(key, kind="stable")
        idx, k = coll[order], key[order]
        cuts = np.flatnonzero(np.diff(k)) + 1
        for part in np.split(idx, cuts):
            start, end = ops.t_start[part], ops.t_end[part]
            if not np.isfinite(start).all() or start.max() < onset:
                continue
            members = groups[int(ops.gidx[part[0]])].members
            bucket = working if np.isfinite(end).all() else stopped if not np.isfinite(end).any() else None
            if bucket is not None:
                bucket[("g", int(ops.gidx[part[0]]))] = lay.ring_edges(members)
    # point-to-point: each record names the other side's stage and both share the pair's sequence
    # number; a transfer is both sides' op, begun once both entered it
    recv_start = {
        (int(ops.rank[i]), int(ops.gidx[i]), int(ops.seq[i])): float(ops.t_start[i])
        for i in np.flatnonzero(ops.kind == _RECV).tolist()
    }
    for i in np.flatnonzero(ops.kind == _SEND).tolist():
        members = groups[int(ops.gidx[i])].members
        a, b = int(ops.rank[i]), int(members[int(ops.peer[i])])
        began = max(float(ops.t_start[i]), recv_start.get((b, int(ops.gidx[i]), int(ops.seq[i])), np.inf))
        if not np.isfinite(began) or began < onset:
            continue
        edge = np.array([[a, b]], np.int64)
        (working if np.isfinite(ops.t_end[i]) else stopped)[("p", min(a, b), max(a, b))] = edge
    return list(stopped.values()), list(working.values())


def _hang_answer(fault: Fault, sc: Scenario, ops: OpChunk) -> Expected:
    """A communication hang's answer: the places that stopped what it stopped and no more.

    Places of every kind count, not only the fault's own: a node's NVLink, a node's NIC, a GPU's
    NIC, a link between two nodes. Node 3's NVLink, dying while the second stage of tp4pp2dp4
    (nodes 2 and 3) is inside its data-parallel reduces, stops those rings and nothing else; the
    link between the two nodes, or node 3's NIC, would stop exactly the same rings, so the answer
    is that link, not node 3 alone (``bench/probe_classes.py`` seed 9495, probe-hang_nvl-000).
    """
    lay = sc.layout
    own = fault.expected(lay.gpus_per_node, lay.world)
    if fault.where not in ("nvl", "link"):
        return own
    stopped, working = _stopped_and_working(ops, lay, fault.onset)
    gpn = lay.gpus_per_node

    def fits(p: Fault) -> bool:
        return all(channel_uses(p, e, gpn) for e in stopped) and not any(channel_uses(p, e, gpn) for e in working)

    if fault.where == "link":
        fault = dataclasses.replace(fault, nodes=tuple(sorted(fault.nodes)))
    nvl = [dataclasses.replace(fault, where="nvl", nodes=(i,), ranks=()) for i in range(lay.n_nodes)]
    twins = [p for p in nvl + _places(fault, lay) if fits(p)]
    if not stopped or fault not in twins or twins == [fault]:
        return own
    return _spanned_answer(own, twins, lay)


def expected_answers(sc: Scenario) -> list[Expected]:
    """``expected_answer`` for every fault of ``sc``; a communication hang's from the engine's run."""
    lay = sc.layout
    ops = _run_ops(sc) if any(f.kind == "hang_comm" for f in sc.faults) else None
    return [
        _hang_answer(f, sc, ops) if ops is not None and f.kind == "hang_comm" else expected_answer(f, lay)
        for f in sc.faults
    ]
