"""Does scikit-learn's IsolationForest beat the robust statistics at naming stragglers?

For straggler and healthy scenarios of the tuning split, at every evaluation the same per-rank
features the detector computes (per rank: its largest lateness excess over its groups, in units
of the detector's noise scale and in seconds per second; its extra time inside other groups' ops;
its largest in-collective-time excess) are given to an ``IsolationForest`` fitted on that job's
ranks at that moment; a rank is flagged when it is the forest's outlier (``score_samples`` below
``--cut``) at two evaluations in a row. The detector's own verdicts on the same runs are counted
alongside. Printed: suspects right / reported, stragglers found, false suspects on healthy runs.

    python bench/detector_iforest.py --per-class 4
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from rankwatch.detector import JobDetector
from rankwatch.detector.evaluate import ScenarioResult, run_scenario
from rankwatch.sim import Scenario
from rankwatch.sim.suite import build_suite


def features(det: JobDetector) -> tuple[np.ndarray, np.ndarray]:
    topo, late = det.topo, det.late
    n = topo.n_slots
    if not n or late.ex_late.shape[0] < n:
        return np.zeros(0, np.int64), np.zeros((0, 4))
    ex = np.nan_to_num(late.ex_late[:n], nan=0.0)
    z = ex / np.maximum(late.thr[:n] / det.cfg.noise_k, 1e-9)
    _, wd, wo = late._window(n)
    extra = np.clip(np.nan_to_num(wd - late.base_dur[:n] * wo, nan=0.0), 0.0, None)
    exd = np.nan_to_num(late.ex_dur[:n], nan=0.0)
    w = topo.world
    f = np.zeros((w, 4))
    np.maximum.at(f[:, 0], topo.slot_rank, z)
    np.maximum.at(f[:, 1], topo.slot_rank, ex)
    f[:, 2] = np.bincount(topo.slot_rank, extra, w)
    np.maximum.at(f[:, 3], topo.slot_rank, exd)
    return np.arange(w), f


class _Forest:
    """Called at every evaluation: fits a forest on the job's ranks, flags outliers twice in a row."""

    def __init__(self, cut: float) -> None:
        self.cut = cut
        self.det: JobDetector | None = None
        self.prev: set[int] = set()
        self.reported: dict[int, float] = {}

    def __call__(self, now: float, found: object) -> None:
        from sklearn.ensemble import IsolationForest

        if self.det is None:
            return
        ranks, f = features(self.det)
        if f.shape[0] < 4 or now < 12.0:
            return
        s = IsolationForest(n_estimators=50, random_state=0).fit(f).score_samples(f)
        flagged = {int(r) for r in ranks[s < self.cut]}
        for r in flagged & self.prev:
            self.reported.setdefault(r, now)
        self.prev = flagged


def _run_with_forest(sc: Scenario, cut: float) -> tuple[ScenarioResult, dict[int, float]]:
    import rankwatch.detector.evaluate as ev

    forest = _Forest(cut)
    orig = ev.JobDetector

    class Spy(orig):  # type: ignore[misc, valid-type]
        def __init__(self, *a: object, **k: object) -> None:
            super().__init__(*a, **k)  # type: ignore[arg-type]
            forest.det = self

    ev.JobDetector = Spy  # type: ignore[misc]
    try:
        res = run_scenario(sc, on_eval=forest)
    finally:
        ev.JobDetector = orig  # type: ignore[misc]
    return res, forest.reported


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per-class", type=int, default=4)
    ap.add_argument("--cut", type=float, default=-0.62)
    args = ap.parse_args(argv)
    classes = ("healthy", "straggler", "straggler_mild", "straggler_node", "two_stragglers")
    scs = [s for s in build_suite("tune") if s.tags[-1] in classes and s.layout.world <= 32 and s.tags[2] != "1000/s"]
    picked: dict[str, int] = {}
    chosen = []
    for s in scs:
        c = s.tags[-1]
        if picked.get(c, 0) < (2 * args.per_class if c == "healthy" else args.per_class):
            picked[c] = picked.get(c, 0) + 1
            chosen.append(s)
    totals = {"if_right": 0, "if_reported": 0, "if_found": 0, "det_right": 0, "det_reported": 0, "det_found": 0}
    faults = 0
    healthy_false = {"if": 0, "det": 0}
    for sc in chosen:
        res, reported = _run_with_forest(sc, args.cut)
        want = {r for e in res.expected for r in e.ranks} if res.expected else set()
        onset = min(res.onsets) if res.onsets else np.inf
        node_level = any(e.level == "node" for e in res.expected)
        right = {r for r, t in reported.items() if r in want and t >= onset}
        if res.healthy:
            healthy_false["if"] += len(reported)
            healthy_false["det"] += len(res.reported)
        else:
            faults += len(res.expected)
            if node_level:  # one suspect for the node, however many of its ranks were flagged
                totals["if_reported"] += len(set(reported) - want) + (1 if right else 0)
                totals["if_right"] += 1 if right else 0
            else:
                totals["if_reported"] += len(reported)
                totals["if_right"] += len(right)
            totals["if_found"] += sum(1 for e in res.expected if set(e.ranks) & right)
            totals["det_reported"] += len(res.reported)
            totals["det_right"] += sum(1 for r in res.reported if r.match >= 0)
            totals["det_found"] += sum(1 for x in res.latency if x is not None)
    print(f"scenarios: {len(chosen)} ({picked}), faults: {faults}")
    for who in ("if", "det"):
        name = "IsolationForest" if who == "if" else "robust statistics (the detector)"
        rep, right, found = totals[f"{who}_reported"], totals[f"{who}_right"], totals[f"{who}_found"]
        print(
            f"{name:<34} precision {right / max(1, rep):.3f} ({right}/{rep})  recall {found / max(1, faults):.3f}"
            f"  false suspects on healthy runs: {healthy_false[who]}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
