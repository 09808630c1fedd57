"""torchft's own process groups (its Manager's all-reduce between replica groups) are recorded.

A real lighthouse, two replica groups each under its own torchrun, instrumented through
``RANKWATCH`` only. torchft builds its group outside torch.distributed's registries and
rebuilds it on every quorum; rankwatch must still see it, under one job for both replica groups.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support import BIN, Service, clean_env, free_port, kill_tree

pytest.importorskip("torchft")  # installed by the test command; only absent in a bare dev venv
pytestmark = pytest.mark.torchrun

STEPS = 12


def test_torchft_manager_allreduce_between_replica_groups(service: Service, tmp_path: Path) -> None:
    lh_port = free_port()
    lighthouse = subprocess.Popen(
        [
            str(BIN / "torchft_lighthouse"),
            "--min_replicas",
            "2",
            "--quorum_tick_ms",
            "50",
            "--join_timeout_ms",
            "1000",
            "--bind",
            f"127.0.0.1:{lh_port}",
        ],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    out = tmp_path / "out"
    out.mkdir()
    procs = []
    try:
        for replica in (0, 1):
            env = clean_env(
                RANKWATCH=service.url,
                RANKWATCH_FLUSH_S="0.25",
                REPLICA_GROUP_ID=str(replica),
                TORCHFT_LIGHTHOUSE=f"http://127.0.0.1:{lh_port}",
            )
            cmd = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes=1",
                "--nproc-per-node=1",
                "--master-addr=127.0.0.1",
                f"--master-port={free_port()}",
                str(Path(__file__).parent / "scripts" / "torchft_train.py"),
                str(STEPS),
                str(out),
            ]
            log = open(tmp_path / f"replica{replica}.log", "wb")
            procs.append((subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT), log))
        for p, log in procs:
            rc = p.wait(timeout=240)
            log.close()
            assert rc == 0, (tmp_path / f"replica{procs.index((p, log))}.log").read_text()[-4000:]
    finally:
        for p, _ in procs:
            kill_tree(p)
        lighthouse.kill()
        lighthouse.wait()

    results = [json.loads((out / f"replica{r}.json").read_text()) for r in (0, 1)]
    assert results[0]["step"] == results[1]["step"] == STEPS
    assert results[0]["checksum"] == pytest.approx(results[1]["checksum"], abs=1e-5)  # replicas in sync

    job_id = f"torchft-127.0.0.1:{lh_port}"  # one job across both torchruns, named after the lighthouse
    job = service.wait_job(job_id, lambda j: len(j["ranks"]) == 2 and all(r["state"] == "goodbye" for r in j["ranks"]))
    ranks = {r["rank"]: r for r in job["ranks"]}
    assert set(ranks) == {0, 1}
    for r in (0, 1):
        assert ranks[r]["meta"]["torchft_replica_id"].startswith(f"train_{r}:"), ranks[r]["meta"]
    ft_groups = [g for g in job["groups"] if g["id"].startswith("torchft:")]
    assert ft_groups, job["groups"]
    for g in ft_groups:
        assert g["ranks"] == [0, 1]
    ops = {r: service.ops(job_id, rank=r) for r in (0, 1)}
    allreduces = [o for o in ops[0] if o["kind"] == "all_reduce" and o["group"].startswith("torchft:")]
    assert len(allreduces) >= STEPS  # one gradient all-reduce per committed step at least
    for g in ft_groups:
        mine = [[o for o in ops[r] if o["group"] == g["id"]] for r in (0, 1)]
        coll = [sorted((o["seq"], o["kind"]) for o in m if o["kind"] not in ("send", "recv")) for m in mine]
        assert coll[0] == coll[1] and coll[0], g["id"]
        for a, b in ((0, 1), (1, 0)):  # healing traffic: a's k-th send to b is b's k-th recv from a
            sent = sorted(o["seq"] for o in mine[a] if o["kind"] == "send" and o["peer"] == b)
            got = sorted(o["seq"] for o in mine[b] if o["kind"] == "recv" and o["peer"] == a)
            assert sent == got, (g["id"], a, b)
