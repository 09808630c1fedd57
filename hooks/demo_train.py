"""The demo's training script: a small DDP model over gloo, run by torchrun.

It is an ordinary training script: nothing in it knows about rankwatch. ``rankwatch demo``
runs it with ``RANKWATCH`` set (and ``RANKWATCH_INJECT`` making one rank slow), which is all it
takes to watch a job. Run it yourself with::

    RANKWATCH=1 torchrun --standalone --nproc-per-node 4 -m rankwatch.hooks.demo_train --steps 100
"""

from __future__ import annotations

import argparse
import os
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--step-ms", type=float, default=40.0, help="compute time per step (simulated)")
    args = parser.parse_args()

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1000 + rank)
    start = time.monotonic()
    for step in range(1, args.steps + 1):
        x = torch.randn(32, 64, generator=gen)
        y = torch.randn(32, 8, generator=gen)
        time.sleep(args.step_ms / 1000.0)  # stands for the forward/backward compute of a real model
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 10 == 0:
            dist.all_reduce(loss.detach().clone())  # an extra collective, like a logged metric
            if rank == 0:
                print(f"step {step}/{args.steps} loss {loss.item():.4f} ({time.monotonic() - start:.1f}s)", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        print(f"done in {time.monotonic() - start:.1f}s (pid {os.getpid()})", flush=True)


if __name__ == "__main__":
    main()
