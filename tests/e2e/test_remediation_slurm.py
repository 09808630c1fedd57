"""Remediation on a real Slurm: a slow node is drained with a reason, the job is requeued without it
and resumes from its checkpoint.

A real Slurm with three fake nodes (``scripts/slurm.sh``; needs root, as the test command runs).
The job is ``sbatch --nodes=2`` on n1 and n2 running torchrun on each node through ``srun``, one
rank per node; n2 is made slow. With policy ``auto`` and the ``slurm`` actuator rankwatch drains n2
(``sinfo -R`` shows the reason: kind, rank, slowdown), requeues the job excluding n2, and the job
resumes from its last DCP checkpoint on n1 and n3. ``POST /nodes/n2/release`` resumes the node.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from remediation_support import actions, progress, record, recovery_figures, wait_for, when
from support import SCRIPTS, clean_env, start_service

pytestmark = pytest.mark.torchrun

ROOT = Path(__file__).resolve().parents[2]
TOTAL = 500
CKPT_EVERY = 25


def _sh(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


def _node_state(node: str) -> str:
    return _sh("sinfo", "-h", "-n", node, "-o", "%T").strip()


@pytest.fixture
def slurm() -> None:
    if os.geteuid() != 0:
        pytest.fail("a real Slurm needs root (the test command runs as root)")
    subprocess.run(["bash", str(ROOT / "scripts" / "slurm.sh"), "start"], check=True, capture_output=True)


def test_slow_node_is_drained_and_the_job_requeued_without_it(slurm: None, tmp_path: Path) -> None:
    svc = start_service(tmp_path, env=clean_env(RANKWATCH_POLICY="auto", RANKWATCH_ACTUATOR="slurm"))
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    out.mkdir()
    train = f"{SCRIPTS / 'elastic_train.py'} {TOTAL} {ckpt} {out} 0.02 {CKPT_EVERY}"
    env = clean_env(
        RANKWATCH=svc.url,
        RANKWATCH_FLUSH_S="0.5",
        RANKWATCH_INJECT="slow:node=n2,delay=0.06,after=6",
        RANKWATCH_TEST_PYTHON=sys.executable,
        TRAIN_ARGS=train,
    )
    log = tmp_path / "slurm.out"
    argv = ["sbatch", "--parsable", "-w", "n1,n2", "-o", str(log), "-D", str(tmp_path), str(SCRIPTS / "slurm_job.sh")]
    job = subprocess.run(argv, capture_output=True, text=True, check=True, env=env).stdout.strip()
    try:
        svc.wait_job(job, lambda j: len(j["ranks"]) == 2, timeout=90)
        suspect = wait_for(
            "a suspect on n2", lambda: [s for s in svc.get("/suspects", job_id=job) if s["nodes"] == ["n2"]], 90
        )[0]
        wait_for("n2 drained", lambda: "drain" in _node_state("n2"), 30)
        reasons = _sh("sinfo", "-R", "-h", "-o", "%n|%E")
        line = next(x for x in reasons.splitlines() if x.startswith("n2|"))
        assert line.startswith("n2|rankwatch: noncomm_slow ") and "rank 1" in line and "x slower" in line, line
        # requeued without n2, it runs to the end from its checkpoint
        wait_for("the requeued job's end", lambda: (out / "final.json").exists(), 240, 1.0)
        final = json.loads((out / "final.json").read_text())
        shown = _sh("scontrol", "show", "job", job)
        log_all = actions(svc, job)
        sus = svc.get(f"/suspects/{suspect['id']}")
        r = httpx.post(f"{svc.url}/nodes/n2/release", json={}, timeout=30)
        assert r.status_code == 200 and r.json()["state"] == "succeeded", r.text
        wait_for("n2 back in service", lambda: "drain" not in _node_state("n2"), 30)
    finally:
        subprocess.run(["scancel", job], capture_output=True)
        subprocess.run(["scontrol", "update", "NodeName=n2", "State=RESUME"], capture_output=True)
        svc.stop()

    assert final["step"] == TOTAL and final["restart"] >= 1, final  # SLURM_RESTART_COUNT: requeued
    assert 0 < final["resumed_from"] < TOTAL and final["resumed_from"] % CKPT_EVERY == 0, final
    assert "ExcNodeList=n2" in shown and "n2" not in shown.split("NodeList=")[-1].split()[0], shown
    assert [(a["type"], a["state"]) for a in log_all[:2]] == [("isolate", "succeeded"), ("restart", "succeeded")]
    assert all(a["state"] == "refused" for a in log_all[2:]), log_all[2:]
    iso, restart = log_all[0], log_all[1]
    assert "scontrol update NodeName=n2 State=DRAIN" in iso["steps"][2]["output"], iso
    assert f"scontrol requeue {job}" in restart["steps"][2]["output"], restart
    assert "ExcNodeList=n2" in restart["steps"][2]["output"], restart
    assert sus["status"] == "isolated"

    rows = progress(out / "progress.txt")
    took, lost, last = recovery_figures(rows, when(suspect["detected_at"]), final["resumed_from"])
    record(
        "restart (slurm requeue)",
        suspect_to_stepping_s=round(took, 1),
        steps_lost=lost,
        last_step_before=last,
        resumed_from=final["resumed_from"],
    )
    assert took <= 60, took
