"""Stragglers at a job's rare whole-job ops: the barrier after a checkpoint's save.

A job that saves often spends much of its time saving: every rank writes its shard, then all meet
in a barrier of the default group. A rank or node that writes slower makes every save wait for it
there, and that is most of what it costs the job; between saves there are only short bursts of
steps, too few for the bucketed lateness of ``lateness.py`` (five non-empty 0.4 s buckets) to
judge, and a barrier every few seconds is never enough ops for it either.

So an op of a group that spans the whole job, after ``barrier_gap_s`` without one (a barrier, a
metrics all-reduce), is judged on its own: a member's lateness there (how much longer the others
waited inside than it did) is its own write's skew, spread evenly over the save's spread in a
healthy job. A place (a rank, or the ranks of one node) *held up* such an op when the others
waited for it longer than for anybody else by more than half the op's median lateness.

- A node is a straggler once it held up two of the group's last three such ops (the newest among
  them) and, over those it held up, its ranks' lateness ranks above the others' as a whole (a
  rank-sum z of at least ``_NODE_Z``: one slow rank on a node is the rank, not the node).
- A rank, once it held up three of the last four, or two of the last three by more than the op's
  median lateness (in a healthy save of a few dozen ranks nobody is that much later than all the
  others).

Either only when what the job waited on it there (the time it arrived after everybody else,
summed over those ops) is at least ``min_effect`` of the wall-clock they span.

What a group's first three such ops show is how the job runs: a place that held up two of them
(rank 0 alone writes the checkpoint, or logs, while the others wait) is never named here, and
nothing is named before those three have been seen. A straggler slow from the start is left to
``lateness.py``.

Between two such ops the ranks do their own work (write a shard, train), so a rank late there is
late of its own, with one exception not guarded against: an op that directly follows the end of
a step finds the ranks that finished the step last (a pipeline's last stage to drain) late
together; where that is a node, and the lag is half the op's median lateness, the node would be
named. In a job that saves, the writes between the step and the barrier are what the barrier
sees. A group that does not span the job is left to ``lateness.py`` and its victim tests.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from rankwatch.detector.cells import CellStats
from rankwatch.detector.config import DetectorConfig
from rankwatch.detector.topology import Topology

__all__ = ["BarrierStraggler", "BarrierTracker"]

_KEEP = 4  # newest rare ops kept per group
_LEARN = 3  # a group's first rare ops: a place that held up most of them is how the job runs
_MIN_WORLD = 8  # fewer ranks than this: one of them is far later than the rest by chance too often
_RANK_NEED = (3, 4)  # a rank: held up 3 of the last 4...
_RANK_STRONG = (2, 3)  # ...or 2 of the last 3 by more than the op's median lateness
_NODE_NEED = (2, 3)  # a node (two measures at once): 2 of the last 3
_STEP_OPS = 16  # fewer ops than this (and more than one) between two rare ops of a kind: they are steps
_NODE_Z = 3.0  # ...its ranks' lateness above the others' over those ops, in standard errors (rank-sum)


@dataclass(slots=True)
class _Op:
    """One rare op, with what every place's verdict needs (computed once, when it is analysed)."""

    t: float  # server time of the op's last enter
    gap: float  # seconds since the group's previous op
    block: int
    median: float  # the members' median lateness (seconds the others waited for each)
    top: int  # the latest member (group-rank index)...
    top_gap: float  # ...and how much later than the next
    nodes: np.ndarray  # the nodes its members are on
    node_gap: np.ndarray  # per node: how much later its latest member arrived than anybody else's
    node_z: np.ndarray  # per node: its members' lateness ranked against the others' (rank-sum z)

    @classmethod
    def of(cls, t: float, gap: float, block: int, late: np.ndarray, node_of: np.ndarray) -> _Op:
        n = late.shape[0]
        srt = np.argsort(late, kind="stable")
        top = int(srt[-1])
        nodes, idx = np.unique(node_of, return_inverse=True)
        k = nodes.shape[0]
        node_max = np.full(k, -np.inf)
        np.maximum.at(node_max, idx, late)
        node_gap = np.zeros(k)
        if k > 1:
            second, first = np.sort(node_max)[-2:]
            best = node_max == first
            node_gap[best] = first - second if best.sum() == 1 else 0.0
        # Mann-Whitney: the sum of a node's members' ranks, against what n1 of n draws average
        order = np.empty(n)
        order[srt] = np.arange(n)
        n1 = np.bincount(idx, minlength=k).astype(float)
        n2 = n - n1
        u = np.bincount(idx, weights=order, minlength=k) - n1 * (n1 - 1) / 2
        with np.errstate(divide="ignore", invalid="ignore"):
            z = (u / (n1 * n2) - 0.5) / np.sqrt((n + 1) / (12.0 * n1 * n2))
        return cls(
            t=t,
            gap=gap,
            block=block,
            median=float(np.median(late)),
            top=top,
            top_gap=float(late[top] - late[srt[-2]]) if n > 1 else 0.0,
            nodes=nodes,
            node_gap=node_gap,
            node_z=np.nan_to_num(z, nan=0.0),
        )

    def bar(self) -> float:
        """A place held this op up when the others waited for it this much longer than for anybody else."""
        return 0.5 * self.median

    def held(self, gap: float, k_bar: float = 1.0) -> bool:
        """Whether a place the others waited for ``gap`` seconds longer than for anybody else held it up."""
        return gap > k_bar * self.bar() > 0.0


