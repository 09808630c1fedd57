"""Stragglers in jobs whose training steps are long: found, how soon, the slowdown they read.

A probe outside the evaluation suite's splits (its own seeds, 301 on). The suite's jobs run
10-1,000 collectives per rank per second, steps of 0.05-0.9 s; real jobs often take seconds a
step, and a data-parallel group then runs one burst of reduces per step with seconds between
(docs/detector.md, *Long steps*). Per step length (0.5, 1, 2 and 3 s): a 1.5x rank of tp4dp4,
a 1.5x and a 1.2x node of tp8dp4 (seen only in the data-parallel groups), a 1.3x rank of dp16
and of tp4pp2dp4, and a healthy run of each layout; `gc` and `everything` jitter. Faults start
after twelve steps (20 s at least) and run for twelve steps (30 s at least).

Prints per run the job's true slowdown, the latency (seconds, and steps), the median slowdown
its suspect read, and any false suspect; then per step length: found, missed, false suspects,
the median latency in steps and the median ratio of read to true slowdown.

python bench/probe_steps.py --workers 2
"""

from __future__ import annotations

import argparse
import math
import sys
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from rankwatch.detector.evaluate import run_scenario
from rankwatch.sim import PROFILES, Fault, Layout, Scenario, Workload

STEPS = (0.5, 1.0, 2.0, 3.0)
CASES: dict[str, tuple[Layout, str, tuple[int, ...], float]] = {
    # name: layout, where, which ranks (or nodes), factor
    "tp4dp4-rank": (Layout(tp=4, dp=4), "rank", (5,), 1.5),
    "tp8dp4-node": (Layout(tp=8, dp=4), "node", (1,), 1.5),
    "tp8dp4-node-mild": (Layout(tp=8, dp=4), "node", (2,), 1.2),
    "dp16-rank": (Layout(dp=16), "rank", (3,), 1.3),
    "tp4pp2dp4-rank": (Layout(tp=4, pp=2, dp=4), "rank", (9,), 1.3),
    "tp4dp4-healthy": (Layout(tp=4, dp=4), "healthy", (), 1.0),
    "tp8dp4-healthy": (Layout(tp=8, dp=4), "healthy", (), 1.0),
    "dp16-healthy": (Layout(dp=16), "healthy", (), 1.0),
    "tp4pp2dp4-healthy": (Layout(tp=4, pp=2, dp=4), "healthy", (), 1.0),
}
PROFILE_NAMES = ("gc", "everything")

Run = tuple[float, str, str, int]
Out = tuple[Run, float | None, float, list[float | None], list[float], list[tuple[str, float]]]


def _runs() -> list[Run]:
    out: list[Run] = []
    seed = 300
    for step in STEPS:
        for case in CASES:
            for prof in PROFILE_NAMES:
                seed += 1
                out.append((step, case, prof, seed))
    return out


def _one(args: Run) -> Out:
    step, case, prof, seed = args
    layout, where, which, factor = CASES[case]
    onset = max(20.0, 12 * step)
    faults: tuple[Fault, ...] = ()
    if where == "rank":
        faults = (Fault("slow_compute", "rank", ranks=which, factor=factor, onset=onset),)
    elif where == "node":
        faults = (Fault("slow_compute", "node", nodes=which, factor=factor, onset=onset),)
    sc = Scenario(
        name=f"{case}-{step}",
        layout=layout,
        workload=Workload(step_s=step),
        profile=PROFILES[prof],
        faults=faults,
        duration=onset + max(30.0, 12 * step),
        seed=seed,
    )
    r = run_scenario(sc)
    read = [float(np.median(x.slowdowns)) for x in r.reported if x.match == 0 and x.slowdowns][:1]
    bad = [(x.key, round(x.first, 1)) for x in r.false_suspects]
    return args, r.true_slowdown, r.step_s, r.latency, read, bad


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=1)
    args = ap.parse_args(argv)
    per: dict[float, dict[str, list[float]]] = {
        s: {"found": [], "missed": [], "false": [], "steps": [], "ratio": []} for s in STEPS
    }
    with ProcessPoolExecutor(max(1, args.workers)) as pool:
        for (step, case, prof, seed), true, step_s, lat, read, bad in pool.map(_one, _runs()):
            p = per[step]
            shown = ["-" if x is None else f"{x:.1f}" for x in lat]
            in_steps = [x / step_s for x in lat if x is not None and math.isfinite(step_s) and step_s > 0]
            ratio = [x / true for x in read if true]
            what = f"step {step:.1f} {case:<18} {prof:<10} seed={seed}"
            slow = "-" if true is None else f"{true:.3f}"
            print(
                f"{what} job={slow} latency={shown} steps={[round(x, 1) for x in in_steps]} "
                f"read={[round(x, 2) for x in read]} false={bad}",
                flush=True,
            )
            p["found"] += [1.0 for x in lat if x is not None]
            p["missed"] += [1.0 for x in lat if x is None]
            p["false"] += [1.0 for _ in bad]
            p["steps"] += in_steps
            p["ratio"] += ratio
    print()
    print("step  found missed false  latency (steps, median)  read/true slowdown (median, range)")
    for step, p in per.items():
        med = f"{np.median(p['steps']):.1f}" if p["steps"] else "-"
        rat = f"{np.median(p['ratio']):.2f} ({min(p['ratio']):.2f}-{max(p['ratio']):.2f})" if p["ratio"] else "-"
        print(f"{step:4.1f}  {len(p['found']):5d} {len(p['missed']):6d} {len(p['false']):5d}  {med:>23}  {rat}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
