"""CPU time the detector needs per second of simulated training, at 1k, 10k and 100k ranks.

Ranks summarise their ops into sequence-aligned blocks (``rankwatch.sim.stream``), aggregators
ship one ``BlockBatch`` per flush period for ``--agent-ranks`` ranks, and one ``JobDetector``
takes them all (``observe_blocks``) and is evaluated once per simulated second. Only the
detector's CPU time is counted, not the simulator's. The job runs at ``--rate`` collectives per
rank per second (default 100) for ``--seconds`` simulated seconds after ``--warmup`` seconds that
are not counted (groups being registered, baselines being learned).

    python bench/detector_scale.py --ranks 1024 8192 98304
    python bench/detector_scale.py --ranks 98304 --pp 1     (tensor x data parallel, no pipeline)
"""

from __future__ import annotations

import argparse
import sys
import time

from rankwatch.detector import JobDetector
from rankwatch.sim import PROFILES, Layout, Scenario, Workload
from rankwatch.sim.stream import stream_blocks


def layout_for(ranks: int, pp: int | None = None) -> Layout:
    """Data x tensor x pipeline for about ``ranks`` ranks: tp=8 per node, 8 pipeline stages (2 under
    512 ranks), or ``pp`` of them (1: tensor x data parallel, where a node is one tensor-parallel
    group and no test leaves a pipeline stage's nodes to the stage test)."""
    if pp is None:
        pp = 8 if ranks >= 512 else 2
    dp = max(1, ranks // (8 * pp))
    return Layout(tp=8, pp=pp, dp=dp)


def measure(
    ranks: int, rate: float, seconds: float, warmup: float, agent_ranks: int, block_s: float, pp: int | None = None
) -> dict[str, float]:
    lay = layout_for(ranks, pp)
    sc = Scenario(
        "scale",
        layout=lay,
        workload=Workload.for_rate(rate, lay),
        profile=PROFILES["quiet"],
        duration=warmup + seconds,
        seed=5,
    )
    det = JobDetector()
    t_next = 1.0
    cpu = {"observe": 0.0, "evaluate": 0.0}
    rows = batches = 0
    sim_cpu = 0.0
    it = stream_blocks(sc, agent_ranks=agent_ranks, block_s=block_s)
    findings = 0
    while True:
        c0 = time.process_time()
        d = next(it, None)
        sim_cpu += time.process_time() - c0
        if d is None:
            break
        while d.received_at > t_next:
            c0 = time.process_time()
            got = det.evaluate(t_next)
            if t_next > warmup:
                cpu["evaluate"] += time.process_time() - c0
                findings += len(got)
            t_next += 1.0
        c0 = time.process_time()
        det.observe_blocks(d.batch, d.received_at)
        if d.received_at > warmup:
            cpu["observe"] += time.process_time() - c0
            rows += d.batch.blocks.shape[0]
            batches += 1
    return {
        "ranks": lay.world,
        "rows_per_s": rows / seconds,
        "batches_per_s": batches / seconds,
        "observe_s_per_s": cpu["observe"] / seconds,
        "evaluate_s_per_s": cpu["evaluate"] / seconds,
        "total_s_per_s": (cpu["observe"] + cpu["evaluate"]) / seconds,
        "sim_s_per_s": sim_cpu / (warmup + seconds),
        "findings": findings,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, nargs="+", default=[1024, 8192, 98304])
    ap.add_argument("--rate", type=float, default=100.0)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=12.0)
    ap.add_argument("--agent-ranks", type=int, default=1024)
    ap.add_argument("--block-s", type=float, default=0.64, help="about how long a block spans (0.64: 64 ops at 100/s)")
    ap.add_argument(
        "--pp", type=int, default=None, help="pipeline stages (default 8, 2 under 512 ranks; 1: tensor x data parallel)"
    )
    args = ap.parse_args(argv)
    if args.pp is not None and args.pp < 1:
        ap.error("--pp must be 1 or more")
    stages = "8 pipeline stages (2 under 512 ranks)" if args.pp is None else f"{args.pp} pipeline stage(s)"
    print(f"rate={args.rate:g} collectives/rank/s, blocks of ~{args.block_s}s, {args.agent_ranks} ranks per batch")
    print(f"layout: tp=8 per node, {stages}")
    print("ranks     rows/s  batches/s  observe  evaluate  total CPU s per s of training  (suspects on a healthy job)")
    for n in args.ranks:
        r = measure(n, args.rate, args.seconds, args.warmup, args.agent_ranks, args.block_s, args.pp)
        print(
            f"{r['ranks']:>6} {r['rows_per_s']:>10.0f} {r['batches_per_s']:>10.1f} {r['observe_s_per_s']:>8.3f} "
            f"{r['evaluate_s_per_s']:>9.3f} {r['total_s_per_s']:>9.3f}   ({r['findings']})",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
