"""Waiting at a checkpoint's barrier is no excuse for lateness elsewhere, unless a suspect caused it.

A rank that is late in its data-parallel group but spends more of its time inside ops than usual
looks like a victim (it waited on somebody). In a job that saves often, the barrier after each
save is in the detector's 4 s window every few seconds, and what a rank waits there is the save's
skew: a straggler that finished writing early waited there and passed as a victim until the
barrier left the window (docs/detector.md, *Waiting at a save's barrier*).
"""

from __future__ import annotations

import pytest

from rankwatch.sim import Fault, Layout
from rankwatch.sim.suite import UNSEEN_PROFILES


def _probe_saves_node(run, layout: Layout, rate: float, profile: str, seed: int):  # type: ignore[no-untyped-def]
    """A run of ``bench/probe_saves.py``: a 1.2x node (node 1) from 20 s of a 50 s job."""
    node = Fault("slow_compute", "node", nodes=(1,), factor=1.2, onset=20.0)
    return run(layout, node, rate=rate, profile=profile, duration=50.0, seed=seed)


def test_a_slow_node_of_a_job_that_saves_is_not_excused_by_its_wait_at_the_barrier(run) -> None:  # type: ignore[no-untyped-def]
    # bench/probe_saves.py's dp24 `checkpoint` 30/s node, seed 101: named 11 s after its onset while
    # the barrier's wait excused its ranks, 7 s without
    res = _probe_saves_node(run, Layout(tp=1, pp=1, dp=24), 30.0, "checkpoint", seed=101)
    assert res.latency[0] is not None and res.latency[0] <= 8.0, res.latency
    assert not res.false_suspects, res.false_suspects


@pytest.mark.parametrize("seed", [4, 5])
def test_a_straggler_that_waits_at_every_barrier_is_not_taken_for_its_victim(run, seed: int) -> None:  # type: ignore[no-untyped-def]
    # unseen-straggler_ends-002 on seeds of our own: dp32 in `checkpoint~` (40 ms steps, a 5 s save
    # every 30 steps) with a 1.5x rank for 15 s. Its data-parallel slot was hot with full evidence,
    # but it waited at each save's barrier more than its mates did, and that excused it: missed
    res = run(
        Layout(tp=1, pp=1, dp=32),
        Fault("slow_compute", "rank", ranks=(16,), factor=1.5, onset=31.8, duration=15.0),
        step_s=0.04,
        profile=UNSEEN_PROFILES["checkpoint~"],
        duration=60.0,
        seed=seed,
    )
    assert res.latency[0] is not None and res.latency[0] <= 12.0, res.latency
    assert not res.false_suspects, res.false_suspects


def test_ranks_that_waited_at_the_barrier_on_a_named_slow_node_stay_its_victims(run) -> None:  # type: ignore[no-untyped-def]
    # bench/probe_saves.py's tp4pp2dp4 `everything` 100/s node, seed 134: a node of one data-parallel
    # replica waits at each barrier on the slow node, which writes slower too; without the exception
    # for a wait on a suspect already named, that node was named beside it 20 s after the onset
    res = _probe_saves_node(run, Layout(tp=4, pp=2, dp=4), 100.0, "everything", seed=134)
    assert res.latency[0] is not None, "the slow node was not named"
    assert not res.false_suspects, [(r.key, r.first) for r in res.false_suspects]
