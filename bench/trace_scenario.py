"""What the detector sees, analysis by analysis, in one scenario of the evaluation suite.

For reading why a fault was missed or named late, or why a healthy rank or node was named: the
traces in docs/detector.md were each read this way, with a throw-away script every time. It runs
the scenario through the real detector (``run_scenario``) and reads it after every analysis
through the read-only ``watch`` hook; nothing it prints feeds back into the detector.

python bench/trace_scenario.py heldout-straggler_ends-000 --from 18 --to 26 --rank 48
python bench/trace_scenario.py heldout-straggler_node-004 --from 20 --to 60 --stages
python bench/trace_scenario.py unseen-slow_rnic-001 --from 44 --to 48.5 --roots --flush-s 0.5

Views, any together, one block per analysis between ``--from`` and ``--to`` (server seconds):
- ``--roots``: the ranks found at the root of what is late (before the holds and the node tests),
  and the channels held slow by the transfer analysis;
- ``--rank R``: each of R's slots: its group (``c<size>`` for a collective group, ``p2p`` for a
  pipeline's sends and receives), its excess lateness over its threshold (s per s), the evidence
  it has gathered (CUSUM, named at ``cusum_h``), ``hot`` when it is, and the median excess of its
  group-mates;
- ``--stages``: per node, by name (the detector numbers nodes in the order their ranks first
  reported), the pipeline-stage test's two signs against their lines (its share of time inside
  ops against the other nodes' and against its pipeline neighbours', its lateness at its
  cross-node sends and receives against its usual, in units of their thresholds) and the
  seconds they have held (named at ``stage_hold_s``).
It ends with the scenario's result: each fault's latency and the false suspects. ``--set`` and
``--flush-s`` change a detector setting or the hooks' send period, as in ``bench/eval_detector.py``.
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

import numpy as np

from rankwatch.detector.evaluate import run_scenario, trial_settings, with_send_period
from rankwatch.detector.job import JobDetector
from rankwatch.sim.scenario import Scenario
from rankwatch.sim.suite import SPLITS, build_suite


def find(name: str) -> Scenario:
    """The suite's scenario of this name (its split is the name's first part; not ``sealed``).

    Raises:
        ValueError: no split or no scenario of that name, or a scenario of ``sealed``.
    """
    split = name.split("-", 1)[0]
    if split == "sealed":
        # sealed is run only for its table; its runs are not read (rankwatch/sim/suite.py)
        raise ValueError(f"{name!r}: sealed's scenarios are not traced (only its table is printed)")
    if split not in SPLITS:
        raise ValueError(f"{name!r}: a scenario is named <split>-<class>-<nnn>, the split one of {', '.join(SPLITS)}")
    for sc in build_suite(split):
        if sc.name == name:
            return sc
    raise ValueError(f"{name!r}: no such scenario in split {split!r} (bench/eval_detector.py -v lists them)")


def _roots(det: JobDetector) -> str:
    return f"  roots {sorted(det.roots)}  slow channels {sorted(det._ch_slow)}"


def _rank(det: JobDetector, rank: int) -> list[str]:
    late, topo = det.late, det.topo
    n = min(topo.n_slots, late.ex_late.shape[0])
    out = []
    for s in np.flatnonzero(topo.slot_rank[:n] == rank).tolist():
        ch = int(topo.slot_ch[s])
        p2p = topo.ch_parent[ch] >= 0
        off, size = int(topo.ch_off[ch]), int(topo.ch_size[ch])
        mates = np.delete(late.ex_late[off : off + size], s - off) if not p2p else np.zeros(0)
        mate = float(np.nanmedian(mates)) if np.isfinite(mates).any() else float("nan")
        out.append(
            f"  rank {rank} {'p2p' if p2p else f'c{size}':<5} excess {late.ex_late[s]:+.3f} / threshold "
            f"{late.thr[s]:.3f}  cusum {late.cusum[s]:4.1f}{'  hot' if late.hot[s] else ''}"
            + ("" if p2p else f"  mates' median excess {mate:+.3f}")
        )
    return out or [f"  rank {rank}: no slot yet"]


def _stages(det: JobDetector) -> list[str]:
    late, topo = det.late, det.topo
    n_nodes = len(topo.node_names)
    if late.stage_line.shape[0] < n_nodes or late.stage_in.shape[0] < topo.world:
        return ["  stages: no pipeline-stage test yet"]
    sl, _, per = late.late_at_stages(topo)  # the test's own reading
    if not sl.shape[0]:
        return ["  stages: no cross-node point-to-point channel"]
    out = []
    for i, name in enumerate(topo.node_names):
        line_in, line_late = late.stage_line[i]
        out.append(
            f"  {name}: share {late.stage_z[i]:+.3f}, against its neighbours {late.stage_zn[i]:+.3f} "
            f"(line {-line_in:+.3f})  late {per[i] - late.stage_late[i]:+.2f} "
            f"(line {line_late:.2f})  held {late.stage_run[i]:.1f} s"
        )
    return out


def trace(
    sc: Scenario,
    t0: float,
    t1: float,
    *,
    roots: bool = False,
    rank: int | None = None,
    stages: bool = False,
    config_overrides: list[str] | None = None,
    flush_s: float | None = None,
    out: TextIO = sys.stdout,
) -> None:
    """Run ``sc`` and print the chosen views at every analysis from ``t0`` to ``t1``, then its result."""
    config, said = trial_settings(config_overrides or [], flush_s)
    if said:
        print(said, file=out)
    (sc,) = with_send_period([sc], flush_s)
    for f in sc.faults:
        where = [f"rank {r}" for r in f.ranks] + [f"node {x}" for x in f.nodes]
        print(f"fault {f.kind} at {f.where} ({', '.join(where)}): x{f.factor:g} from {f.onset:.1f} s", file=out)

    def watch(now: float, det: JobDetector) -> None:
        if not t0 <= now <= t1:
            return
        lines = [f"{now:6.1f} s"]
        if roots:
            lines.append(_roots(det))
        if rank is not None:
            lines.extend(_rank(det, rank))
        if stages:
            lines.extend(_stages(det))
        print("\n".join(lines), file=out)

    res = run_scenario(sc, config, watch=watch)
    lat = ", ".join("missed" if x is None else f"{x:.1f} s" for x in res.latency) or "no fault"
    false = ", ".join(f"{r.key} at {r.first:.1f} s" for r in res.false_suspects) or "none"
    print(f"result: latency {lat}; false suspects {false}", file=out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scenario", help="a scenario of the suite, e.g. heldout-straggler_node-004")
    ap.add_argument("--from", dest="t0", type=float, default=0.0, help="first analysis to print (server s)")
    ap.add_argument("--to", dest="t1", type=float, default=float("inf"), help="last analysis to print")
    ap.add_argument("--roots", action="store_true", help="the roots and the slow channels")
    ap.add_argument("--rank", type=int, default=None, help="this rank's slots")
    ap.add_argument("--stages", action="store_true", help="the pipeline-stage test, per node")
    ap.add_argument(
        "--set", action="append", default=[], metavar="NAME=VALUE", help="a detector setting (DetectorConfig)"
    )
    ap.add_argument("--flush-s", type=float, default=None, help="the simulated hooks' send period (default: 1 s)")
    args = ap.parse_args(argv)
    if not (args.roots or args.rank is not None or args.stages):
        ap.error("choose at least one view: --roots, --rank R or --stages")
    try:
        sc = find(args.scenario)
        trace(
            sc,
            args.t0,
            args.t1,
            roots=args.roots,
            rank=args.rank,
            stages=args.stages,
            config_overrides=args.set,
            flush_s=args.flush_s,
        )
    except ValueError as e:
        ap.error(str(e))
    return 0


if __name__ == "__main__":
    sys.exit(main())
