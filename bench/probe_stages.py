"""Slow nodes that are a whole pipeline stage: found, missed, false suspects.

A probe outside the evaluation suite's splits (its own seeds, 201-248), for the case the slow-stage
test handles (docs/detector.md, *A slow node that is a whole pipeline stage*): a node whose ranks
are one stage of tp2pp4dp4 (four stages on four nodes) or tp2pp2dp4 (two), slowed 1.2x, which
costs the job only 4-10% (a stage is one part in (microbatches + stages - 1) of a step); the
heldout profiles `cpu_noise+` and `checkpoint+` and the tuning `gc` and `data`; 30 collectives per
rank per second; the first or the last stage, two seeds each, and a healthy run of each layout and
profile (40 runs, 8 of them healthy).

python bench/probe_stages.py --workers 2
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ProcessPoolExecutor

from rankwatch.detector.evaluate import run_scenario
from rankwatch.sim import PROFILES, Fault, Layout, Scenario, Workload
from rankwatch.sim.suite import HELDOUT_PROFILES

LAYOUTS = {"tp2pp4dp4": Layout(tp=2, pp=4, dp=4), "tp2pp2dp4": Layout(tp=2, pp=2, dp=4)}
PROFILE_NAMES = ("cpu_noise+", "checkpoint+", "gc", "data")

Run = tuple[str, str, str, int]


def _runs() -> list[Run]:
    out: list[Run] = []
    seed = 200
    for lay in LAYOUTS:
        for prof in PROFILE_NAMES:
            for where in ("first", "last", "healthy"):
                for _ in range(2 if where != "healthy" else 1):
                    seed += 1
                    out.append((lay, prof, where, seed))
    return out


def _one(args: Run) -> tuple[Run, float, list[float | None], list[tuple[str, float]]]:
    lay, prof, where, seed = args
    layout = LAYOUTS[lay]
    faults: tuple[Fault, ...] = ()
    if where != "healthy":
        node = 0 if where == "first" else layout.n_nodes - 1
        faults = (Fault("slow_compute", "node", nodes=(node,), factor=1.2, onset=24.0),)
    sc = Scenario(
        name=f"{lay}-{prof}-{where}",
        layout=layout,
        workload=Workload.for_rate(30.0, layout),
        profile=HELDOUT_PROFILES.get(prof) or PROFILES[prof],
        faults=faults,
        duration=60.0,
        seed=seed,
    )
    r = run_scenario(sc)
    return args, r.true_slowdown or 1.0, r.latency, [(x.key, round(x.first, 1)) for x in r.false_suspects]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=1)
    args = ap.parse_args(argv)
    found = missed = false = runs = 0
    with ProcessPoolExecutor(max(1, args.workers)) as pool:
        for (lay, prof, where, seed), slow, lat, bad in pool.map(_one, _runs()):
            shown = ["-" if x is None else f"{x:.1f}" for x in lat]
            what = f"{lay:<10} {prof:<12} {where:<8} seed={seed}"
            print(f"{what} slowdown={slow:.3f} latency={shown} false={bad}")
            found += sum(x is not None for x in lat)
            missed += sum(x is None for x in lat)
            false += len(bad)
            runs += 1
    print(f"faults found {found}, missed {missed}; false suspects {false} (in {runs} runs, 8 of them healthy)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
