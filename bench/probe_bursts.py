"""Stragglers in deep pipelines of few ops a second: groups that run one burst of ops a step.

A probe outside the evaluation suite's splits (its own seeds, 701 on). At 10 collectives per
rank per second a four-stage pipeline (tp8pp4dp2, tp8pp4dp4, tp2pp4dp4) takes 0.8-0.95 s a step,
and each of its groups runs one burst of ops a step: four or five bursts in the 4 s window a
slot is judged over, and a median only when five are there (docs/detector.md, *A group between
its bursts*). Per layout and jitter (`checkpoint`, `quiet`, `gc`, `everything`): a 1.3x rank, a
1.5x rank with a 1.3x one 5 s later (the suite's ``two_stragglers``), and a healthy run.

Prints per run the job's true slowdown, the latency of each fault and any false suspect; then
per layout: faults found and missed, false suspects, and the median latency.

python bench/probe_bursts.py --workers 2
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from rankwatch.detector.evaluate import run_scenario
from rankwatch.sim import PROFILES, Fault, Layout, Scenario, Workload

LAYOUTS = {
    "tp8pp4dp2": Layout(tp=8, pp=4, dp=2),
    "tp8pp4dp4": Layout(tp=8, pp=4, dp=4),
    "tp2pp4dp4": Layout(tp=2, pp=4, dp=4),
}
KINDS = ("one", "two", "healthy")
PROFILE_NAMES = ("checkpoint", "quiet", "gc", "everything")

Run = tuple[str, str, str, int]
Out = tuple[Run, float | None, list[float | None], list[tuple[str, float]]]


def _runs(seeds: int) -> list[Run]:
    out: list[Run] = []
    seed = 700
    for lay in LAYOUTS:
        for prof in PROFILE_NAMES:
            for _ in range(seeds):
                seed += 1
                out += [(lay, prof, kind, seed) for kind in KINDS]
    return out


def _one(args: Run) -> Out:
    lay_name, prof, kind, seed = args
    lay = LAYOUTS[lay_name]
    rng = np.random.default_rng(seed)
    first, second = (int(x) for x in rng.choice(lay.world, 2, replace=False))
    onset = float(rng.uniform(17.0, 22.0))
    faults: tuple[Fault, ...] = ()
    if kind == "one":
        faults = (Fault("slow_compute", "rank", ranks=(second,), factor=1.3, onset=onset),)
    elif kind == "two":
        faults = (
            Fault("slow_compute", "rank", ranks=(first,), factor=1.5, onset=onset),
            Fault("slow_compute", "rank", ranks=(second,), factor=1.3, onset=onset + 5.0),
        )
    sc = Scenario(
        name=f"{lay_name}-{prof}-{kind}",
        layout=lay,
        workload=Workload.for_rate(10.0, lay),
        profile=PROFILES[prof],
        faults=faults,
        duration=45.0,
        seed=seed,
    )
    r = run_scenario(sc)
    return args, r.true_slowdown, r.latency, [(x.key, round(x.first, 1)) for x in r.false_suspects]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--seeds", type=int, default=5, help="seeds per layout and jitter (default 5)")
    args = ap.parse_args(argv)
    if args.seeds < 1:
        ap.error("--seeds must be 1 or more")
    per: dict[str, dict[str, list[float]]] = {n: {"found": [], "missed": [], "false": []} for n in LAYOUTS}
    with ProcessPoolExecutor(max(1, args.workers)) as pool:
        for (lay, prof, kind, seed), true, lat, bad in pool.map(_one, _runs(args.seeds)):
            p = per[lay]
            shown = ["-" if x is None else f"{x:.1f}" for x in lat]
            slow = "-" if true is None else f"{true:.3f}"
            print(f"{lay:<10} {prof:<11} {kind:<8} seed={seed} job={slow} latency={shown} false={bad}", flush=True)
            p["found"] += [x for x in lat if x is not None]
            p["missed"] += [1.0 for x in lat if x is None]
            p["false"] += [1.0 for _ in bad]
    print()
    print("layout      found missed false  latency (s, median)")
    for lay, p in per.items():
        med = f"{np.median(p['found']):.1f}" if p["found"] else "-"
        print(f"{lay:<10} {len(p['found']):6d} {len(p['missed']):6d} {len(p['false']):5d}  {med:>19}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