def _held_up(ops: list[_Op], gap: np.ndarray, k_bar: float = 1.0) -> np.ndarray:
    """Per op: whether a place that held it up ``gap`` seconds (against the others) held it up."""
    return np.array([op.held(g, k_bar) for op, g in zip(ops, gap, strict=True)], bool)


@dataclass(slots=True)
class BarrierStraggler:
    """A rank or node that held up most of a whole-job group's recent rare ops."""

    level: str  # "rank" or "node"
    ranks: list[int]
    node: int
    channel: int
    w: float  # share of wall-clock the job waited on it at those ops
    onset: float
    ops: list[dict[str, float]] = field(default_factory=list)
    member: int = -1  # a rank's index in the group


class BarrierTracker:
    """The newest rare ops of each whole-job group, and who held them up."""

    def __init__(self, cfg: DetectorConfig) -> None:
        self.cfg = cfg
        self.last_t: dict[int, float] = {}
        self.ops: dict[int, deque[_Op]] = {}
        self.first: dict[int, list[_Op]] = {}  # a group's first rare ops, until learned...
        self.usual: dict[int, tuple[set[int], set[int]]] = {}  # ...who held them up (members, nodes)
        self.since: dict[tuple[int, int], int] = {}  # per (group, op class): ops since its previous rare op

    def reset(self) -> None:
        self.last_t.clear()
        self.ops.clear()
        self.first.clear()
        self.usual.clear()
        self.since.clear()

    def update(self, st: CellStats, topo: Topology, blocks: np.ndarray) -> None:
        """Take the analysed blocks of whole-job collective groups (``blocks``: per cell, its index)."""
        if not len(st) or topo.world < _MIN_WORLD:
            return
        c_ch = st.c_ch
        whole = topo.ch_whole()[c_ch]
        if not whole.any():
            return
        cells = np.flatnonzero(whole)
        first = np.full(len(st), np.inf)
        mine = np.flatnonzero(whole[st.cell])
        np.minimum.at(first, st.cell[mine], st.t0[mine])
        for c in cells[np.argsort(first[cells], kind="stable")].tolist():
            ch = int(c_ch[c])
            prev = self.last_t.get(ch)
            self.last_t[ch] = max(float(st.c_t[c]), prev if prev is not None else -np.inf)
            size = int(topo.ch_size[ch])
            key = (ch, int(st.c_cls[c]))
            since = self.since.get(key, 0)  # the ops of its kind since its previous rare op, that one included
            if prev is None or first[c] - prev < self.cfg.barrier_gap_s or int(st.c_n[c]) < size:
                self.since[key] = since + int(st.c_cnt[c])
                continue
            self.since[key] = int(st.c_cnt[c])
            if 1 < since < _STEP_OPS:  # a burst of the group's own few ops every step: a step, not a save
                continue
            rows = np.flatnonzero(st.cell == c)
            late = np.zeros(size)
            late[st.slot[rows] - int(topo.ch_off[ch])] = st.late[rows] / st.cnt[rows]
            op = _Op.of(
                float(st.c_t[c]), float(first[c] - prev), int(blocks[c]), late, topo.node_of[topo.ch_members[ch]]
            )
            self.ops.setdefault(ch, deque(maxlen=_KEEP)).append(op)
            if ch not in self.usual:
                seen = self.first.setdefault(ch, [])
                seen.append(op)
                if len(seen) == _LEARN:
                    self.usual[ch] = self._learn(self.first.pop(ch))

    def analyse(self, now: float, topo: Topology) -> list[BarrierStraggler]:
        """Ranks and nodes that held up enough of their group's newest rare ops, as of ``now``."""
        out: list[BarrierStraggler] = []
        for ch, ring in list(self.ops.items()):
            while ring and now - ring[0].t > self.cfg.barrier_keep_s:
                ring.popleft()
            if not ring:
                del self.ops[ch]
                continue
            usual = self.usual.get(ch)
            if usual is None:  # still learning who holds its ops up anyway
                continue
            ops = list(ring)
            members = topo.ch_members[ch]
            found = [b for b in self._nodes(ch, ops, members, topo.node_of[members]) if b.node not in usual[1]]
            out += found
            rank = self._rank(ch, ops, members, topo.node_of[members])
            if rank is not None and rank.node not in {b.node for b in found} and rank.member not in usual[0]:
                out.append(rank)
        return out

    @staticmethod
    def _learn(first: list[_Op]) -> tuple[set[int], set[int]]:
        """The members and nodes that held up most of a group's first rare ops: that is how the job
        runs (rank 0 alone writes the checkpoint, or logs, while the rest wait), not a fault."""
        ranks: dict[int, int] = {}
        nodes: dict[int, int] = {}
        for op in first:
            if op.held(op.top_gap):
                ranks[op.top] = ranks.get(op.top, 0) + 1
            for n in op.nodes[op.node_gap > op.bar()].tolist():
                nodes[int(n)] = nodes.get(int(n), 0) + 1
        need = len(first) // 2 + 1
        return {r for r, c in ranks.items() if c >= need}, {n for n, c in nodes.items() if c >= need}

    def _verdict(
        self, ops: list[_Op], gap: np.ndarray, need: tuple[int, int], k_bar: float = 1.0
    ) -> tuple[float, float, list[dict[str, float]]] | None:
        """(w, onset, evidence) when a place that held ``gap`` seconds up per op is a straggler
        (held: ``gap`` over ``k_bar`` times the op's bar, in ``need`` = k of the last n ops)."""
        k, of = need
        if len(ops) < k:
            return None
        ops, gap = ops[-of:], gap[-of:]
        held = _held_up(ops, gap, k_bar)
        if not held[-1] or int(held.sum()) < k:
            return None
        span = ops[-1].t - ops[0].t + ops[0].gap
        w = float(gap.sum()) / span if span > 0 else 0.0
        if w < self.cfg.min_effect:
            return None
        onset = next(op.t - op.gap for op, h in zip(ops, held, strict=True) if h)
        ev = [
            {
                "block": op.block,
                "t": round(op.t, 3),
                "held_up_s": round(float(g), 3),
                "median_late_s": round(op.median, 3),
            }
            for op, g in zip(ops, gap, strict=True)
        ]
        return w, onset, ev

    def _nodes(self, ch: int, ops: list[_Op], members: np.ndarray, node_of: np.ndarray) -> list[BarrierStraggler]:
        newest = ops[-1]
        out = []
        # only the node whose latest member was the latest of all can have held the newest op up
        for i in np.flatnonzero(newest.node_gap > newest.bar()).tolist():
            n = int(newest.nodes[i])
            mine = node_of == n
            if mine.sum() < 2 or (~mine).sum() < 2:
                continue
            gap, z = np.zeros(len(ops)), np.zeros(len(ops))
            for j, op in enumerate(ops):
                at = np.searchsorted(op.nodes, n)
                if at < op.nodes.shape[0] and op.nodes[at] == n:
                    gap[j], z[j] = op.node_gap[at], op.node_z[at]
            # its ranks as a whole arrive late, not one of them: over the ops it held up, their
            # lateness ranks above the others' (a node slower by a few tenths of the save's
            # spread does, one slow rank on it does not)
            last = ops[-_NODE_NEED[1] :]
            held = _held_up(last, gap[-len(last) :])
            if float(z[-len(last) :][held].sum()) / np.sqrt(max(1, int(held.sum()))) < _NODE_Z:
                continue
            v = self._verdict(ops, gap, _NODE_NEED)
            if v is not None:
                out.append(BarrierStraggler("node", members[mine].tolist(), n, ch, v[0], v[1], v[2]))
        return out

    def _rank(self, ch: int, ops: list[_Op], members: np.ndarray, node_of: np.ndarray) -> BarrierStraggler | None:
        # only the member that was the latest at the newest op can have held it up
        i = ops[-1].top
        gap = np.array([op.top_gap if op.top == i else 0.0 for op in ops])
        v = self._verdict(ops, gap, _RANK_NEED) or self._verdict(ops, gap, _RANK_STRONG, 2.0)
        if v is None:
            return None
        return BarrierStraggler("rank", [int(members[i])], int(node_of[i]), ch, v[0], v[1], v[2], member=i)
