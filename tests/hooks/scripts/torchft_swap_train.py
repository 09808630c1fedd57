"""torchft training for the live-swap test: replica groups that survive a peer's kill and heal a replacement.

usage: torchrun --nproc-per-node 1 torchft_swap_train.py STEPS OUTDIR [STEP_SECONDS]
       (env: REPLICA_GROUP_ID, TORCHFT_LIGHTHOUSE)

After every committed step the replica appends ``step wall_time pid restart checksum`` to
OUTDIR/replica<i>.txt, so a test can tell that survivors kept their process and never went back,
and that a replacement healed to its peers' parameters. torchft 0.2.0's DDP comm hook asserts
when a peer dies in the middle of a gradient all-reduce, crashing the survivors too; the subclass
below hands DDP an already-completed future instead, and the Manager then discards that step.
"""

import os
import sys
import time
from datetime import timedelta

import torch
from torchft import DistributedDataParallel, Manager, Optimizer, ProcessGroupGloo
from torchft.checkpointing.pg_transport import PGTransport


class SafeDDP(DistributedDataParallel):
    @staticmethod
    def _comm_hook(state, bucket):  # type: ignore[no-untyped-def]
        work = state.allreduce(bucket.buffer())
        work.wait()
        fut = work.get_future()
        inner = getattr(fut, "_fut", None)
        if inner is not None:
            return inner
        done: torch.futures.Future = torch.futures.Future()
        done.set_result(bucket.buffer())  # the step fails should_commit() and is discarded
        return done


def main() -> None:
    steps, out = int(sys.argv[1]), sys.argv[2]
    step_s = float(sys.argv[3]) if len(sys.argv) > 3 else 0.05
    replica = int(os.environ["REPLICA_GROUP_ID"])
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    inner = torch.optim.SGD(model.parameters(), lr=0.05)

    def state_dict() -> dict:
        return {"model": model.state_dict(), "optim": inner.state_dict()}

    def load_state_dict(sd: dict) -> None:
        model.load_state_dict(sd["model"])
        inner.load_state_dict(sd["optim"])

    timeout = timedelta(seconds=5)
    pg = ProcessGroupGloo(timeout=timeout)
    manager = Manager(
        pg=pg,
        min_replica_size=1,
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        replica_id=f"train_{replica}",
        hostname="127.0.0.1",
        timeout=timeout,
        quorum_timeout=timedelta(seconds=30),
        connect_timeout=timeout,
        checkpoint_transport=PGTransport(pg, timeout=timeout, device=torch.device("cpu")),
    )
    ddp = SafeDDP(manager, model)
    opt = Optimizer(manager, inner)
    log = open(os.path.join(out, f"replica{replica}.txt"), "a", buffering=1)
    while manager.current_step() < steps:
        before = manager.current_step()
        gen = torch.Generator().manual_seed(1000 * before + replica)
        opt.zero_grad()
        loss = ddp(torch.randn(16, 8, generator=gen)).pow(2).mean()
        loss.backward()
        time.sleep(step_s)
        opt.step()
        if manager.current_step() > before:  # committed (a healed replica jumps to its peers' step)
            params = torch.cat([p.detach().flatten() for p in model.parameters()])
            log.write(f"{manager.current_step()} {time.time():.3f} {os.getpid()} {restart} {float(params.sum()):.6f}\n")
    manager.shutdown(wait=False)


if __name__ == "__main__":
    main()
