"""Exit while rankwatch's shipper is busy: many groups, an op never waited on, no destroy.

usage: torchrun ... busy_exit.py OUTDIR   (OUTDIR unused: the test reads the exit status)

With a flush interval of a millisecond the shipper thread is nearly always inside a torch call
(group sizes, work queries) when the interpreter finalizes.
"""

import sys

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    groups = [dist.new_group([0, 1]) for _ in range(16)]
    for _ in range(20):
        for g in groups:
            dist.all_reduce(torch.ones(4), group=g)
    dist.all_reduce(torch.ones(4), async_op=True)  # never waited on: stays in flight until exit
    sys.stdout.write("trained\n")


if __name__ == "__main__":
    main()
