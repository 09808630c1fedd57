"""The small DDP job the step-time benchmark runs: a few linear layers over gloo, per-step timing.

usage: torchrun --standalone --nproc-per-node 2 ddp_job.py STEPS OUT.json
"""

import json
import resource
import statistics
import sys
import time

import torch
import torch.distributed as dist


def main() -> None:
    steps, out = int(sys.argv[1]), sys.argv[2]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(4)])
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.25)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x = torch.randn(64, 256)
    times = []
    for step in range(steps):
        t0 = time.perf_counter()
        loss = ddp(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 10 == 0:
            dist.all_reduce(loss.detach().clone())
        times.append(time.perf_counter() - t0)
    steady = times[steps // 5 :]
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if rank == 0:
        with open(out, "w") as f:
            json.dump(
                {
                    "step_ms": statistics.median(steady) * 1000,
                    "mean_ms": statistics.mean(steady) * 1000,
                    "rss_mb": rss_mb,
                },
                f,
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
