"""Live swap with torchft: a slow replica group is killed through its lighthouse and replaced while the
others keep training.

Three replica groups, each under its own torchrun, on a real lighthouse; replica group 1 runs on
node ``ft1``, made slow. With policy ``auto``, recovery ``swap`` and the ``torchft`` actuator,
rankwatch names rank 1, kills its replica group with ``POST /replica/<id>/kill``; torchrun starts a
replacement (``standby_worker.sh`` puts it on ``ft1-standby``, without the fault), which joins the
quorum and heals from a live peer. The survivors keep their processes (same pid, never restarted),
never go back a step, and the replacement's parameters match theirs step for step.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from remediation_support import actions, record, wait_for, when
from support import BIN, SCRIPTS, clean_env, free_port, kill_tree, start_service

pytest.importorskip("torchft")
pytestmark = pytest.mark.torchrun

REPLICAS = (0, 1, 2)
SLOW = 1


def _rows(path: Path) -> list[tuple[int, float, int, int, float]]:
    """(step, wall time, pid, restart, parameter checksum) per committed step."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        p = line.split()
        if len(p) == 5:
            out.append((int(p[0]), float(p[1]), int(p[2]), int(p[3]), float(p[4])))
    return out


def test_slow_replica_group_is_swapped_live(tmp_path: Path) -> None:
    svc = start_service(tmp_path)
    lh_port = free_port()
    lighthouse = subprocess.Popen(
        [
            str(BIN / "torchft_lighthouse"), "--min_replicas", "1", "--quorum_tick_ms", "50",
            "--join_timeout_ms", "1000", "--heartbeat_timeout_ms", "500", "--bind", f"127.0.0.1:{lh_port}",
        ],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    out = tmp_path / "out"
    out.mkdir()
    job = f"torchft-127.0.0.1:{lh_port}"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for i in REPLICAS:
            env = clean_env(
                RANKWATCH=svc.url,
                RANKWATCH_FLUSH_S="0.25",
                RANKWATCH_NODE=f"ft{i}",
                RANKWATCH_INJECT=f"slow:node=ft{SLOW},delay=0.15,after=6",
                RANKWATCH_TEST_PYTHON=sys.executable,
                REPLICA_GROUP_ID=str(i),
                TORCHFT_LIGHTHOUSE=f"http://127.0.0.1:{lh_port}",
            )
            cmd = [
                sys.executable, "-m", "torch.distributed.run", "--no-python", "--nnodes=1", "--nproc-per-node=1",
                "--max-restarts=3", "--monitor-interval=0.1", "--master-addr=127.0.0.1", f"--master-port={free_port()}",
                str(SCRIPTS / "standby_worker.sh"), str(SCRIPTS / "torchft_swap_train.py"), "100000", str(out), "0.05",
            ]  # fmt: skip
            log = open(tmp_path / f"replica{i}.log", "wb")
            procs.append(subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT))
        svc.wait_job(job, lambda j: len(j["ranks"]) == len(REPLICAS), timeout=90)
        r = httpx.put(
            f"{svc.url}/jobs/{job}/policy", json={"mode": "auto", "recovery": "swap", "actuator": "torchft"}, timeout=30
        )
        assert r.status_code == 200, r.text

        suspect = wait_for(
            "a suspect on ft1",
            lambda: [s for s in svc.get("/suspects", job_id=job) if s["nodes"] == [f"ft{SLOW}"]],
            60,
        )[0]
        # the swap of *this* suspect: the replaced process may die noisily on its way out (a
        # rank_dead suspect whose own swap the cool-down refuses, finished before this one is)
        swap = wait_for(
            "the swap",
            lambda: [
                a
                for a in actions(svc, job)
                if a["type"] == "swap" and a["suspect_id"] == suspect["id"] and a["finished_at"]
            ],
            60,
        )[0]
        assert swap["state"] == "succeeded", swap
        killed_at = when(swap["finished_at"])
        # the replacement heals and trains on: 30 of its own committed steps
        wait_for(
            "the replacement's steps",
            lambda: len([x for x in _rows(out / f"replica{SLOW}.txt") if x[3] > 0]) >= 30,
            90,
        )
        log_all = actions(svc, job)
        sus = svc.get(f"/suspects/{suspect['id']}")
    finally:
        for p in procs:
            kill_tree(p)
        lighthouse.kill()
        lighthouse.wait()
        svc.stop()

    assert suspect["ranks"] == [SLOW] and suspect["kind"] == "noncomm_slow", suspect
    assert sus["status"] == "isolated", sus
    assert [a["type"] for a in log_all if a["state"] != "refused"] == ["swap"], log_all
    assert [s["step"] for s in swap["steps"]] == ["approved", "running", "swap", "succeeded"], swap
    out_step = swap["steps"][2]
    assert f"/replica/train_{SLOW}:" in out_step["output"] and "exited" in out_step["output"], out_step

    rows = {i: _rows(out / f"replica{i}.txt") for i in REPLICAS}
    survivors = [i for i in REPLICAS if i != SLOW]
    for i in survivors:
        assert len({x[2] for x in rows[i]}) == 1 and {x[3] for x in rows[i]} == {0}, f"replica {i} restarted"
        steps = [x[0] for x in rows[i]]
        assert steps == sorted(steps) and len(set(steps)) == len(steps), f"replica {i} went back a step"
    old = [x for x in rows[SLOW] if x[3] == 0]
    new = [x for x in rows[SLOW] if x[3] > 0]
    assert len({x[2] for x in old}) == 1 and len({x[2] for x in new}) == 1 and old[0][2] != new[0][2]
    assert new[0][0] > 1, "the replacement started from scratch instead of healing from a peer"
    peers = {x[0]: x[4] for x in rows[survivors[0]]}
    matched = [x for x in new if x[0] in peers]
    assert len(matched) >= 20, (len(matched), new[:3])
    for step, _, _, _, checksum in matched:
        assert checksum == pytest.approx(peers[step], abs=1e-4), (step, checksum, peers[step])

    # the survivors never stopped: their longest pause around the kill; the replacement's first step
    around = [x[1] for x in rows[survivors[0]] if killed_at - 10 <= x[1] <= killed_at + 10]
    pause = max((b - a for a, b in itertools.pairwise(around)), default=0.0)
    detected = when(suspect["detected_at"])
    record(
        "swap (torchft live)",
        suspect_to_stepping_s=round(new[0][1] - detected, 1),  # the replacement, healed, stepping with its peers
        suspect_to_kill_s=round(killed_at - detected, 1),
        survivors_longest_pause_s=round(pause, 2),
        steps_lost=0,  # survivors never went back a step (asserted above); the replacement healed to theirs
        replacement_healed_to_step=new[0][0],
    )
    assert new[0][1] - detected <= 20 and pause <= 5, (new[0][1] - detected, pause)
