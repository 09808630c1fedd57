"""Batches are folded into a job's state together at ``evaluate``, not one by one as they come.

A detector that folds each batch at once (``fold_rows=0``) is the reference: folding many at a
time must leave the same progress, liveness and pending blocks, and report the same suspects at
the same moments, including what only the last batch of a rank may say (point-to-point ops in
flight, a hang's stack, a crash).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from rankwatch.detector import DetectorConfig, JobDetector
from rankwatch.detector.evaluate import run_scenario
from rankwatch.sim import Fault, Layout, Scenario, Workload, deliveries
from rankwatch.sim.scenario import PROFILES
from rankwatch.sim.stream import stream_blocks

PIPE = Layout(tp=4, pp=2, dp=2)


def _scenario(fault: Fault | None, profile: str = "cpu_noise", duration: float = 40.0) -> Scenario:
    return Scenario(
        "fold",
        layout=PIPE,
        workload=Workload.for_rate(100.0, PIPE),
        profile=PROFILES[profile],
        duration=duration,
        seed=11,
        faults=() if fault is None else (fault,),
    )


@pytest.mark.parametrize(
    "fault",
    [
        Fault("slow_compute", "rank", ranks=(5,), factor=1.5, onset=15.0),
        Fault("hang_compute", "rank", ranks=(6,), onset=15.0),
        Fault("crash", "rank", ranks=(2,), onset=15.0, silent=True, kill_after=3.0),
    ],
    ids=["straggler", "hang", "crash"],
)
def test_folding_together_reports_what_folding_one_by_one_does(fault: Fault) -> None:
    sc = _scenario(fault)
    one_by_one = run_scenario(sc, DetectorConfig(fold_rows=0), eval_every=0.5)
    together = run_scenario(sc, DetectorConfig(), eval_every=0.5)
    assert one_by_one.reported, "the fault must be found for the comparison to mean anything"
    got = [(r.key, r.first, r.last) for r in together.reported]
    assert got == [(r.key, r.first, r.last) for r in one_by_one.reported]


def _per_slot(det: JobDetector, values: np.ndarray) -> dict[tuple[str, int], float]:
    """Values by (channel name, place in the channel): channels may be made in another order."""
    topo = det.topo
    chs = topo.slot_ch[: topo.n_slots].tolist()
    v = np.nan_to_num(values[: topo.n_slots].astype(np.float64), nan=-1.0).round(1).tolist()
    return {(topo.ch_name[c], s - int(topo.ch_off[c])): v[s] for s, c in enumerate(chs)}


def _fed(cfg: DetectorConfig, sc: Scenario, until: float) -> JobDetector:
    det = JobDetector(cfg)
    for d in deliveries(sc):
        if d.received_at > until:
            break
        det.observe(d.batch, d.received_at)
    det.ready(until)  # folds what is held
    return det


def test_folded_state_is_the_same() -> None:
    # a pipeline whose stage hangs: receives stay in flight, so the last batch of a rank matters
    sc = _scenario(Fault("hang_compute", "rank", ranks=(4,), onset=8.0), duration=20.0)
    a = _fed(DetectorConfig(fold_rows=0), sc, 14.0)
    b = _fed(DetectorConfig(), sc, 14.0)
    assert b.batches == a.batches > 100
    assert np.isfinite(a.prog.since).any(), "something must be in flight at the cut"
    for name in ("entered", "completed", "wm", "since"):  # since: seconds, to 0.1 s (clock offsets)
        assert _per_slot(b, getattr(b.prog, name)) == _per_slot(a, getattr(a.prog, name)), name
    for name in ("last_seen", "flush", "state", "state_at", "restart"):
        np.testing.assert_array_equal(getattr(b.live, name), getattr(a.live, name), err_msg=name)
    assert b.live.notes == a.live.notes
    assert b.cells.rows == a.cells.rows


def test_a_rank_in_several_held_batches_keeps_its_last_word() -> None:
    # block mode, one body per rank and flush, held for many flushes: each rank appears many times
    sc = dataclasses.replace(_scenario(Fault("slow_compute", "rank", ranks=(3,), factor=2.0, onset=10.0)), duration=20)
    eager, held = JobDetector(DetectorConfig(fold_rows=0)), JobDetector()
    for d in stream_blocks(sc, agent_ranks=8, block_s=0.2):
        eager.observe_blocks(d.batch, d.received_at)
        held.observe_blocks(d.batch, d.received_at)
    assert len(held._queue) > 2 * PIPE.world // 8, "batches of the same ranks must be held together"
    eager.ready(sc.duration)
    held.ready(sc.duration)
    for name in ("last_seen", "flush", "state", "restart"):
        np.testing.assert_array_equal(getattr(held.live, name), getattr(eager.live, name), err_msg=name)
    np.testing.assert_allclose(held.live.offset, eager.live.offset, rtol=0, atol=1e-9)
    for name in ("entered", "wm"):
        assert _per_slot(held, getattr(held.prog, name)) == _per_slot(eager, getattr(eager.prog, name)), name
    assert held.cells.rows == eager.cells.rows
    assert {f.key for f in held.evaluate(sc.duration)} == {f.key for f in eager.evaluate(sc.duration)}


def test_held_batches_are_bounded() -> None:
    sc = _scenario(None, duration=10.0)
    det = JobDetector(DetectorConfig(fold_rows=500))
    most = 0
    for d in deliveries(sc):
        det.observe(d.batch, d.received_at)
        most = max(most, det._queue_rows)
    assert 0 < most < 500 + 200  # one batch past the bound at most


def test_folding_in_turns_is_folding_at_once() -> None:
    sc = _scenario(Fault("hang_compute", "rank", ranks=(4,), onset=8.0), duration=14.0)
    at_once, in_turns = JobDetector(), JobDetector()
    for d in deliveries(sc):
        at_once.observe(d.batch, d.received_at)
        in_turns.observe(d.batch, d.received_at)
    held = in_turns.held_rows
    assert held > 2_000
    turns = 1
    while in_turns.fold(500):
        turns += 1
        assert 0 < in_turns.held_rows < held
    assert in_turns.held_rows == 0 and turns >= held // 500 // 2
    at_once.ready(14.0)
    for name in ("entered", "completed", "wm", "since"):
        assert _per_slot(in_turns, getattr(in_turns.prog, name)) == _per_slot(at_once, getattr(at_once.prog, name))
    np.testing.assert_array_equal(in_turns.live.last_seen, at_once.live.last_seen)
    assert in_turns.cells.rows == at_once.cells.rows
