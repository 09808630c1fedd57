"""A training script exercising one collective path; run by the tests under torchrun.

It knows nothing of rankwatch: the tests turn rankwatch on through the environment only. At the
end every rank writes PyTorch's own Flight Recorder dump and a fingerprint of its results, which
the tests compare with what the collector recorded.

usage: torchrun ... paths.py PATH OUTDIR     PATH: direct | ddp | fsdp | funcol | subgroups | mixed
"""

import json
import os
import sys

import torch
import torch.distributed as dist
from _gloo import let_go


def direct(rank: int, ws: int) -> None:
    t = torch.arange(4, dtype=torch.float32) + rank
    dist.all_reduce(t)
    dist.broadcast(t, 0)
    dist.reduce(t, 0)
    outs = [torch.empty(4) for _ in range(ws)]
    dist.all_gather(outs, t)
    big = torch.empty(4 * ws)
    dist.all_gather_into_tensor(big, t)
    dist.reduce_scatter_tensor(torch.empty(4), torch.ones(4 * ws))
    dist.all_to_all_single(torch.empty(ws), torch.arange(ws, dtype=torch.float32))
    dist.all_to_all([torch.empty(1) for _ in range(ws)], [torch.ones(1) * rank for _ in range(ws)])
    dist.gather(t, [torch.empty(4) for _ in range(ws)] if rank == 0 else None, dst=0)
    dist.scatter(torch.empty(4), [torch.ones(4) * i for i in range(ws)] if rank == 0 else None, src=0)
    dist.barrier()
    # reduce_scatter (list form) is not implemented by gloo; it is exercised with NCCL only.
    nxt, prv = (rank + 1) % ws, (rank - 1) % ws
    if rank % 2 == 0:
        dist.send(t, nxt)
        dist.recv(torch.empty(4), prv)
    else:
        dist.recv(torch.empty(4), prv)
        dist.send(t, nxt)
    reqs = [dist.isend(t, nxt), dist.irecv(torch.empty(4), prv)]
    for r in reqs:
        r.wait()
    ops = [dist.P2POp(dist.isend, t, nxt), dist.P2POp(dist.irecv, torch.empty(4), prv)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    w = dist.all_reduce(t, async_op=True)  # async: timed to completion through wait()
    w.wait()


def ddp(rank: int, ws: int) -> float:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    m = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.001)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    for _ in range(5):
        loss = m(torch.randn(8, 16, generator=g)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return float(sum(p.detach().double().sum() for p in model.parameters()))


def fsdp(rank: int, ws: int) -> float:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 16), torch.nn.Linear(16, 4))
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    for _ in range(3):
        loss = model(torch.randn(8, 16, generator=g)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return float(loss.detach())


def funcol(rank: int, ws: int) -> None:
    import torch.distributed._functional_collectives as fc

    group = dist.group.WORLD
    for _ in range(3):
        x = fc.all_reduce(torch.ones(4) * rank, "sum", group)
        x = fc.wait_tensor(x)
        y = fc.all_gather_tensor(torch.ones(2) * rank, 0, group)
        y = fc.wait_tensor(y)
        z = fc.reduce_scatter_tensor(torch.ones(2 * ws), "sum", 0, group)
        z = fc.wait_tensor(z)


def subgroups(rank: int, ws: int) -> None:
    evens = dist.new_group([r for r in range(ws) if r % 2 == 0])
    odds = dist.new_group([r for r in range(ws) if r % 2 == 1])
    mine = evens if rank % 2 == 0 else odds
    for i in range(4 + rank % 2):  # the two subgroups issue different numbers of ops
        t = torch.ones(3) * i
        dist.all_reduce(t, group=mine)
    dist.broadcast(torch.ones(2), group_src=0, group=mine)
    dist.all_reduce(torch.ones(1))  # and the world group keeps its own sequence


PATHS = {"direct": direct, "ddp": ddp, "fsdp": fsdp, "funcol": funcol, "subgroups": subgroups}


def main() -> None:
    path, out = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank, ws = dist.get_rank(), dist.get_world_size()
    values = {}
    for name, fn in PATHS.items():
        if path in (name, "mixed"):
            values[name] = fn(rank, ws)
    result = torch.ones(2) * (rank + 1)
    dist.all_reduce(result)
    let_go(result)
    with open(os.path.join(out, f"result_rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "result": result.tolist(), "values": values}, f)
    fr = torch._C._distributed_c10d._dump_fr_trace_json(True, False)  # the last op is above
    with open(os.path.join(out, f"fr_rank{rank}.json"), "wb") as f:
        f.write(fr)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
