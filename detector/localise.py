"""Localisation by intersection: the place common to the faulty channels and absent from healthy ones.

Every channel (a group, or one direction of point-to-point traffic between two ranks) goes
through places (``Topology.places``): GPUs' NICs, nodes' networks, links between nodes, NVLink.
Given the channels that are slow (or stuck) and those seen healthy at the same time, ``localise``
finds the places that explain the most faulty channels without being used by healthy ones
(greedily, so two faults at once give two answers). This is C4D's delay-matrix rule in general
form: a slow row of the point-to-point matrix is one sender's place, a slow column one
receiver's, one slow cell the link between them.

When several places explain exactly the same channels the evidence cannot tell them apart; the
answer is then the finest level that covers them all: one rank, one node, the link between two
nodes, or (ambiguous) the nodes involved.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from rankwatch.detector.topology import PLACE_LEVEL, Place, Topology

__all__ = ["Culprit", "localise"]


@dataclass(slots=True)
class Culprit:
    """Where a set of faulty channels points."""

    level: str
    ranks: list[int]
    nodes: list[int]
    link: tuple[int, int] | None
    places: list[Place]
    channels: list[int]
    ambiguous: bool = False
    cleared: list[Place] = field(default_factory=list)


def localise(
    topo: Topology, faulty: list[int], healthy: list[int], tol: float = 0.2, prefer: list[list[Place]] | None = None
) -> list[Culprit]:
    """Places that explain ``faulty`` channels, most explanatory first.

    Args:
        topo: the job's topology.
        faulty: channels that are slow or stuck.
        healthy: channels seen working at the same time.
        tol: a place still counts if at most this share of its known channels are healthy
            (one misjudged channel must not clear the real culprit).
        prefer: places named before (one list per earlier culprit): they explain what they still
            can first, so an ongoing fault keeps its name while the evidence flickers — unless
            another place now explains all of that and more (a link named first, then the rest of
            its node's channels turning slow: the node's NIC it is).
    """
    if not faulty:
        return []
    fp = {ch: topo.places(ch) for ch in faulty}
    bad: Counter[Place] = Counter()
    for ps in fp.values():
        bad.update(ps)
    good: Counter[Place] = Counter()
    for ch in healthy:
        for p in topo.places(ch):
            if p in bad:
                good[p] += 1
    cands = {p for p, n in bad.items() if good[p] <= tol * n}
    remaining = set(faulty)
    out: list[Culprit] = []
    for places in prefer or []:
        preferred = [p for p in places if p in bad and good[p] <= 0.5 * bad[p]]
        covered = {ch for ch in remaining if any(p in fp[ch] for p in preferred)}
        wider = any(covered < {ch for ch in remaining if p in fp[ch]} for p in cands if p not in preferred)
        if preferred and covered and not wider:
            # of the places named before, the ones that explain most now: the name narrows or widens
            # with the evidence (a link named first, then the rest of that node's channels: its NIC)
            cov = {p: frozenset(ch for ch in covered if p in fp[ch]) for p in preferred}
            best = max(len(c) for c in cov.values())
            chosen = next(c for c in cov.values() if len(c) == best)
            tied = [p for p in preferred if cov[p] == chosen]
            out.append(_culprit(topo, tied, sorted(chosen)))
            remaining -= chosen
            cands -= set(tied)
    while remaining and cands:
        cover: dict[Place, frozenset[int]] = {}
        for p in cands:
            c = frozenset(ch for ch in remaining if p in fp[ch])
            if c:
                cover[p] = c
        if not cover:
            break
        best = max(len(c) for c in cover.values())
        # the explanation covering most; among equals, the one with the fewest known channels
        top = [p for p, c in cover.items() if len(c) == best]
        top.sort(key=lambda p: (bad[p] + good[p], _order(p)))
        chosen = cover[top[0]]
        tied = [p for p in top if cover[p] == chosen]
        out.append(_culprit(topo, tied, sorted(chosen)))
        remaining -= chosen
        cands -= set(tied)
    return out


def _order(p: Place) -> tuple[int, str]:
    return ({"rnic": 0, "rnvl": 0, "link": 1, "nic": 2, "nvl": 2}[p[0]], repr(p))


def _culprit(topo: Topology, tied: list[Place], channels: list[int]) -> Culprit:
    nodes = sorted({n for p in tied for n in topo.place_nodes(p)})
    ranks = sorted({r for p in tied for r in topo.place_ranks(p)})
    levels = {PLACE_LEVEL[p[0]] for p in tied}
    if levels == {"rank"} and len({p[1] for p in tied}) == 1:
        return Culprit("rank", ranks, nodes, None, tied, channels)
    if len(tied) == 1 and levels == {"link"}:
        p = tied[0]
        return Culprit("link", _link_ranks(topo, channels, p), nodes, (int(p[1]), int(p[2])), tied, channels)
    if len(nodes) == 1:
        return Culprit("node", ranks or topo.place_ranks(("nic", nodes[0])), nodes, None, tied, channels)
    links = [p for p in tied if p[0] == "link"]
    if len(nodes) == 2 and links:
        p = links[0]
        return Culprit("link", _link_ranks(topo, channels, p), nodes, (int(p[1]), int(p[2])), tied, channels)
    return Culprit("node", ranks, nodes, None, tied, channels, ambiguous=True)


def _link_ranks(topo: Topology, channels: list[int], link: Place) -> list[int]:
    """Ranks at the ends of the link among the faulty channels' members."""
    ends = {int(link[1]), int(link[2])}
    out: set[int] = set()
    for ch in channels:
        for r in topo.ch_members[ch].tolist():
            if int(topo.node_of[r]) in ends:
                out.add(int(r))
    return sorted(out)
