"""A simulated job: its layout, its training loop's shape, its jitter, its faults, its seed.

``Scenario`` is plain data, so a suite of them can live in the repository (``rankwatch.sim.suite``)
and every run of one is the same run: the seed decides every random draw.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from rankwatch.sim.faults import Fault
from rankwatch.sim.layout import Layout

__all__ = ["PROFILES", "Profile", "Scenario", "Workload"]


@dataclass(frozen=True)
class Profile:
    """Ordinary, healthy irregularity: none of it is a fault.

    Args:
        name: how the evaluation table names it.
        cpu_sigma: log-normal sigma of every compute segment, per rank (CPU noise, kernel jitter).
        net_sigma: log-normal sigma of every transfer.
        net_spike_p: chance a transfer takes ``net_spike_x`` times longer (congestion bursts).
        gc_rate: garbage-collection (or other host) pauses per rank per second.
        gc_s: mean pause length, seconds.
        first_step_x: the first step's compute is this many times longer (compilation, warm-up),
            with a per-rank spread of half that.
        init_s: extra time of each group's first collective (communicator set-up).
        ckpt_every: steps between checkpoint saves (0: none); every rank writes its shard.
        ckpt_s: seconds a save takes; ``ckpt_skew_s``: spread between ranks (they then wait in a barrier).
        step_sigma: log-normal sigma of a per-step factor shared by all ranks (data-dependent steps).
        rank_step_sigma: log-normal sigma of a per-step, per-rank factor (uneven batches).
        hetero_sigma: log-normal sigma of a fixed per-rank speed factor (a fleet is never uniform).
        net_latency_s: median network latency from ranks to the collector.
    """

    name: str = "quiet"
    cpu_sigma: float = 0.02
    net_sigma: float = 0.03
    net_spike_p: float = 0.0
    net_spike_x: float = 4.0
    gc_rate: float = 0.0
    gc_s: float = 0.15
    first_step_x: float = 1.0
    init_s: float = 0.0
    ckpt_every: int = 0
    ckpt_s: float = 3.0
    ckpt_skew_s: float = 1.0
    step_sigma: float = 0.0
    rank_step_sigma: float = 0.0
    hetero_sigma: float = 0.005
    net_latency_s: float = 0.002


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile("quiet"),
        Profile("cpu_noise", cpu_sigma=0.08, net_sigma=0.08, net_spike_p=0.002, hetero_sigma=0.01),
        Profile("gc", cpu_sigma=0.04, gc_rate=0.05, gc_s=0.2),
        Profile("first_step", cpu_sigma=0.03, first_step_x=6.0, init_s=1.0),
        Profile("checkpoint", cpu_sigma=0.03, ckpt_every=40, ckpt_s=4.0, ckpt_skew_s=1.5),
        Profile("data", cpu_sigma=0.03, step_sigma=0.25, rank_step_sigma=0.06),
        Profile(
            "everything",
            cpu_sigma=0.06,
            net_sigma=0.06,
            net_spike_p=0.001,
            gc_rate=0.03,
            gc_s=0.2,
            first_step_x=4.0,
            init_s=0.5,
            ckpt_every=50,
            ckpt_s=3.0,
            ckpt_skew_s=1.0,
            step_sigma=0.15,
            rank_step_sigma=0.04,
            hetero_sigma=0.01,
            net_latency_s=0.01,
        ),
    )
}


@dataclass(frozen=True)
class Workload:
    """The shape of one training step (GPipe schedule).

    Each pipeline stage runs, per step: for each of ``microbatches`` microbatches a forward pass of
    ``tp_ops`` compute segments each followed by a tensor-parallel all-reduce, then the backward
    passes the same way (pipeline sends and receives between stages), then ``dp_ops``
    data-parallel reduce-scatters, then the optimizer.

    Args:
        step_s: seconds of one healthy step on one stage, compute and transfers together.
        comm_share: share of ``step_s`` spent in transfers.
        backend: ``nccl`` (enqueue precedes the GPU start) or ``gloo`` (``t_start == t_enter``).
    """

    step_s: float = 0.5
    microbatches: int = 2
    tp_ops: int = 4
    dp_ops: int = 2
    comm_share: float = 0.25
    tp_bytes: int = 16 << 20
    dp_bytes: int = 64 << 20
    pp_bytes: int = 8 << 20
    backend: str = "nccl"

    def ops_per_step(self, layout: Layout) -> int:
        n = 0
        if layout.tp > 1:
            n += 2 * self.microbatches * self.tp_ops
        if layout.dp > 1:
            n += self.dp_ops
        if layout.pp > 1:
            n += (4 if layout.pp > 2 else 2) * self.microbatches
        return max(n, 1)

    @classmethod
    def for_rate(cls, coll_per_s: float, layout: Layout, **kw: object) -> Workload:
        """A workload whose ranks issue about ``coll_per_s`` collectives per second."""
        if coll_per_s <= 15:
            mb, tp_ops, dp_ops = 1, 2, 2
        elif coll_per_s <= 150:
            mb, tp_ops, dp_ops = 2, 4, 2
        else:
            mb, tp_ops, dp_ops = 4, 12, 4
        w = cls(microbatches=mb, tp_ops=tp_ops, dp_ops=dp_ops, **kw)  # type: ignore[arg-type]
        # a pipeline's step lasts (microbatches + stages - 1) / microbatches of one stage's work
        bubble = (mb + layout.pp - 1) / mb
        return dataclasses.replace(w, step_s=w.ops_per_step(layout) / coll_per_s / bubble)


@dataclass(frozen=True)
class Scenario:
    """One labelled simulation run.

    Args:
        name: unique within a suite.
        layout: ranks, groups, nodes.
        workload: the step's shape and speed.
        profile: healthy jitter.
        faults: what breaks (empty: a healthy run).
        duration: simulated seconds.
        seed: every random draw comes from it.
        flush_s: the hooks' send period.
        goodbye: ranks say goodbye when the run ends (a finished job).
        tags: free-form labels (``held_out``, the fault class...) for reporting.
    """

    name: str
    layout: Layout = field(default_factory=Layout)
    workload: Workload = field(default_factory=Workload)
    profile: Profile = field(default_factory=Profile)
    faults: tuple[Fault, ...] = ()
    duration: float = 60.0
    seed: int = 0
    flush_s: float = 1.0
    goodbye: bool = False
    tags: tuple[str, ...] = ()

    @property
    def job(self) -> str:
        return f"sim-{self.name}"
