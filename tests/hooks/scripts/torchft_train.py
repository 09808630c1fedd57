"""A torchft training script (one replica group per torchrun), run by the tests.

It knows nothing of rankwatch; the tests enable it through ``RANKWATCH`` alone. Each step's
gradient all-reduce between replica groups goes through torchft's Manager and its own process
group, which torchft rebuilds on every quorum change.

usage: torchrun --nproc-per-node 1 torchft_train.py STEPS OUTDIR   (env: REPLICA_GROUP_ID, TORCHFT_LIGHTHOUSE)
"""

import json
import os
import sys
from datetime import timedelta

import torch
from torchft import DistributedDataParallel, Manager, Optimizer, ProcessGroupGloo
from torchft.checkpointing.pg_transport import PGTransport


def main() -> None:
    steps, out = int(sys.argv[1]), sys.argv[2]
    replica = int(os.environ["REPLICA_GROUP_ID"])
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    inner = torch.optim.SGD(model.parameters(), lr=0.05)

    def state_dict() -> dict:
        return {"model": model.state_dict(), "optim": inner.state_dict()}

    def load_state_dict(sd: dict) -> None:
        model.load_state_dict(sd["model"])
        inner.load_state_dict(sd["optim"])

    timeout = timedelta(seconds=20)
    pg = ProcessGroupGloo(timeout=timeout)
    manager = Manager(
        pg=pg,
        min_replica_size=2,
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        replica_id=f"train_{replica}",
        hostname="127.0.0.1",
        timeout=timeout,
        quorum_timeout=timeout,
        connect_timeout=timeout,
        checkpoint_transport=PGTransport(pg, timeout=timeout, device=torch.device("cpu")),
    )
    ddp = DistributedDataParallel(manager, model)
    opt = Optimizer(manager, inner)
    gen = torch.Generator().manual_seed(100 + replica)
    while manager.current_step() < steps:
        opt.zero_grad()
        loss = ddp(torch.randn(16, 8, generator=gen)).pow(2).mean()
        loss.backward()
        opt.step()
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    with open(os.path.join(out, f"replica{replica}.json"), "w") as f:
        json.dump({"step": manager.current_step(), "checksum": float(params.sum())}, f)
    manager.shutdown(wait=False)


if __name__ == "__main__":
    main()
