"""Slow nodes where a node is one tensor-parallel group (tp8dp8), on seeds of our own.

In tp8dp8 a node's eight ranks are one tensor-parallel group: a slow node and one rank's long GC
pause both make the whole node late at every data-parallel reduce, and a 1.5x node stretches the
job's 0.6 s steps to 0.9 s, where the reduces come too far apart to fill the window and too close
for the long ring (docs/detector.md, *A node that is one group*). This probe (outside the
evaluation suite's splits: its own seeds, 401-420) slows node 2 by 1.2x or 1.5x at 20 s in
tp8dp8 jobs at 30 collectives per rank per second with five jitter profiles (the tuning splits'
`gc`, `everything` and `checkpoint`, heldout's `gc+` and `data+`) and prints each run's latency
and false suspects, then the totals. `bench/probe_healthy.py` has the healthy side.

python bench/probe_nodes.py --workers 2
"""

from __future__ import annotations

import argparse
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor

from rankwatch.detector.evaluate import run_scenario
from rankwatch.sim import PROFILES, Fault, Layout, Scenario, Workload
from rankwatch.sim.suite import HELDOUT_PROFILES

LAYOUT = Layout(tp=8, pp=1, dp=8)
PROFS = {**PROFILES, **HELDOUT_PROFILES}
PROFILE_NAMES = ("gc", "gc+", "everything", "data+", "checkpoint")

Run = tuple[str, float, int]


def _runs() -> list[Run]:
    out: list[Run] = []
    seed = 400
    for prof in PROFILE_NAMES:
        for factor in (1.2, 1.5):
            for _ in range(2):
                seed += 1
                out.append((prof, factor, seed))
    return out


def _one(args: Run) -> tuple[Run, float | None, list[tuple[str, float]]]:
    prof, factor, seed = args
    sc = Scenario(
        name=f"tp8dp8-{prof}-{factor}",
        layout=LAYOUT,
        workload=Workload.for_rate(30.0, LAYOUT),
        profile=PROFS[prof],
        faults=(Fault("slow_compute", "node", nodes=(2,), factor=factor, onset=20.0),),
        duration=40.0,
        seed=seed,
    )
    r = run_scenario(sc)
    return args, r.latency[0], [(x.key, round(x.first, 1)) for x in r.false_suspects]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=1)
    args = ap.parse_args(argv)
    found: dict[float, list[float]] = {1.2: [], 1.5: []}
    missed = false = 0
    with ProcessPoolExecutor(max(1, args.workers)) as pool:
        for (prof, factor, seed), lat, bad in pool.map(_one, _runs()):
            if lat is None:
                missed += 1
            else:
                found[factor].append(lat)
            shown = "-" if lat is None else f"{lat:.1f}"
            print(f"{prof:<11} {factor:.1f}x seed={seed} latency={shown} false={bad}", flush=True)
            false += len(bad)
    parts = [
        f"{f}x: {len(v)} found, median {statistics.median(v):.1f} s" if v else f"{f}x: none found"
        for f, v in found.items()
    ]
    print(f"slow nodes: {'; '.join(parts)}; {missed} missed; false suspects {false} (in 20 runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
