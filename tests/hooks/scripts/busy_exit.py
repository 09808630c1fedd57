"""Exit while rankwatch's shipper is busy: many groups, an op never waited on, no destroy.

usage: torchrun ... busy_exit.py OUTDIR   (OUTDIR unused: the test reads the exit status)

With a flush interval of a millisecond the shipper thread is nearly always inside a torch call
(group sizes, work queries) when the interpreter finalizes.
"""

import sys
import time

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    groups = [dist.new_group([0, 1]) for _ in range(16)]
    # at least 20 rounds and a second: on a loaded machine 20 rounds alone took so little of the
    # shipper's time that it sent 17 batches, under the test's check that it really was busy;
    # the ranks agree when to stop (the lower of their flags), so both run the same collectives
    start, rounds = time.monotonic(), 0
    while True:
        for g in groups:
            dist.all_reduce(torch.ones(4), group=g)
        rounds += 1
        go = torch.tensor([float(rounds < 20 or time.monotonic() - start < 1.0)])
        dist.all_reduce(go, op=dist.ReduceOp.MIN)
        if go.item() == 0.0:
            break
    dist.all_reduce(torch.ones(4), async_op=True)  # never waited on: stays in flight until exit
    sys.stdout.write("trained\n")


if __name__ == "__main__":
    main()
