"""Faults the simulator injects, and the suspect each one should produce.

A ``Fault`` says what breaks (compute, communication, the process), where (a rank, a node, a
node's network, a GPU's own NIC, the link between two nodes, a node's NVLink fabric), when
(onset, optional duration, optional flapping) and how badly (``factor``). Its ``expected``
property is the label the evaluation scores the detector against: the kind and level the
detector should report and the ranks, nodes or link it should name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["FAULT_KINDS", "WHERE", "Expected", "Fault"]

FAULT_KINDS = ("slow_compute", "slow_comm", "hang_compute", "hang_comm", "stop", "crash")
"""slow_compute: a straggler (slow GPU, throttling, contention); slow_comm: a slow link, NIC or
NVLink; hang_compute: ranks stop issuing ops but stay alive; hang_comm: transfers stop completing;
stop: the process is frozen (SIGSTOP: no more heartbeats); crash: the process dies and the launcher
terminates the others ``kill_after`` seconds later."""

WHERE = ("rank", "node", "nic", "rnic", "link", "nvl")
"""rank: one GPU/process; node: every rank of a host; nic: a host's network (all its inter-node
traffic); rnic: one GPU's own NIC (rail-optimised networks); link: the path between two hosts;
nvl: a host's intra-node fabric."""

_KIND_OF = {
    "slow_compute": "noncomm_slow",
    "slow_comm": "comm_slow",
    "hang_compute": "noncomm_hang",
    "hang_comm": "comm_hang",
    "stop": "rank_dead",
    "crash": "rank_dead",
}


@dataclass(frozen=True, slots=True)
class Expected:
    """What a correct detector reports for one fault."""

    kind: str
    level: str
    ranks: tuple[int, ...]
    nodes: tuple[str, ...]
    link: tuple[str, str] | None


@dataclass(frozen=True)
class Fault:
    """One injected fault.

    Args:
        kind: one of ``FAULT_KINDS``.
        where: one of ``WHERE``.
        ranks: the rank (``rank``, ``rnic``) or ranks it hits.
        nodes: node indices: one for ``node``/``nic``/``nvl``, two for ``link``.
        factor: how much slower compute or transfers get (``slow_*``); ignored by hangs.
        onset: seconds from the job's start.
        duration: seconds it lasts (None: until the end).
        flap: ``(on_s, off_s)``: active ``on_s`` seconds, then healthy ``off_s``, repeating.
        silent: ``crash`` without a last batch (SIGKILL, segfault), else the rank says ``crashed``.
        kill_after: ``crash``: seconds until the launcher terminates every other rank (None: never).
    """

    kind: str
    where: str
    ranks: tuple[int, ...] = ()
    nodes: tuple[int, ...] = ()
    factor: float = 1.5
    onset: float = 30.0
    duration: float | None = None
    flap: tuple[float, float] | None = None
    silent: bool = False
    kill_after: float | None = 3.0

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}")
        if self.where not in WHERE:
            raise ValueError(f"unknown fault place {self.where!r}")
        need_nodes = {"node": 1, "nic": 1, "nvl": 1, "link": 2}.get(self.where, 0)
        if len(self.nodes) != need_nodes:
            raise ValueError(f"a fault on a {self.where} names {need_nodes} node(s)")
        if self.where in ("rank", "rnic") and not self.ranks:
            raise ValueError(f"a fault on a {self.where} names its rank(s)")

    @property
    def end(self) -> float:
        return math.inf if self.duration is None else self.onset + self.duration

    def active(self, t: float) -> bool:
        if not self.onset <= t < self.end:
            return False
        if self.flap is None:
            return True
        on, off = self.flap
        return (t - self.onset) % (on + off) < on

    def active_mask(self, t: np.ndarray | float) -> np.ndarray:
        """``active`` over a numpy array of times."""
        t = np.asarray(t, dtype=np.float64)
        m = (t >= self.onset) & (t < self.end)
        if self.flap is not None:
            on, off = self.flap
            m &= np.mod(t - self.onset, on + off) < on
        return m

    def hit_ranks(self, gpus_per_node: int, world: int) -> tuple[int, ...]:
        """Ranks whose processes the fault touches (compute, hang, stop, crash)."""
        if self.where == "node":
            lo = self.nodes[0] * gpus_per_node
            return tuple(range(lo, min(world, lo + gpus_per_node)))
        return tuple(self.ranks)

    def expected(self, gpus_per_node: int, world: int) -> Expected:
        from rankwatch.sim.layout import node_name

        kind = _KIND_OF[self.kind]
        if self.where in ("rank", "rnic"):
            ranks = tuple(sorted(self.ranks))
            nodes = tuple(sorted({node_name(r // gpus_per_node) for r in ranks}))
            return Expected(kind, "rank", ranks, nodes, None)
        if self.where == "link":
            a, b = sorted(self.nodes)
            return Expected(kind, "link", (), (node_name(a), node_name(b)), (node_name(a), node_name(b)))
        node = self.nodes[0]
        lo = node * gpus_per_node
        ranks = tuple(range(lo, min(world, lo + gpus_per_node)))
        return Expected(kind, "node", ranks, (node_name(node),), None)

    @property
    def is_hang(self) -> bool:
        return self.kind in ("hang_compute", "hang_comm", "stop", "crash")
