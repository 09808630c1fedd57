"""Where a straggler's detection latency goes, stage by stage, on the evaluation suite.

python bench/latency_parts.py --splits tune heldout fresh unseen --workers 2

``--set NAME=VALUE`` and ``--flush-s`` change a detector setting or the hooks' send period, as in
``bench/eval_detector.py`` (the output then starts with a line naming them).

For every straggler (noncomm_slow, a rank or a node) in the job slowed 1.2x or more (the issue's
latency bar; ``--all``: every one), the seconds from the fault's onset until:
- ``ev``: one of its slots first had more lateness than its threshold (``LatenessTracker.ex_late``
  over ``thr``: the evidence arrived and is large enough);
- ``hot``: one of its slots had gathered ``cusum_h`` of evidence;
- ``root``: the rank (or one of the node's ranks) was a root: late, and not excused as a victim;
- ``named``: the suspect was reported (the evaluation's latency).
A rank already late at its onset (a second straggler that was already waiting on the first) reads
0 there. The summary gives each stage's median and how many were named within the bar.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import math
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np

from rankwatch.detector.config import DetectorConfig
from rankwatch.detector.evaluate import run_scenario, trial_settings, with_send_period
from rankwatch.detector.job import JobDetector
from rankwatch.sim.evidence import expected_answers
from rankwatch.sim.scenario import Scenario
from rankwatch.sim.suite import SPLITS, build_suite

STAGES = ("ev", "hot", "root")


def _fault_ranks(sc: Scenario, i: int) -> list[int]:
    f = sc.faults[i]
    if f.ranks:
        return list(f.ranks)
    per = sc.layout.gpus_per_node
    return [n * per + k for n in f.nodes for k in range(per)]


def one(sc: Scenario, config: DetectorConfig | None = None) -> list[dict[str, Any]]:
    exp = expected_answers(sc)
    mine = [i for i, e in enumerate(exp) if e.kind == "noncomm_slow"]
    if not mine:
        return []
    marks: dict[int, dict[str, float]] = {i: {} for i in mine}
    ranks = {i: np.asarray(_fault_ranks(sc, i), np.int64) for i in mine}

    def watch(now: float, det: JobDetector) -> None:
        late, topo = det.late, det.topo
        n = min(topo.n_slots, late.ex_late.shape[0])
        for i in mine:
            t = now - sc.faults[i].onset
            if t < 0:
                continue
            m = np.isin(topo.slot_rank[:n], ranks[i])
            over = np.nan_to_num(late.ex_late[:n], nan=-np.inf) >= np.nan_to_num(late.thr[:n], nan=np.inf)
            d = marks[i]
            if (m & over).any():
                d.setdefault("ev", t)
            if (m & late.hot[:n]).any():
                d.setdefault("hot", t)
            if any(int(r) in det.roots for r in ranks[i]):
                d.setdefault("root", t)

    res = run_scenario(sc, config, watch=watch)
    return [
        {
            "name": sc.name,
            "level": exp[i].level,
            "factor": sc.faults[i].factor,
            "slowdown": res.true_slowdown,
            "bar": max(3.0, 3.0 * res.step_s) if math.isfinite(res.step_s) else 3.0,
            "named": res.latency[i],
            **marks[i],
        }
        for i in mine
    ]


def _f(x: float | None) -> str:
    return "   -" if x is None else f"{x:4.1f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--splits", nargs="+", default=["tune", "heldout", "fresh", "unseen"], choices=SPLITS)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--all", action="store_true", help="every straggler, not only those slowing the job 1.2x+")
    ap.add_argument(
        "--set", action="append", default=[], metavar="NAME=VALUE", help="a detector setting (DetectorConfig)"
    )
    ap.add_argument("--flush-s", type=float, default=None, help="the simulated hooks' send period (default: 1 s)")
    args = ap.parse_args(argv)
    try:
        config, said = trial_settings(args.set, args.flush_s)
    except ValueError as e:
        ap.error(str(e))
    if said:
        print(said)
    for split in args.splits:
        scs = with_send_period((s for s in build_suite(split) if s.faults), args.flush_s)
        rows: list[dict[str, Any]] = []
        run = functools.partial(one, config=config)
        with ProcessPoolExecutor(args.workers) if args.workers > 1 else contextlib.nullcontext() as ex:
            for got in ex.map(run, scs, chunksize=2) if ex is not None else map(run, scs):
                rows.extend(r for r in got if args.all or (r["slowdown"] or 0.0) >= 1.2)
        print(f"split={split}: {len(rows)} stragglers")
        print(f"  {'scenario':<38} {'level':<5} {'x':>4} {'job':>5}   ev  hot root named  bar")
        for r in rows:
            sd = "    -" if r["slowdown"] is None else f"{r['slowdown']:5.2f}"
            parts = " ".join(_f(r.get(k)) for k in STAGES)
            print(f"  {r['name']:<38} {r['level']:<5} {r['factor']:4.2f} {sd} {parts} {_f(r['named'])} {r['bar']:4.1f}")
        found = [r for r in rows if r["named"] is not None]
        if not found:
            continue
        med = {k: statistics.median(v) for k in STAGES if (v := [r[k] for r in found if k in r])}
        after_root = [r["named"] - r["root"] for r in found if "root" in r]
        within = sum(r["named"] <= r["bar"] + 1e-9 for r in found)
        print(
            f"  median of the {len(found)} named: "
            + ", ".join(f"{k} {v:.1f}" for k, v in med.items())
            + f", named {statistics.median(r['named'] for r in found):.1f} s; within the bar: {within};"
            f" missed: {len(rows) - len(found)}"
        )
        if after_root:
            hold = {h: sum(abs(x - h) < 1e-6 for x in after_root) for h in (0.0, 0.5, 1.0)}
            rest = len(after_root) - sum(hold.values())
            print(
                "  named after first being a root: "
                + ", ".join(f"{h} s: {c}" for h, c in hold.items())
                + f", longer: {rest}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
