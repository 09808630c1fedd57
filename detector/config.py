"""The detector's thresholds, in one frozen dataclass with a line of why per field."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DetectorConfig"]


@dataclass(frozen=True, kw_only=True, slots=True)
class DetectorConfig:
    """How sure the detector must be, and how fast it forgets."""

    tau_s: float = 1.5
    """Time constant of the short moving averages of transfer time that decide "slow now"."""
    bucket_s: float = 0.4
    """Lateness is added up in buckets this long; a straggler must be late in the median of the last five."""
    ops_tau_s: float = 3.0
    """Time constant of each group's op rate (turns per-op lateness into seconds per second)."""
    stale_s: float = 2.0
    """Buckets older than the ring plus this are ignored: a job that went quiet has no evidence."""
    pause_s: float = 12.0
    """A group that pauses (a checkpoint's save, an evaluation) keeps its slots' last judgement this long."""
    baseline_tau_s: float = 60.0
    """Time constant of each rank's and each group's own baseline (frozen while it looks faulty)."""
    baseline_warm_s: float = 8.0
    """Seconds of data before a rank's own lateness baseline is trusted."""
    min_effect: float = 0.03
    """Smallest share of wall-clock the rest of the job must spend waiting (0.03: 1.03x slower)."""
    noise_k: float = 4.0
    """A suspect's effect must also exceed this many times its own usual fluctuation."""
    noise_cap_k: float = 4.0
    """...where, in a collective group, a rank's own fluctuation counts at most this multiple of the group's."""
    noise_warm_s: float = 15.0
    """Until a rank's fluctuation has been learned this long, the effect must be twice ``min_effect``."""
    noise_hold_s: float = 15.0
    """Longest a slot's fluctuation samples are held back while its evidence is open (then learned)."""
    cusum_h: float = 5.0
    """Evidence (excess in units of usual fluctuation, times seconds) a slow suspect must accumulate."""
    p2p_k: float = 2.0
    """Point-to-point waits are mostly the pipeline schedule's shape: lateness there must be this much stronger."""
    warm_cells: int = 24
    """Blocks a rank must have in a group before its lateness there is judged (start-up is not a fault)."""
    explain_k: float = 0.5
    """A rank late in one group is a victim if it waited this share of its lateness inside another."""
    hold_s: float = 1.0
    """A slow suspect must hold this long before it is reported."""
    fast_hold_s: float = 0.5
    """...but only this long a straggler that slows the job ``mild_slowdown`` or more, with twice
    the evidence (``cusum_h``) that made it a root, late in groups where its own fluctuation has
    been learned for ``noise_warm_s`` (its threshold is then its own: a rank given to clusters of
    GC pauses has learned a wider one; before that, the threshold is a floor such a cluster
    crosses for a second or so). Slow channels keep ``hold_s`` (see docs/decisions.md)."""
    mild_hold_s: float = 4.0
    """...and a straggler that slows the job less than ``mild_slowdown`` this long: in a job with
    uneven steps a rank is late by 10-20% for a step or two by chance, a real straggler is late in
    every step, and the latency target is for slowdowns of 1.2x and worse."""
    mild_slowdown: float = 1.2
    root_gap_s: float = 1.0
    """A root that drops out of the evidence this briefly keeps its ``mild_hold_s`` (the time out does not count)."""
    stage_in_drop: float = 0.02
    """A node that is a pipeline stage is slow when its ranks' share of wall-clock inside ops
    dropped by this much more than the other nodes' did, and than its pipeline neighbours' did
    (mean over its ranks against their usual, read over 8 s with tapered ends, smoothed over
    ``stage_tau_s``)..."""
    stage_late_z: float = 0.15
    """...its ranks are later at their point-to-point channels to other nodes than is usual for
    the node, by this many of those channels' thresholds on average (usual: learned over
    ``stage_usual_s`` while the test is not met)..."""
    stage_noise_k: float = 2.0
    """...both by at least this many times their own usual fluctuation (learned alike)..."""
    stage_clear_k: float = 1.75
    """...(only ``stage_clear_late`` of the late sign's line, though, for a node whose share dropped
    this many times past its line, against the other nodes and its neighbours alike: the last
    stage of a job 1.04x slower, its share twice past its line, was late at its sends by 0.05-0.14
    of their thresholds against the line's 0.15, and the two never held together)..."""
    stage_clear_late: float = 0.5
    stage_clear_abs: float = 0.05
    """...(and by this much at least: a run of GC pauses drops a stage's share by 0.04-0.05 for the
    8 s it is read over while its sends' lateness decays)..."""
    stage_hold_s: float = 6.0
    """...and both have held this long (a healthy pipeline's stages swing for a few seconds)."""
    stage_tau_s: float = 3.0
    stage_usual_s: float = 30.0
    stage_restart: float = 0.3
    """When the job's median rank spends this much less of wall-clock inside ops than its usual as
    the slow-stage test reads it, the level that usual was learned on is gone (the long waits of a
    slow first step), and the test's usuals, spreads and lines are learned again from then on."""
    link_hold_s: float = 3.0
    """A slow place seen between two nodes only, other than a link alone (a link one of its nodes'
    NICs explains as well, a GPU's NIC, the pair of nodes), is held this much longer first."""
    barrier_gap_s: float = 1.0
    """An op of a group that spans the whole job, after this long without one, is judged on its own
    (a barrier after a checkpoint's save: see ``barriers.py``)..."""
    barrier_keep_s: float = 60.0
    """...and such ops are kept this long."""
    release_s: float = 6.0
    """A reported suspect resolves after its evidence has been gone this long."""
    comm_ratio: float = 1.12
    """Transfer time over the group's own baseline (same op and size) that counts as slow."""
    comm_z: float = 3.0
    """...and this many standard errors of that ratio (spread of a block over the blocks behind both averages)."""
    comm_healthy_ratio: float = 1.05
    """At or below this a group's transfers count as healthy and clear the places they use."""
    comm_min_effect: float = 0.02
    """Smallest share of wall-clock the ranks at a slow place must lose to its slow transfers."""
    comm_channel_effect: float = 0.002
    """Smallest share of wall-clock one group must lose to count as a slow channel at all."""
    comm_warm_cells: int = 8
    """Blocks of an (op, size) class before its transfer baseline exists."""
    comm_warm_s: float = 10.0
    """Until a group has been watched this long, its baseline and spread come from a few blocks
    of its first seconds: a slow verdict needs twice ``comm_z`` and twice ``comm_min_effect``."""
    hang_floor_s: float = 5.0
    """No collective is hung before this many seconds in flight."""
    hang_p99_mult: float = 5.0
    """...nor before this multiple of the group's p99 time inside a collective."""
    hang_warm_floor_s: float = 30.0
    """Floor while a group has little history (start-up, compilation, the first step)."""
    hang_warm_cells: int = 16
    """A group's first blocks, left out of its history (``hang_floor_s`` applies from 8 blocks later)."""
    hang_hist_tau_s: float = 300.0
    """Time constant with which a group's history of long ops fades (periodic ones stay)."""
    dead_after_s: float = 6.0
    """A rank silent this long (and at least ``dead_flushes`` send periods) is dead."""
    dead_flushes: float = 5.0
    """...in units of the rank's own send period."""
    silent_flushes: float = 2.5
    """Silent this many send periods: a possible casualty (a hang naming it waits for ``dead_after_s``)."""
    cascade_s: float = 60.0
    """Casualties within this long after the first are the launcher's victims, not suspects."""
    casualty_tie_s: float = 1.0
    """Casualties this close to the first are as early as it (several can be the first)."""
    ready_after_s: float = 10.0
    """Seconds of fresh data after a (re)start before the detector's verdicts are final."""
    cell_timeout_s: float = 5.0
    """A block some members never report is analysed with the members that did after this long."""
    raw_block_s: float = 0.2
    """Raw records are grouped into blocks spanning about this long (a power of two of ops, <= 64)."""
    node_share: float = 0.5
    """Suspect ranks covering at least this share of a node's ranks make the node the suspect."""
    node_lean: float = 0.5
    """A node whose ranks in a group of the job are late there by this share of their thresholds on
    average (at least ``node_share`` of the node's ranks by half that), while the group's other
    members are not, for ``mild_hold_s`` of fresh data, is a slow node: a slow node of a pure
    data-parallel job makes its ranks late together by less than the threshold any one of them
    is judged by alone. Where no group holds that share of a node's ranks (tp8dp4: one rank of
    each node per data-parallel group), the same lines apply to its ranks across their groups."""
    analysis_slots_per_s: float = 250_000.0
    """Slowness analysis runs every (slots / this) seconds at most (a slot is one rank in one group)."""
    max_analysis_period_s: float = 4.0
    """...but at least this often."""
    fold_rows: int = 16_384
    """Rows of batches held before they are folded into the job's state without waiting for
    ``evaluate`` (which folds them all first): bounds the memory of a job nobody evaluates."""
    max_flight_recorder_ranks: int = 1024
    """At most this many ranks are asked for a Flight Recorder dump per hang."""

    @property
    def mild_share(self) -> float:
        """The share of wall-clock the rest of the job waits on a straggler of ``mild_slowdown``."""
        return 1.0 - 1.0 / self.mild_slowdown
