"""Stragglers in jobs that save checkpoints often: found, missed, false suspects.

A probe outside the evaluation suite's splits (its own seeds, 101-148), for the layouts where a
job that saves every few dozen short steps loses most of a straggler's cost at the barrier after
each save (docs/detector.md, *Barriers of a job that mostly saves*): dp16, dp24, tp8dp4 and
tp4pp2dp4; the tuning splits' `checkpoint` and `everything` profiles; 30 and 100 collectives per
rank per second; a 1.2x node, a 1.3x rank and a healthy run of each (48 runs).

python bench/probe_saves.py --workers 2
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ProcessPoolExecutor

from rankwatch.detector.evaluate import run_scenario
from rankwatch.sim import PROFILES, Fault, Layout, Scenario, Workload

LAYOUTS = {
    "dp24": Layout(tp=1, pp=1, dp=24),
    "tp8dp4": Layout(tp=8, pp=1, dp=4),
    "tp4pp2dp4": Layout(tp=4, pp=2, dp=4),
    "dp16": Layout(tp=1, pp=1, dp=16),
}

Run = tuple[str, str, str, float, int]


def _runs() -> list[Run]:
    out: list[Run] = []
    seed = 100
    for lay in LAYOUTS:
        for prof in ("checkpoint", "everything"):
            for rate in (30.0, 100.0):
                for where in ("node", "rank", "healthy"):
                    seed += 1
                    out.append((lay, prof, where, rate, seed))
    return out


def _one(args: Run) -> tuple[Run, float, list[float | None], list[tuple[str, float]]]:
    lay, prof, where, rate, seed = args
    layout = LAYOUTS[lay]
    faults: tuple[Fault, ...] = ()
    if where == "node":
        faults = (Fault("slow_compute", "node", nodes=(1,), factor=1.2, onset=20.0),)
    elif where == "rank":
        faults = (Fault("slow_compute", "rank", ranks=(5,), factor=1.3, onset=20.0),)
    sc = Scenario(
        name=f"{lay}-{prof}-{where}",
        layout=layout,
        workload=Workload.for_rate(rate, layout),
        profile=PROFILES[prof],
        faults=faults,
        duration=50.0,
        seed=seed,
    )
    r = run_scenario(sc)
    return args, r.true_slowdown or 1.0, r.latency, [(x.key, round(x.first, 1)) for x in r.false_suspects]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=1)
    args = ap.parse_args(argv)
    found = missed = false = 0
    with ProcessPoolExecutor(max(1, args.workers)) as pool:
        for (lay, prof, where, rate, seed), slow, lat, bad in pool.map(_one, _runs()):
            shown = ["-" if x is None else f"{x:.1f}" for x in lat]
            what = f"{lay:<10} {prof:<10} {rate:>5.0f}/s {where:<8} seed={seed}"
            print(f"{what} slowdown={slow:.3f} latency={shown} false={bad}")
            found += sum(x is not None for x in lat)
            missed += sum(x is None for x in lat)
            false += len(bad)
    print(f"faults found {found}, missed {missed}; false suspects {false} (in 48 runs, 16 of them healthy)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
