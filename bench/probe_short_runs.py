"""Stragglers in pure data-parallel jobs that save often: short runs of steps between long pauses.

A probe outside the evaluation suite's splits (seeds of its own): dp16, dp24 and dp32 at 10, 50
and 100 collectives per rank per second with the save-heavy jitter profiles of the tuning,
heldout and unseen splits (``checkpoint``, ``everything``, ``checkpoint+``, ``checkpoint~``; not
sealed's). Saves are counted in steps, so at 100/s a job runs half a second of steps between
saves of 4-6 s. ``--per-class`` runs of each straggler class (drawn by the suite's own rules)
and as many healthy runs (``--healthy``: another number), then flapping stragglers
(``straggler_flap``: added later, and drawn last so that the runs before them stay as they were;
``--classes`` keeps some of the classes drawn). Prints every run (latencies, whether each fault
is required, how much slower it made the job, false suspects), then the totals.

python bench/probe_short_runs.py --seed 91 --per-class 8 --workers 2
"""

from __future__ import annotations

import argparse
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from rankwatch.detector.evaluate import _required, run_scenario
from rankwatch.sim import PROFILES, Layout, Scenario
from rankwatch.sim.suite import HELDOUT_PROFILES, UNSEEN_PROFILES, _faults_for, _onset, _scenario

PROFS = (
    PROFILES["checkpoint"],
    PROFILES["everything"],
    HELDOUT_PROFILES["checkpoint+"],
    UNSEEN_PROFILES["checkpoint~"],
)
LAYOUTS = {f"dp{n}": Layout(tp=1, pp=1, dp=n) for n in (16, 24, 32)}
RATES = (10.0, 50.0, 100.0)
CLASSES = (
    "straggler",
    "straggler_mild",
    "straggler_node",
    "two_stragglers",
    "straggler_ends",
    "healthy",
    "straggler_flap",
)


def _scenarios(seed: int, per_class: int, classes: tuple[str, ...] = CLASSES, healthy: int = 0) -> list[Scenario]:
    """``per_class`` runs of each class (``healthy``, if given, of healthy runs), drawn for every
    class in turn, of which those of ``classes`` are kept."""
    rng = np.random.default_rng(seed)
    out: list[Scenario] = []
    for ci, cls in enumerate(CLASSES):
        for k in range(healthy if cls == "healthy" and healthy else per_class):
            name = list(LAYOUTS)[int(rng.integers(len(LAYOUTS)))]
            lay = LAYOUTS[name]
            rate = float(rng.choice(RATES))
            prof = PROFS[int(rng.integers(len(PROFS)))]
            faults = () if cls == "healthy" else _faults_for(cls, lay, rng, _onset(rng, lay, rate), rate)
            if faults is None or cls not in classes:
                continue
            out.append(
                _scenario(f"short-{cls}-{k:03d}", name, lay, rate, prof, faults, seed * 1000 + 100 * ci + k, (cls,))
            )
    return out


def _one(sc: Scenario) -> tuple[str, str, list[tuple[str, float]], list[float | None], list[bool], float | None]:
    r = run_scenario(sc)
    false = [(x.key, round(x.first, 1)) for x in r.false_suspects]
    lat = [None if x is None else round(x, 1) for x in r.latency]
    return sc.name, "/".join(sc.tags[:3]), false, lat, [_required(r, i) for i in range(len(lat))], r.true_slowdown


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=91)
    ap.add_argument("--per-class", type=int, default=8)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--classes", nargs="+", choices=CLASSES, default=list(CLASSES))
    ap.add_argument("--healthy", type=int, default=0, help="healthy runs (default: --per-class)")
    args = ap.parse_args(argv)
    faults = missed = req_missed = false = 0
    found: list[float] = []
    with ProcessPoolExecutor(max(1, args.workers)) as pool:
        for name, tags, bad, lat, req, job in pool.map(
            _one, _scenarios(args.seed, args.per_class, tuple(args.classes), args.healthy)
        ):
            faults += len(lat)
            missed += sum(x is None for x in lat)
            req_missed += sum(x is None and q for x, q in zip(lat, req, strict=True))
            found += [x for x, q in zip(lat, req, strict=True) if x is not None and q]
            false += len(bad)
            cost = "-" if job is None else f"{job:.3f}x"
            print(f"{name:<26} {tags:<26} latency {lat} required {req} job {cost} false {bad}")
    med = f"{statistics.median(found):.1f} s" if found else "-"
    print(
        f"faults {faults}: missed {missed} ({req_missed} of them required); "
        f"required found: median latency {med}; false suspects {false}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
