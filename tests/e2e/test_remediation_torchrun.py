"""Remediation of a real elastic torchrun job: a slow node is isolated and the job comes back without it.

Two torchrun agents stand in for two nodes (nodeA, nodeB; 2 ranks each) with a c10d rendezvous
on loopback whose store lives in nodeA's agent. nodeB is made slow; with policy ``auto`` and the
``torchrun`` actuator rankwatch stops nodeB's agent, nodeA's agent re-rendezvous alone (``--nnodes
1:2``), and the script resumes from its last DCP checkpoint on 2 ranks. The run must end at its
planned final step with a loss within 10% of an uninterrupted run, and the action log must show
every step. Isolating nodeA, which hosts the rendezvous store, is refused, logged and paged.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from remediation_support import actions, post, progress, record, recovery_figures, wait_for, when
from support import SCRIPTS, clean_env, free_port, kill_tree, start_service, torchrun

pytestmark = pytest.mark.torchrun

TOTAL = 600
STEP_S = "0.02"
CKPT_EVERY = "25"


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_slow_node_is_isolated_and_the_job_resumes_without_it(tmp_path: Path) -> None:
    svc = start_service(tmp_path, env=clean_env(RANKWATCH_POLICY="auto", RANKWATCH_ACTUATOR="torchrun"))
    job = "elastic"
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    out.mkdir()
    port = free_port()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for node in ("nodeA", "nodeB"):
            env = clean_env(
                RANKWATCH=svc.url,
                RANKWATCH_JOB=job,
                RANKWATCH_NODE=node,
                RANKWATCH_FLUSH_S="0.5",
                RANKWATCH_INJECT="slow:node=nodeB,delay=0.06,after=6",
                # torch's shared rendezvous TCPStore outlives a restart with its keys: the restarted
                # workers read their peers' old addresses and gloo fails to connect, attempt after attempt
                TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",
            )
            cmd = [
                sys.executable, "-m", "torch.distributed.run",
                "--nnodes=1:2", "--nproc-per-node=2", "--max-restarts=3", "--monitor-interval=0.2",
                "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={job}",
                # nodeA's agent hosts the rendezvous store; both join the first round (start-up is slow here)
                f"--rdzv-conf=is_host={str(node == 'nodeA').lower()},last_call_timeout=4,join_timeout=90",
                str(SCRIPTS / "elastic_train.py"), str(TOTAL), str(ckpt), str(out), STEP_S, CKPT_EVERY,
            ]  # fmt: skip
            log = open(tmp_path / f"{node}.log", "wb")
            procs.append(subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT))
        wait_for("nodeA's rendezvous store", lambda: _listening(port), 30, 0.1)
        svc.wait_job(job, lambda j: len(j["ranks"]) == 4, timeout=90)

        # nodeA hosts the store: isolating it would end the job, not shrink it
        refused = post(svc, f"/jobs/{job}/actions", {"type": "isolate", "node": "nodeA", "reason": "test"})
        got = wait_for("refusal", lambda: svc.get(f"/actions/{refused['id']}")["state"] == "refused", 30)
        a = svc.get(f"/actions/{refused['id']}")
        assert got and "nodeA hosts the job's rendezvous store" in a["error"], a
        assert procs[0].poll() is None

        suspect = wait_for(
            "a suspect on nodeB",
            lambda: [s for s in svc.get("/suspects", job_id=job) if "nodeB" in (s["nodes"] or [])],
            60,
        )[0]
        assert suspect["kind"] == "noncomm_slow", suspect
        rc_a = procs[0].wait(timeout=180)
        rc_b = procs[1].wait(timeout=30)
        # every action finished, not just the newest: a refusal (cool-down) of a later suspect is
        # finished at once, while the restart before it may still be running
        log = wait_for(
            "the restart's end",
            lambda: (a := actions(svc, job)) and len(a) >= 3 and all(x["finished_at"] for x in a) and a,
            30,
        )
        sus = svc.get(f"/suspects/{suspect['id']}")
    finally:
        for p in procs:
            kill_tree(p)
        svc.stop()
    log_a = (tmp_path / "nodeA.log").read_text(errors="replace")
    assert rc_a == 0, log_a[-3000:]
    assert rc_b != 0  # its agent was stopped
    final = json.loads((out / "final.json").read_text())
    assert final["step"] == TOTAL and final["world"] == 2 and final["restart"] >= 1, final
    assert 0 < final["resumed_from"] < TOTAL and final["resumed_from"] % int(CKPT_EVERY) == 0, final

    # the same run, uninterrupted, with the same seed (the global batch does not depend on the world size)
    base_dir = tmp_path / "base"
    (base_dir / "out").mkdir(parents=True)
    args = (str(TOTAL), str(base_dir / "ckpt"), str(base_dir / "out"), "0", "1000")
    base = torchrun(base_dir, SCRIPTS / "elastic_train.py", *args)
    assert base.returncode == 0, base.output[-3000:]
    ref = json.loads((base_dir / "out" / "final.json").read_text())
    assert abs(final["loss"] - ref["loss"]) <= 0.1 * ref["loss"], (final, ref)

    # the action log: the refusal, then the isolation and the restart, every step with time and actor
    assert [(x["type"], x["state"]) for x in log[:3]] == [
        ("isolate", "refused"),
        ("isolate", "succeeded"),
        ("restart", "succeeded"),
    ], log
    # what the restart itself looks like (nodeA's old ranks dying) may open suspects too: the
    # cool-down refuses to act on them, so one fault costs one isolation and one restart
    assert all(x["state"] == "refused" and x["error"].startswith("cool-down") for x in log[3:]), log[3:]
    iso, restart = log[1], log[2]
    assert iso["node"] == "nodeB" and iso["suspect_id"] == suspect["id"] and iso["actor"] == "rankwatch (policy)"
    assert [s["step"] for s in iso["steps"]] == ["approved", "running", "isolate", "succeeded"], iso
    assert "SIGTERM torchrun agent pid" in iso["steps"][2]["output"]
    assert [s["step"] for s in restart["steps"]] == ["approved", "running", "restart", "succeeded"], restart
    assert "the launcher restarted the job without nodeB" in restart["steps"][2]["output"], restart
    assert all(s["at"] and s["actor"] for s in iso["steps"] + restart["steps"])
    assert sus["status"] == "isolated", sus

    rows = progress(out / "progress.txt")
    took, lost, last = recovery_figures(rows, when(suspect["detected_at"]), final["resumed_from"])
    record(
        "restart (torchrun elastic)",
        suspect_to_stepping_s=round(took, 1),
        steps_lost=lost,
        last_step_before=last,
        resumed_from=final["resumed_from"],
        final_loss=final["loss"],
        reference_loss=ref["loss"],
    )
    assert took <= 60, took
