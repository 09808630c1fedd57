"""A loop that checkpoints when rankwatch tells it to restart: the one place it imports rankwatch.

usage: ckpt_loop.py STEPS STEP_SECONDS OUTDIR
``on_restart`` runs on the training thread at the same op on every rank, so the save may itself
be collective (here a barrier, then each rank writes its step).
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist
from _gloo import let_go

import rankwatch.hooks


def main() -> None:
    steps, step_s, out = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    state = {"step": 0}

    @rankwatch.hooks.on_restart
    def save() -> None:
        dist.barrier()  # collective: fine, every rank is at the same point
        with open(os.path.join(out, f"ckpt_rank{rank}.json"), "w") as f:
            json.dump(state, f)

    t = torch.ones(8)
    for step in range(1, steps + 1):
        time.sleep(step_s)
        dist.all_reduce(t)
        state["step"] = step
    let_go(t)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
