"""Elastic DDP training that checkpoints with rankwatch's DCP helper and resumes from the latest.

usage: torchrun --nnodes=1:2 ... elastic_train.py TOTAL_STEPS CKPT_DIR OUTDIR [STEP_SECONDS [CKPT_EVERY]]

Rank 0 appends ``step wall_time restart world`` to OUTDIR/progress.txt after every step, so a test
can tell when the job stepped last before a fault and first after it came back. Before a
collector-commanded exit every rank saves a checkpoint of the last step it finished
(``on_restart``) and writes OUTDIR/on_restart_rank<r>.json saying which step, from which pid.

Deterministic: step k's data depends only on k, so a run that loses a node and resumes from a
checkpoint on fewer ranks ends near the same loss as an uninterrupted run with the same seed.
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist
from _gloo import let_go

from rankwatch.hooks import checkpoint, on_restart

CKPT_EVERY = 10


def main() -> None:
    total, ckpt_dir, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    step_s = float(sys.argv[4]) if len(sys.argv) > 4 else 0.03
    every = int(sys.argv[5]) if len(sys.argv) > 5 else CKPT_EVERY
    # how many times this job came back: torchrun's restarts plus Slurm's requeues
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) + int(os.environ.get("SLURM_RESTART_COUNT", "0"))
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    state = {"model": model.state_dict(), "optim": opt.state_dict(), "step": torch.zeros((), dtype=torch.int64)}
    start = checkpoint.load_latest(state, ckpt_dir)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optim"])
    done = {"step": start}

    @on_restart
    def save_before_exit() -> None:
        # runs at the same op of the world group on every rank, so DCP's collective save is safe here
        checkpoint.save(_state(model, opt, done["step"]), ckpt_dir, done["step"])
        with open(os.path.join(out, f"on_restart_rank{rank}.json"), "w") as f:
            json.dump({"step": done["step"], "pid": os.getpid(), "restart": restart}, f)

    w_true = torch.linspace(-1, 1, 16)
    loss = torch.zeros(())
    progress = open(os.path.join(out, "progress.txt"), "a", buffering=1) if rank == 0 else None
    for step in range(start + 1, total + 1):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(64, 16, generator=g)
        y = (x @ w_true).unsqueeze(1)
        xs = x.chunk(world)[rank]  # each rank its share of the step's global batch
        ys = y.chunk(world)[rank]
        time.sleep(step_s)
        loss = torch.nn.functional.mse_loss(ddp(xs), ys)
        opt.zero_grad()
        loss.backward()
        opt.step()
        done["step"] = step
        if progress is not None:
            progress.write(f"{step} {time.time():.3f} {restart} {world}\n")
        if step % every == 0:
            checkpoint.save(_state(model, opt, step), ckpt_dir, step)
    final = loss.detach().clone()
    dist.all_reduce(final)
    let_go(final)
    if rank == 0:
        with open(os.path.join(out, "final.json"), "w") as f:
            json.dump(
                {"step": total, "loss": float(final) / world, "world": world, "resumed_from": start,
                 "restart": restart},
                f,
            )  # fmt: skip
    dist.destroy_process_group()


def _state(model: torch.nn.Module, opt: torch.optim.Optimizer, step: int) -> dict:
    return {"model": model.state_dict(), "optim": opt.state_dict(), "step": torch.tensor(step)}


if __name__ == "__main__":
    main()
