"""Stragglers that begin as a checkpoint's save does: how soon after the job resumes they are named.

A straggler that starts while the job saves shows nothing until the job runs again; from then on
it is as late as any other, and the issue's bar is about how soon it is named from its onset. This
probe (outside the evaluation suite's splits: its own seeds, 201-248) starts a 1.5x rank or a 1.2x
node at the start of the first save after 15 s of jobs that save often (the tuning splits'
`checkpoint` and `everything` profiles; dp16, tp8dp8, tp4pp2dp4 and tp2pp4dp4; 30 and 100
collectives per rank per second) and prints each fault's latency from its onset and from the end
of that save, with a healthy run of each job for the false suspects (docs/detector.md, *Faults
that start at a save*).

python bench/probe_resumes.py --workers 2
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor

from rankwatch.detector.evaluate import run_scenario
from rankwatch.sim import PROFILES, Fault, Layout, Scenario, Workload, save_after

LAYOUTS = {
    "dp16": Layout(tp=1, pp=1, dp=16),
    "tp8dp8": Layout(tp=8, pp=1, dp=8),
    "tp4pp2dp4": Layout(tp=4, pp=2, dp=4),
    "tp2pp4dp4": Layout(tp=2, pp=4, dp=4),
}

Run = tuple[str, str, str, float, int]


def _runs() -> list[Run]:
    out: list[Run] = []
    seed = 200
    for lay in LAYOUTS:
        for prof in ("checkpoint", "everything"):
            for rate in (30.0, 100.0):
                for where in ("rank", "node", "healthy"):
                    seed += 1
                    out.append((lay, prof, where, rate, seed))
    return out


def _one(args: Run) -> tuple[Run, float, float, list[float | None], list[tuple[str, float]]]:
    lay, prof, where, rate, seed = args
    layout = LAYOUTS[lay]
    base = Scenario(
        name=f"{lay}-{prof}-{where}",
        layout=layout,
        workload=Workload.for_rate(rate, layout),
        profile=PROFILES[prof],
        duration=120.0,
        seed=seed,
    )
    start, end = save_after(base, 15.0)
    faults: tuple[Fault, ...] = ()
    if where == "rank":
        faults = (Fault("slow_compute", "rank", ranks=(5,), factor=1.5, onset=start),)
    elif where == "node":
        faults = (Fault("slow_compute", "node", nodes=(1,), factor=1.2, onset=start),)
    sc = dataclasses.replace(base, faults=faults, duration=end + 25.0)
    r = run_scenario(sc)
    return args, start, end, r.latency, [(x.key, round(x.first, 1)) for x in r.false_suspects]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=1)
    args = ap.parse_args(argv)
    after: list[float] = []
    missed = false = 0
    with ProcessPoolExecutor(max(1, args.workers)) as pool:
        for (lay, prof, where, rate, seed), start, end, lat, bad in pool.map(_one, _runs()):
            what = f"{lay:<10} {prof:<10} {rate:>5.0f}/s {where:<8} seed={seed} save {start:5.1f}-{end:5.1f} s"
            shown = ""
            if lat and lat[0] is None:
                missed += 1
                shown = " latency=-"
            elif lat and lat[0] is not None:
                after.append(lat[0] - (end - start))
                shown = f" latency={lat[0]:.1f} after_resume={after[-1]:.1f}"
            print(f"{what}{shown} false={bad}")
            false += len(bad)
    med = statistics.median(after) if after else float("nan")
    print(
        f"faults found {len(after)}, missed {missed}; named a median {med:.1f} s after the save ended; "
        f"false suspects {false} (in 48 runs, 16 of them healthy)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
