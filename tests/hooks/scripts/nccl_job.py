"""An NCCL job for GPU machines: all_reduce and DDP on CUDA tensors. usage: nccl_job.py STEPS OUTDIR"""

import json
import os
import sys

import torch
import torch.distributed as dist


def main() -> None:
    steps, out = int(sys.argv[1]), sys.argv[2]
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    model = torch.nn.Linear(1024, 1024).cuda()
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local])
    x = torch.randn(256, 1024, device="cuda")
    for _ in range(steps):
        ddp(x).sum().backward()
        t = torch.ones(1 << 20, device="cuda")
        dist.all_reduce(t)
    torch.cuda.synchronize()
    # what the collector asks a hung rank for (dump_flight_recorder): NCCL's own Flight Recorder
    from rankwatch.hooks import installed
    from rankwatch.hooks.shipper import _dump_flight_recorder

    rec = installed()
    inflight = sum(len(st.inflight) for st in rec.groups) if rec is not None else -1
    raw = _dump_flight_recorder()
    fr = json.loads(raw) if raw else {}
    entries = fr.get("entries") or []
    names = sorted({str(e.get("profiling_name")) for e in entries})
    with open(os.path.join(out, f"done_rank{rank}.json"), "w") as f:
        json.dump(
            {
                "rank": rank,
                "value": float(t[0]),
                "fr_error": fr.get("error"),
                "fr_entries": len(entries),
                "fr_names": names,
                "inflight_at_end": inflight,
            },
            f,
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
