"""Every path a collective takes is recorded: real torchrun jobs, real service, FR as the reference.

The training script never imports rankwatch: these jobs are instrumented through the
``RANKWATCH`` variable and the installed ``.pth`` start-up file alone.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support import SCRIPTS, Service, clean_env

pytestmark = pytest.mark.torchrun

P2P = ("send", "recv")
# gloo's Flight Recorder names some ops after the gloo algorithm that runs them
FR_NAME = {
    "all_reduce": "all_reduce",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "all_gather": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "gather": "gather",
    "scatter": "scatter",
    "barrier": "barrier",
    "all_to_all": "all_to_all",
    "all_to_all_single": "all_to_all",
}


def _run_path(service: Service, run_torchrun: Any, path: str, nproc: int) -> tuple[str, dict[str, Any], Path]:
    job = f"paths-{path}"
    env = clean_env(RANKWATCH=service.url, RANKWATCH_JOB=job, RANKWATCH_FLUSH_S="0.25")
    run = run_torchrun(SCRIPTS / "paths.py", path, "out", nproc=nproc, env=env)
    assert run.returncode == 0, run.output[-4000:]
    info = service.wait_job(
        job, lambda j: len(j["ranks"]) == nproc and all(r["state"] == "goodbye" for r in j["ranks"])
    )
    return job, info, run.outdir


def _check_against_flight_recorder(
    service: Service, job: str, outdir: Path, nproc: int
) -> dict[int, list[dict[str, Any]]]:
    """Per rank and group: the collector holds exactly FR's collectives, with FR's sequence numbers."""
    all_ops: dict[int, list[dict[str, Any]]] = {}
    for rank in range(nproc):
        fr = json.loads((outdir / f"fr_rank{rank}.json").read_text())
        fr_coll = [e for e in fr["entries"] if not e["is_p2p"]]
        ops = service.ops(job, rank=rank)
        all_ops[rank] = ops
        coll = [o for o in ops if o["kind"] not in P2P]
        assert Counter(o["group"] for o in coll) == Counter(e["process_group"][0] for e in fr_coll), f"rank {rank}"
        for group in {o["group"] for o in coll}:
            ours = sorted((o["seq"], o["kind"]) for o in coll if o["group"] == group)
            theirs = sorted(
                (e["collective_seq_id"], e["profiling_name"].split(":")[-1])
                for e in fr_coll
                if e["process_group"][0] == group
            )
            assert [s for s, _ in ours] == [s for s, _ in theirs], f"rank {rank} group {group}"
            for (seq, kind), (_, fr_kind) in zip(ours, theirs, strict=True):
                if kind in FR_NAME and kind != "all_gather_into_tensor":
                    assert FR_NAME[kind] == fr_kind, f"rank {rank} group {group} seq {seq}: {kind} vs FR {fr_kind}"
        for o in ops:
            assert o["t_enter_ns"] <= o["t_start_ns"] <= o["t_end_ns"]
    return all_ops


def _check_alignment(info: dict[str, Any], ops: dict[int, list[dict[str, Any]]]) -> None:
    """Members of a group report the same collectives under the same sequence numbers."""
    for g in info["groups"]:
        per_rank = {
            r: sorted((o["seq"], o["kind"]) for o in ops[r] if o["group"] == g["id"] and o["kind"] not in P2P)
            for r in g["ranks"]
        }
        first = next(iter(per_rank.values()))
        assert first, f"group {g['id']} recorded nothing"
        for r, seqs in per_rank.items():
            assert seqs == first, f"group {g['id']}: rank {r} differs"


def _kinds(ops: dict[int, list[dict[str, Any]]], rank: int) -> Counter[str]:
    return Counter(o["kind"] for o in ops[rank])


def _results(outdir: Path, nproc: int) -> list[list[float]]:
    return [json.loads((outdir / f"result_rank{r}.json").read_text())["result"] for r in range(nproc)]


def test_direct_torch_distributed_calls(service: Service, run_torchrun: Any) -> None:
    job, info, out = _run_path(service, run_torchrun, "direct", 2)
    ops = _check_against_flight_recorder(service, job, out, 2)
    _check_alignment(info, ops)
    for rank in (0, 1):
        kinds = _kinds(ops, rank)
        for k in FR_NAME:
            assert kinds[k] >= 1, f"{k} missing on rank {rank}: {kinds}"
        assert kinds["reduce_scatter_tensor"] == 1
        assert kinds["send"] == 3 and kinds["recv"] == 3  # send/recv, isend/irecv, batch_isend_irecv
    # p2p: rank 0's k-th send to rank 1 is rank 1's k-th recv from rank 0
    sends = sorted(o["seq"] for o in ops[0] if o["kind"] == "send" and o["peer"] == 1)
    recvs = sorted(o["seq"] for o in ops[1] if o["kind"] == "recv" and o["peer"] == 0)
    assert sends == recvs == [1, 2, 3]
    assert _results(out, 2) == [[3.0, 3.0], [3.0, 3.0]]


def test_ddp_gradient_allreduce_and_startup_broadcast(service: Service, run_torchrun: Any) -> None:
    job, info, out = _run_path(service, run_torchrun, "ddp", 2)
    ops = _check_against_flight_recorder(service, job, out, 2)
    _check_alignment(info, ops)
    kinds = _kinds(ops, 0)
    assert kinds["broadcast"] >= 1  # DDP's start-up sync of module states (C++ caller)
    # 5 steps, each at least one gradient bucket all-reduced by DDP's C++ reducer, plus the result
    assert kinds["all_reduce"] >= 5 + 1, kinds


def test_fsdp2_all_gather_and_reduce_scatter(service: Service, run_torchrun: Any) -> None:
    job, info, out = _run_path(service, run_torchrun, "fsdp", 2)
    ops = _check_against_flight_recorder(service, job, out, 2)
    _check_alignment(info, ops)
    kinds = _kinds(ops, 1)
    assert kinds["all_gather_into_tensor"] >= 3 * 3, kinds  # 3 steps x 3 sharded layers, forward alone
    assert kinds["reduce_scatter_tensor"] >= 3 * 3, kinds


def test_functional_collectives(service: Service, run_torchrun: Any) -> None:
    job, info, out = _run_path(service, run_torchrun, "funcol", 2)
    ops = _check_against_flight_recorder(service, job, out, 2)
    _check_alignment(info, ops)
    kinds = _kinds(ops, 0)
    assert kinds["all_reduce"] == 3 + 1  # three funcol all_reduce, plus the script's result
    assert kinds["all_gather_into_tensor"] == 3
    assert kinds["reduce_scatter_tensor"] == 3


def test_subgroups_keep_their_own_sequences(service: Service, run_torchrun: Any) -> None:
    job, info, out = _run_path(service, run_torchrun, "subgroups", 4)
    ops = _check_against_flight_recorder(service, job, out, 4)
    _check_alignment(info, ops)
    groups = {tuple(g["ranks"]): g for g in info["groups"]}
    assert set(groups) == {(0, 1, 2, 3), (0, 2), (1, 3)}
    assert groups[(0, 2)]["last_seq"] == 4 + 1
    assert groups[(1, 3)]["last_seq"] == 5 + 1
    assert groups[(0, 1, 2, 3)]["last_seq"] == 2
    assert groups[(0, 2)]["id"] != groups[(1, 3)]["id"]
