"""Every fault class on chosen layouts, with the tuning profiles and rates and seeds of its own.

A probe outside the evaluation suite's splits, for checking a detector change for false suspects
and misses on layouts a split uses without running (or reading) that split: faults are drawn by
the suite's own rules (``rankwatch.sim.suite``), ``--per-class`` of each of its 18 classes, on the
given layouts, with the tuning split's profiles (or, ``--profiles``, heldout's or unseen's
stronger and other jitter) and its 10 and 100 collectives per rank per second, from ``--seed``.
Prints every run with a miss or a false suspect (with how much slower the fault made the job),
then the totals. Misses count every fault; "required" leaves out those the evaluation does not
require (slow faults costing the job under 1.03x). Last, the issue's latency bar over the probe's
slowdowns of 1.2x and worse (stragglers and slow transfers found): median, 95th percentile and the
share named within 3 s or 3 training steps, whichever is longer, as the evaluation's table counts
them; a sample some fifteen times a split's.

python bench/probe_classes.py --layouts tp4pp2dp4 tp2pp4dp2 --seed 5151 --per-class 5 --workers 2
"""

from __future__ import annotations

import argparse
import re
import sys
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from rankwatch.detector.evaluate import _bar, _required, run_scenario
from rankwatch.sim import PROFILES, Layout, Profile, Scenario
from rankwatch.sim.suite import FAULT_CLASSES, HELDOUT_PROFILES, UNSEEN_PROFILES, _faults_for, _onset, _scenario

TUNE_PROFILES = ("quiet", "cpu_noise", "gc", "first_step", "checkpoint", "data", "everything")
# the jitter profiles a probe may draw from: the tuning split's, or those of heldout or unseen
PROFILE_SETS: dict[str, list[Profile]] = {
    "tune": [PROFILES[p] for p in TUNE_PROFILES],
    "heldout": list(HELDOUT_PROFILES.values()),
    "unseen": list(UNSEEN_PROFILES.values()),
}
RATES = (10.0, 100.0)
SLOW_KINDS = ("noncomm_slow", "comm_slow")


def _layout(name: str) -> Layout:
    m = re.fullmatch(r"(?:tp(\d+))?(?:pp(\d+))?(?:dp(\d+))?", name)
    if not m or not any(m.groups()):
        raise SystemExit(f"probe: a layout is named like tp4pp2dp4, not {name!r}")
    tp, pp, dp = (int(x) if x else 1 for x in m.groups())
    return Layout(tp=tp, pp=pp, dp=dp)


def _scenarios(layouts: list[str], seed: int, per_class: int, profiles: str = "tune") -> list[Scenario]:
    rng = np.random.default_rng(seed)
    profs = PROFILE_SETS[profiles]
    out: list[Scenario] = []
    for cls in FAULT_CLASSES:
        made = tries = 0
        while made < per_class and tries < 50 * per_class:
            tries += 1
            name = layouts[int(rng.integers(len(layouts)))]
            lay = _layout(name)
            rate = float(rng.choice(RATES))
            prof = profs[int(rng.integers(len(profs)))]
            faults = _faults_for(cls, lay, rng, _onset(rng, lay, rate), rate)
            if faults is None:
                continue
            sid = seed * 1000 + 100 * FAULT_CLASSES.index(cls) + made
            out.append(_scenario(f"probe-{cls}-{made:03d}", name, lay, rate, prof, faults, sid, (cls,)))
            made += 1
    return out


Run = tuple[str, str, list[tuple[str, float]], int, int, int, float | None, list[tuple[str, float, float]]]


def _one(sc: Scenario) -> Run:
    r = run_scenario(sc)
    false = [(x.key, round(x.first, 1)) for x in r.false_suspects]
    missed = [i for i, x in enumerate(r.latency) if x is None]
    required = sum(1 for i in missed if _required(r, i))
    # the required slow faults of 1.2x and worse that were found: kind, latency, the bar it had
    strong = [
        (e.kind, float(x), bar)
        for i, e in enumerate(r.expected)
        if e.kind in SLOW_KINDS
        and (x := r.latency[i]) is not None
        and _required(r, i)
        and (bar := _bar(r, True)) is not None
    ]
    return sc.name, "/".join(sc.tags[:3]), false, len(missed), required, len(r.latency), r.true_slowdown, strong


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layouts", nargs="+", default=["tp4pp2dp4", "tp2pp4dp2"])
    ap.add_argument("--seed", type=int, default=5151)
    ap.add_argument("--per-class", type=int, default=5)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--profiles", choices=sorted(PROFILE_SETS), default="tune")
    args = ap.parse_args(argv)
    scs = _scenarios(args.layouts, args.seed, args.per_class, args.profiles)
    runs = false = missed = required = faults = 0
    strong: list[tuple[str, float, float]] = []
    with ProcessPoolExecutor(max(1, args.workers)) as pool:
        for name, tags, bad, miss, req, n, job, found in pool.map(_one, scs):
            strong += found
            runs += 1
            false += len(bad)
            missed += miss
            required += req
            faults += n
            if bad or miss:
                cost = "job ?" if job is None else f"job {job:.3f}x"
                print(f"{name:<34} {tags:<28} missed {miss} of {n} ({req} required, {cost}), false {bad}")
    print(f"runs {runs}: faults {faults}, missed {missed} ({required} of them required); false suspects {false}")
    for kind in SLOW_KINDS:
        lat = np.array([x for k, x, _ in strong if k == kind])
        bar = np.array([x <= b for k, x, b in strong if k == kind])
        if lat.shape[0]:
            print(
                f"{kind} of 1.2x and worse: {lat.shape[0]} found, latency median {np.median(lat):.1f} s, "
                f"p95 {np.percentile(lat, 95):.1f} s, within 3 s / 3 steps {bar.mean():.0%}"
            )
        else:
            print(f"{kind} of 1.2x and worse: none found")
    return 0


if __name__ == "__main__":
    sys.exit(main())
