"""A short DDP job on gloo that ends right after a synchronous all_reduce; run by bench/gloo_exit_race.py.

usage: torchrun --nproc-per-node 2 exit_race.py STEPS wait|nowait

With ``wait`` it waits, before exiting, until gloo's worker has finished with the last op
(``let_go`` in tests/hooks/scripts/_gloo.py); with ``nowait`` it exits at once, as most
training scripts do.
"""

import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "hooks", "scripts"))
from _gloo import let_go


def main() -> None:
    steps, mode = int(sys.argv[1]), sys.argv[2]
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    loss = torch.zeros(())
    for _ in range(steps):
        x = torch.randn(32, 16)
        loss = ddp(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    final = loss.detach().clone()
    dist.all_reduce(final)
    if mode == "wait":
        let_go(final)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
