"""Host overhead the hooks add per collective, instrumented vs not, interleaved in one process.

A one-rank gloo group: its all_reduce is short and stable, so microseconds can be resolved
(multi-rank loopback timings drift by tens of percent). Two groups live in the same process, one
instrumented and one built with the instrumentation suspended; blocks of calls alternate between
them and the paired differences are reported. The shipper thread runs, draining the ring and
"sending" to a transport that answers 200 at once, so its cost is inside the figures.

With ``--backend nccl`` (a machine with a CUDA GPU) the same is done on a one-rank NCCL group and
a CUDA tensor: a call only enqueues the kernel, so the wall-clock figure of a block includes a
``torch.cuda.synchronize()`` at its end, and the instrumented group's ops are timed from CUDA
events by the poller thread (``hooks/cuda.py``), whose cost is then inside the figures too.

    python bench/hooks_overhead.py [--rounds 40] [--calls 2000] [--backend gloo|nccl]
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
    ap.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
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
    from rankwatch.wire import WireError, decode_batch

    sent = {"batches": 0, "bytes": 0, "ops": 0, "gpu_timed": 0}
    kernel_ns: list[int] = []

    def transport(body: bytes, headers: dict[str, str], timeout: float) -> tuple[int, bytes]:
        sent["batches"] += 1
        sent["bytes"] += len(body)
        try:
            recs = decode_batch(body).records
        except WireError:
            return 200, b'{"accepted": 0}'  # not a raw batch (block mode): counted in bytes only
        started = recs.t_start > recs.t_enter  # a GPU start read from the events, after the enqueue
        sent["ops"] += len(recs.t_start)
        sent["gpu_timed"] += int(started.sum())
        kernel_ns.extend((recs.t_end - recs.t_start)[started][:64].tolist())
        return 200, b'{"accepted": 0}'

    rec = install("http://127.0.0.1:9", transport=transport)
    assert rec is not None
    nccl = args.backend == "nccl"
    if nccl and not torch.cuda.is_available():
        ap.error("--backend nccl needs a CUDA GPU, and this PyTorch sees none")
    if nccl:
        torch.cuda.set_device(0)
    dist.init_process_group(args.backend, rank=0, world_size=1)
    instrumented = dist.group.WORLD
    assert type(instrumented) is pgmod.InstrumentedProcessGroup
    pgmod.unpatch()
    plain = dist.new_group([0], backend=args.backend)
    pgmod.patch(rec)
    assert type(plain) is not pgmod.InstrumentedProcessGroup
    # instrumented, but with recording switched off: the dispatch cost
    passthrough = dist.new_group([0], backend=args.backend)
    passthrough._rw = None

    t = torch.ones(16, device="cuda" if nccl else "cpu")
    sync = torch.cuda.synchronize if nccl else (lambda: None)

    def block(group: object, n: int) -> tuple[float, float]:
        """(wall, training-thread CPU) microseconds per call."""
        sync()
        w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        for _ in range(n):
            dist.all_reduce(t, group=group)
        sync()
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
    where = f" on {torch.cuda.get_device_name(0)}, torch {torch.__version__}" if nccl else ""
    print(f"one-rank {args.backend} all_reduce{where}, {args.rounds} interleaved rounds x {args.calls} calls")
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
    if nccl:
        med = statistics.median(kernel_ns) / 1000.0 if kernel_ns else float("nan")
        print(
            f"  of {sent['ops']:,} decoded records, {sent['gpu_timed']:,} carry a GPU start read from CUDA events "
            f"(kernel time median {med:.1f} us)"
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
