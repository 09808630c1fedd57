"""Host overhead the hooks add per collective, instrumented vs not, interleaved in one process.

A one-rank gloo group: its all_reduce is short and stable, so microseconds can be resolved
(multi-rank loopback timings drift by tens of percent). Two groups live in the same process, one
instrumented and one built with the instrumentation suspended; blocks of calls alternate between
them and the paired differences are reported. The shipper thread runs, draining the ring and
"sending" to a transport that answers 200 at once, so its cost is inside the figures.

    python bench/hooks_overhead.py [--rounds 40] [--calls 2000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument(
        "--no-pin",
        action="store_true",
        help="do not pin the process to one CPU (pinning keeps gloo's worker thread and the caller on one core; "
        "unpinned, the per-call time flips between ~8 and ~28 us from run to run with where threads land)",
    )
    args = ap.parse_args()
    if not args.no_pin:
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[-1]})
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29000 + os.getpid() % 1000))
    os.environ.pop("RANKWATCH", None)

    import torch
    import torch.distributed as dist

    from rankwatch.hooks import install
    from rankwatch.hooks import process_group as pgmod

    sent = {"batches": 0, "bytes": 0}

    def transport(body: bytes, headers: dict[str, str], timeout: float) -> tuple[int, bytes]:
        sent["batches"] += 1
        sent["bytes"] += len(body)
        return 200, b'{"accepted": 0}'

    rec = install("http://127.0.0.1:9", transport=transport)
    assert rec is not None
    dist.init_process_group("gloo", rank=0, world_size=1)
    instrumented = dist.group.WORLD
    assert type(instrumented) is pgmod.InstrumentedProcessGroup
    pgmod.unpatch()
    plain = dist.new_group([0])
    pgmod.patch(rec)
    assert type(plain) is not pgmod.InstrumentedProcessGroup
    passthrough = dist.new_group([0])  # instrumented, but with recording switched off: the dispatch cost
    passthrough._rw = None

    t = torch.ones(16)

    def block(group: object, n: int) -> tuple[float, float]:
        """(wall, training-thread CPU) microseconds per call."""
        w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        for _ in range(n):
            dist.all_reduce(t, group=group)
        return (time.perf_counter_ns() - w0) / n / 1000.0, (time.thread_time_ns() - c0) / n / 1000.0

    for g in (plain, instrumented, passthrough):
        block(g, 2000)
    keys = ("base_w", "inst_w", "diff_w", "base_c", "inst_c", "diff_c", "pass_c")
    rows: dict[str, list[float]] = {k: [] for k in keys}
    for i in range(args.rounds):
        order = [plain, instrumented, passthrough]
        order = order[i % 3 :] + order[: i % 3]
        res = {id(g): block(g, args.calls) for g in order}
        (bw, bc), (iw, ic), (_pw, pc) = res[id(plain)], res[id(instrumented)], res[id(passthrough)]
        for key, v in (("base_w", bw), ("inst_w", iw), ("diff_w", iw - bw), ("base_c", bc), ("inst_c", ic)):
            rows[key].append(v)
        rows["diff_c"].append(ic - bc)
        rows["pass_c"].append(pc - bc)
    time.sleep(rec.config.flush_s * 2)  # let the shipper drain
    print(f"one-rank gloo all_reduce, {args.rounds} interleaved rounds x {args.calls} calls")
    for label, suffix in (("wall clock", "w"), ("training-thread CPU", "c")):
        d = rows[f"diff_{suffix}"]
        q = statistics.quantiles(d, n=4)
        print(
            f"  {label:20s} uninstrumented {statistics.median(rows[f'base_{suffix}']):6.2f} us, "
            f"instrumented {statistics.median(rows[f'inst_{suffix}']):6.2f} us, "
            f"added median {statistics.median(d):5.2f} us (IQR {q[0]:.2f} .. {q[2]:.2f})"
        )
    print(
        f"  of which dispatch through the wrapper group (recording off): {statistics.median(rows['pass_c']):.2f} us CPU"
    )
    ops = rec.shipper.shipped_records if rec.shipper else 0
    print(f"  shipped {ops:,} records in {sent['batches']} batches, {sent['bytes'] / max(ops, 1):.1f} wire bytes/op")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
