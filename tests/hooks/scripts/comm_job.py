"""A 2 x 2 data x tensor parallel layout for link tests: every rank sits in a row, a column and the world.

usage: comm_job.py STEPS MIB OUTDIR    (4 ranks)
Each step all-reduces MIB MiB on the rank's row group, its column group, then the world.
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist
from _gloo import let_go


def main() -> None:
    steps, mib, out = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    rows = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    cols = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    row, col = rows[rank // 2], cols[rank % 2]
    t = torch.ones(int(mib * (1 << 20) / 4))
    small = torch.ones(4)
    start = time.monotonic()
    for _ in range(steps):
        time.sleep(0.02)
        dist.all_reduce(t, group=row)
        dist.all_reduce(t, group=col)
        dist.all_reduce(small)
        t.fill_(1.0)
    let_go(t, small)
    with open(os.path.join(out, f"done_rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "seconds": time.monotonic() - start}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
