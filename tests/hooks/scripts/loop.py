"""A steady training-like loop for the tests: a short compute pause and an all-reduce per step.

usage: torchrun ... loop.py STEPS STEP_SECONDS OUTDIR [SLOW_RANK EXTRA_SECONDS]

With SLOW_RANK, that rank's "compute" takes EXTRA_SECONDS longer each step: a training loop that
is slow on one rank, with no help from rankwatch.
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist
from _gloo import let_go


def main() -> None:
    steps, step_s, out = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    slow_rank = int(sys.argv[4]) if len(sys.argv) > 4 else -1
    extra = float(sys.argv[5]) if len(sys.argv) > 5 else 0.0
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if rank == slow_rank:
        step_s += extra
    t = torch.ones(16)
    for _ in range(steps):
        time.sleep(step_s)  # the "compute" of a step
        dist.all_reduce(t)
        t /= dist.get_world_size()
    let_go(t)
    with open(os.path.join(out, f"done_rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "value": t.tolist()[0]}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
