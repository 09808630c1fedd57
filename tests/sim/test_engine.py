"""The timing model obeys the principle the detector relies on."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from rankwatch.sim import PROFILES, Fault, Layout, Scenario, Workload, save_after
from rankwatch.sim.engine import Engine
from rankwatch.sim.truth import job_slowdown
from rankwatch.wire import OpKind


def test_last_arriver_spends_least_time_inside() -> None:
    lay = Layout(tp=4, pp=1, dp=2)
    sc = Scenario(
        "e",
        layout=lay,
        workload=Workload.for_rate(100, lay),
        duration=5.0,
        faults=(Fault("slow_compute", "rank", ranks=(1,), factor=2.0, onset=0.0),),
    )
    eng = Engine(sc)
    chunk = next(iter(eng.steps(5.0)))
    tp = chunk.kind == int(OpKind.ALL_REDUCE)
    # per collective (group, seq): rank 1 enters last and is inside the shortest
    last_and_shortest = 0
    ops = 0
    for g in np.unique(chunk.gidx[tp]):
        m = tp & (chunk.gidx == g)
        if 1 not in chunk.rank[m]:
            continue
        for s in np.unique(chunk.seq[m]):
            mm = m & (chunk.seq == s)
            inside = chunk.t_end[mm] - chunk.t_start[mm]
            ops += 1
            last_and_shortest += int(
                chunk.rank[mm][np.argmax(chunk.t_start[mm])] == 1 and chunk.rank[mm][np.argmin(inside)] == 1
            )
    assert ops and last_and_shortest >= 0.9 * ops


def test_job_slowdown_is_measured() -> None:
    lay = Layout(tp=4, pp=1, dp=2)
    sc = Scenario(
        "e",
        layout=lay,
        workload=Workload.for_rate(100, lay),
        duration=30.0,
        faults=(Fault("slow_compute", "rank", ranks=(1,), factor=1.5, onset=5.0),),
    )
    s = job_slowdown(sc)
    assert s is not None and 1.2 < s < 1.6


def test_job_slowdown_times_the_same_steps() -> None:
    # a job that spends most of its time saving checkpoints: counted as steps finished in a
    # window, a 1.5x straggler read 1.15, 1.0 and 1.0 on these seeds (the window held one burst
    # of steps more or fewer); timed over the same steps it costs something on every seed
    lay = Layout(tp=1, pp=1, dp=16)
    prof = dataclasses.replace(PROFILES["checkpoint"], ckpt_every=30, ckpt_s=5.0, ckpt_skew_s=2.0)
    got = []
    for seed in (1, 2, 3):
        sc = Scenario(
            "c",
            layout=lay,
            workload=Workload.for_rate(50, lay),
            profile=prof,
            duration=50.0,
            seed=seed,
            faults=(Fault("slow_compute", "rank", ranks=(5,), factor=1.5, onset=20.0),),
        )
        got.append(job_slowdown(sc))
    assert all(s is not None and 1.03 < s < 1.4 for s in got), got


def test_save_after_finds_the_save_between_two_steps() -> None:
    # the first save after t: no op of any rank runs inside it, and it lasts about ckpt_s
    lay = Layout(tp=2, pp=1, dp=4)
    prof = PROFILES["checkpoint"]
    sc = Scenario("e", layout=lay, workload=Workload.for_rate(30, lay), profile=prof, duration=120.0, seed=3)
    start, end = save_after(sc, 15.0)
    assert start >= 15.0
    assert prof.ckpt_s - prof.ckpt_skew_s <= end - start <= prof.ckpt_s + prof.ckpt_skew_s
    eng = Engine(sc)
    inside = 0
    for chunk in eng.steps(end + 1.0):
        inside += int(np.count_nonzero((chunk.t_enter > start + 0.5) & (chunk.t_enter < end - prof.ckpt_skew_s)))
    assert inside == 0
    # ...and a profile that never saves is an error, not a made-up window
    with pytest.raises(ValueError):
        save_after(dataclasses.replace(sc, profile=PROFILES["gc"]), 15.0)
