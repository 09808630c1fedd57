"""Run the detector's evaluation suite and print its table (see docs/detector.md).

python bench/eval_detector.py --split tune --workers 2
python bench/eval_detector.py --split heldout --workers 2

To try a setting on a split without editing the code, ``--set NAME=VALUE`` (a field of
``DetectorConfig``, repeatable) and ``--flush-s`` (the simulated hooks' send period); the table
then starts with a line naming what was changed, so it is never taken for the code's own:

python bench/eval_detector.py --split heldout --workers 2 --set hold_s=0.5 --flush-s 0.5
"""

from __future__ import annotations

import argparse
import sys

from rankwatch.detector.evaluate import EVAL_EVERY_S, ScenarioResult, evaluate_suite, trial_settings, with_send_period
from rankwatch.sim.suite import SPLITS, build_suite


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--split", default="tune", choices=SPLITS)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--only", default=None, help="run only scenarios whose name contains this")
    ap.add_argument(
        "--eval-every", type=float, default=EVAL_EVERY_S, help="seconds between analyses (default: the collector's)"
    )
    ap.add_argument("--misses", action="store_true", help="list scenarios with a miss or a false suspect")
    ap.add_argument("--verbose", "-v", action="store_true")
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
    scenarios = with_send_period(build_suite(args.split), args.flush_s)

    def progress(res: ScenarioResult) -> None:
        if args.verbose:
            lat = [None if x is None else round(x, 1) for x in res.latency]
            slow = "-" if res.true_slowdown is None else f"{res.true_slowdown:.2f}"
            line = f"  {res.name:<40} cpu={res.cpu_s:5.1f}s coll/s={res.coll_per_s:6.0f} lat={lat}"
            print(f"{line} false={len(res.false_suspects)} slowdown={slow} step={res.step_s:.2f}s", file=sys.stderr)

    rep = evaluate_suite(
        args.split,
        scenarios=scenarios,
        config=config,
        workers=args.workers,
        only=args.only,
        eval_every=args.eval_every,
        progress=progress,
    )
    print(rep.table())
    if args.misses:
        print(rep.misses())
    return 0


if __name__ == "__main__":
    sys.exit(main())
