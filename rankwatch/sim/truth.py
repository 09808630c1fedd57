"""Ground truth the evaluation needs beyond the labels: how much slower a fault really makes the job."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from rankwatch.sim.engine import Engine
from rankwatch.sim.scenario import Scenario

__all__ = ["job_slowdown", "step_ends"]


def step_ends(sc: Scenario) -> np.ndarray:
    """Server time each training step ends (the last rank done), for the whole scenario."""
    eng = Engine(sc)
    for _ in eng.steps(sc.duration):
        if not np.isfinite(eng.t_free).any():
            break
    return np.asarray(eng.step_ends)


def job_slowdown(sc: Scenario, faulty_ends: list[float] | np.ndarray | None = None) -> float | None:
    """How much longer the same training steps take with the slow faults than without (None: none).

    The same scenario runs twice through the engine, with and without its slow faults; the
    steps the faulty run finishes between five seconds after the first onset and the end are
    timed in both runs, first to last. The same steps, not the steps finished in a window: the
    window's count is quantised by whatever comes in bursts — in a job that spends most of its
    time in checkpoint saves it held one burst of steps more or fewer, and a 1.5x straggler read
    1.0 on one seed and 1.5 on another.

    Args:
        sc: the scenario.
        faulty_ends: step end times of the faulty run if already simulated (saves a run).
    """
    slow = [f for f in sc.faults if f.kind in ("slow_compute", "slow_comm")]
    if not slow:
        return None
    t0 = min(f.onset for f in slow) + 5.0
    t1 = min(sc.duration, max(f.end for f in slow))
    if not math.isfinite(t1) or t1 - t0 < 5.0:
        t1 = sc.duration
    healthy = dataclasses.replace(sc, faults=tuple(f for f in sc.faults if f not in slow))
    a = step_ends(healthy)
    b = np.asarray(faulty_ends) if faulty_ends is not None else step_ends(sc)
    idx = np.flatnonzero((b >= t0) & (b < t1))
    if idx.shape[0] < 2:
        return math.inf  # (next to) no step finished: stopped
    first, last = int(idx[0]), int(idx[-1])
    if last >= a.shape[0] or a[last] <= a[first]:
        return math.inf
    return float((b[last] - b[first]) / (a[last] - a[first]))
