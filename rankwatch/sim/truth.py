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
    """Healthy step rate over faulty step rate after the first fault's onset (None: no slow fault).

    The same scenario runs twice through the engine, with and without its slow faults, and the
    steps finished between five seconds after the onset and the end are counted.

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
    na = np.count_nonzero((a >= t0) & (a < t1))
    nb = np.count_nonzero((b >= t0) & (b < t1))
    if nb == 0:
        return math.inf
    return float(na / nb)
