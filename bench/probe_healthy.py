"""False suspects in healthy jobs, and beside a hang, on seeds of our own: a wider sample than the suite's.

The suite's healthy runs are 15-36 per split; a detector that names one false suspect an hour of
job in a given setting can pass them all. This probe (its own seeds, 301 and up) runs healthy jobs
of 60 s in five layouts (dp16, tp4dp4, tp8dp8, tp2pp4dp4, tp4pp2dp4) with four jitter profiles:
the tuning splits' `gc` and `everything` and heldout's `gc+` and `data+` (heavier GC pauses;
uneven steps), at 30 collectives per rank per second, and the same jobs with node 1 hung at 21 s,
where anything named besides the hang is false (a stop leaves its last buckets in the ring). It
prints each run's false suspects, then per layout and profile and in all: false suspects per hour
of healthy job, and the hangs named and how soon (docs/detector.md, *False suspects on seeds of
our own*).

python bench/probe_healthy.py --workers 2
python bench/probe_healthy.py --workers 2 --first-seed 1001 --hangs 0   (another 100 healthy jobs)
python bench/probe_healthy.py --workers 2 --hangs 0 --wide   (the twelve ranges of 100 the thirtieth
    and thirty-first sessions ran: 1,200 healthy jobs, 20 job-hours, about 13 minutes)
python bench/probe_healthy.py --workers 2 --hangs 0 --healthy 40 --layouts tp2pp4dp4 --profiles quiet
    (chosen layouts and jitter profiles: here a four-stage pipeline without jitter)
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor

from rankwatch.detector.evaluate import run_scenario
from rankwatch.sim import PROFILES, Fault, Layout, Scenario, Workload
from rankwatch.sim.suite import HELDOUT_PROFILES

LAYOUTS = {
    "dp16": Layout(tp=1, pp=1, dp=16),
    "tp4dp4": Layout(tp=4, pp=1, dp=4),
    "tp8dp8": Layout(tp=8, pp=1, dp=8),
    "tp2pp4dp4": Layout(tp=2, pp=4, dp=4),
    "tp4pp2dp4": Layout(tp=4, pp=2, dp=4),
}
PROFS = {**PROFILES, **HELDOUT_PROFILES}
PROFILE_NAMES = ("gc", "everything", "gc+", "data+")
HEALTHY_S = 60.0
HANG_AT, HANG_S = 21.0, 35.0

Run = tuple[str, str, str, int]
# first seeds of the wider sample (``--wide``): twelve ranges of 100 healthy jobs (``--hangs 0``)
WIDE_SEEDS = (301, 1001, 2001, 3001, 4001, 5001, 6001, 7001, 8001, 9001, 10001, 20001)


def _runs(
    healthy: int,
    hangs: int,
    first_seed: int = 301,
    layouts: tuple[str, ...] = tuple(LAYOUTS),
    profiles: tuple[str, ...] = PROFILE_NAMES,
) -> list[Run]:
    out: list[Run] = []
    seed = first_seed - 1
    for lay in layouts:
        for prof in profiles:
            for what in ("healthy",) * healthy + ("hang",) * hangs:
                seed += 1
                out.append((lay, prof, what, seed))
    return out


def _one(args: Run) -> tuple[Run, list[float | None], list[tuple[str, float]]]:
    lay, prof, what, seed = args
    layout = LAYOUTS[lay]
    hang = what == "hang"
    sc = Scenario(
        name=f"{lay}-{prof}-{what}",
        layout=layout,
        workload=Workload.for_rate(30.0, layout),
        profile=PROFS[prof],
        faults=(Fault("hang_compute", "node", nodes=(1,), onset=HANG_AT),) if hang else (),
        duration=HANG_S if hang else HEALTHY_S,
        seed=seed,
    )
    r = run_scenario(sc)
    return args, r.latency, [(x.key, round(x.first, 1)) for x in r.false_suspects]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--healthy", type=int, default=5, help="healthy runs per layout and profile")
    ap.add_argument("--hangs", type=int, default=2, help="runs with a hung node per layout and profile")
    seeds = ap.add_mutually_exclusive_group()
    seeds.add_argument(
        "--first-seed", type=int, default=301, help="seed of the first run, the rest counting up (another sample)"
    )
    seeds.add_argument("--wide", action="store_true", help=f"every range of WIDE_SEEDS in turn: {WIDE_SEEDS}")
    ap.add_argument("--layouts", nargs="+", choices=list(LAYOUTS), default=list(LAYOUTS), help="these layouts only")
    ap.add_argument(
        "--profiles", nargs="+", choices=sorted(PROFS), default=list(PROFILE_NAMES), help="these jitter profiles"
    )
    args = ap.parse_args(argv)
    runs = [
        r
        for first in (WIDE_SEEDS if args.wide else (args.first_seed,))
        for r in _runs(args.healthy, args.hangs, first, tuple(args.layouts), tuple(args.profiles))
    ]
    # per (layout, profile): healthy runs and their false suspects; hangs named; false beside hangs
    healthy: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    hang_lat: list[float] = []
    hang_missed = beside = 0
    with ProcessPoolExecutor(max(1, args.workers)) as pool:
        for (lay, prof, what, seed), lat, bad in pool.map(_one, runs):
            shown = ""
            if what == "hang":
                if lat and lat[0] is not None:
                    hang_lat.append(lat[0])
                    shown = f" hang named after {lat[0]:.1f} s"
                else:
                    hang_missed += 1
                    shown = " hang not named as the node"
                beside += len(bad)
            else:
                healthy[lay, prof][0] += 1
                healthy[lay, prof][1] += len(bad)
            print(f"{lay:<10} {prof:<11} {what:<8} seed={seed}{shown} false={bad}", flush=True)
    print()
    print(f"{'layout':<10} {'profile':<11} {'runs':>5} {'false':>6} {'per job-hour':>13}")
    runs_n = false_n = 0
    for (lay, prof), (n, f) in healthy.items():
        runs_n, false_n = runs_n + n, false_n + f
        print(f"{lay:<10} {prof:<11} {n:>5} {f:>6} {f / (n * HEALTHY_S / 3600.0):>13.1f}")
    hours = runs_n * HEALTHY_S / 3600.0
    print(
        f"healthy: {false_n} false suspects in {runs_n} runs ({hours:.2f} job-hours, "
        f"{false_n / hours if hours else float('nan'):.1f} per job-hour)"
    )
    n_hang = len(hang_lat) + hang_missed
    med = statistics.median(hang_lat) if hang_lat else float("nan")
    print(
        f"hangs: {len(hang_lat)} of {n_hang} named as node 1 (median {med:.1f} s after the hang), "
        f"{beside} false suspects beside them (a hang named at another level among them)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
