"""Restart from checkpoint through the control channel: ranks save on ``on_restart``, torchrun brings them back.

One torchrun agent (``--standalone``, 2 ranks, ``--max-restarts 1``) runs ``elastic_train.py``,
which checkpoints only every 200 steps but registers an ``on_restart`` save. An admin asks for
``restart`` with the ``torchrun`` actuator: every rank is told over the control channel to exit
with code 3 just before the same op of the world group, runs its save there, and exits; torchrun
restarts the workers (new pids, new incarnations) and they resume from that checkpoint. The steps
lost are those between the last step finished before the exit and the step resumed from — a few
at most, where without the save they would be everything since the last periodic checkpoint.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from remediation_support import actions, post, progress, record, wait_for, when
from support import SCRIPTS, clean_env, kill_tree, start_service

pytestmark = pytest.mark.torchrun

TOTAL = 500
STEP_S = "0.04"
CKPT_EVERY = 200
RANKS = 2
TOKENS = {"RANKWATCH_INGEST_TOKENS": "ingest-t0k", "RANKWATCH_ADMIN_TOKENS": "admin-t0k"}


def _finished(action: dict[str, Any]) -> dict[str, Any] | None:
    return action if action["finished_at"] else None


def test_restart_saves_on_every_rank_and_resumes_from_that_checkpoint(tmp_path: Path) -> None:
    svc = start_service(tmp_path, env=clean_env(RANKWATCH_ACTUATOR="torchrun", **TOKENS))
    svc.headers = {"Authorization": f"Bearer {TOKENS['RANKWATCH_ADMIN_TOKENS']}"}
    job = "restart"
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    out.mkdir()
    env = clean_env(
        RANKWATCH=svc.url.replace("http://", f"http://{TOKENS['RANKWATCH_INGEST_TOKENS']}@"),
        RANKWATCH_JOB=job,
        RANKWATCH_FLUSH_S="0.5",
        RANKWATCH_CONTROL="1",  # the job allows the collector to tell its ranks to exit
        # torch's shared rendezvous TCPStore outlives a restart with its keys (see the elastic test)
        TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",
    )
    cmd = [
        sys.executable, "-m", "torch.distributed.run",
        "--standalone", f"--nproc-per-node={RANKS}", "--max-restarts=1", "--monitor-interval=0.2",
        str(SCRIPTS / "elastic_train.py"), str(TOTAL), str(ckpt), str(out), STEP_S, str(CKPT_EVERY),
    ]  # fmt: skip
    log_path = tmp_path / "torchrun.log"
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=open(log_path, "wb"), stderr=subprocess.STDOUT)
    try:
        # past the first periodic checkpoint, so the on_restart save has something to beat
        wait_for("step 220", lambda: any(r[0] >= CKPT_EVERY + 20 for r in progress(out / "progress.txt")), 90)
        before = {r["rank"]: r for r in svc.get(f"/jobs/{job}")["ranks"]}
        assert len(before) == RANKS and all(r["restart"] == 0 for r in before.values()), before
        asked = post(svc, f"/jobs/{job}/actions", {"type": "restart", "reason": "test: restart from checkpoint"})
        rc = proc.wait(timeout=120)
        action = wait_for("the restart's end", lambda: _finished(svc.get(f"/actions/{asked['id']}")), 60)
        after = {r["rank"]: r for r in svc.get(f"/jobs/{job}")["ranks"]}
        commands = svc.get(f"/jobs/{job}/commands")
        log = actions(svc, job)
    finally:
        kill_tree(proc)
        svc.stop()
    output = log_path.read_text(errors="replace")
    assert rc == 0, output[-3000:]

    # the action log: asked by the admin token, run by the torchrun actuator, succeeded once the
    # restarted ranks were stepping again
    assert [(a["type"], a["state"]) for a in log] == [("restart", "succeeded")], log
    assert action["actor"] == "admin token", action
    assert [s["step"] for s in action["steps"]] == ["approved", "running", "restart", "succeeded"], action
    step = action["steps"][2]
    print("restart step:", step["output"])
    assert step["actor"] == "actuator torchrun" and all(s["at"] and s["actor"] for s in action["steps"])
    assert f"told ranks {list(range(RANKS))} to exit with code 3" in step["output"], step
    assert "stepping again" in step["output"], step
    assert {c["rank"] for c in commands} == set(range(RANKS)) and {c["result"] for c in commands} == {"done"}

    # every rank ran the on_restart save at the same step, after the last periodic checkpoint
    saves = [json.loads((out / f"on_restart_rank{r}.json").read_text()) for r in range(RANKS)]
    saved = saves[0]["step"]
    assert all(s["step"] == saved and s["restart"] == 0 for s in saves), saves
    last_periodic = saved // CKPT_EVERY * CKPT_EVERY
    assert saved > last_periodic >= CKPT_EVERY, saves
    assert (ckpt / f"step-{saved}" / ".done").exists(), sorted(p.name for p in ckpt.iterdir())
    assert {s["pid"] for s in saves} == {r["pid"] for r in before.values()}

    # torchrun brought the workers back: new processes, new incarnations, resumed from that save
    assert all(after[r]["restart"] == 1 and after[r]["state"] == "goodbye" for r in range(RANKS)), after
    assert all(after[r]["pid"] != before[r]["pid"] for r in range(RANKS)), (before, after)
    assert all(after[r]["incarnation"] != before[r]["incarnation"] for r in range(RANKS)), (before, after)
    final = json.loads((out / "final.json").read_text())
    assert final["step"] == TOTAL and final["restart"] == 1 and final["resumed_from"] == saved, final

    rows = progress(out / "progress.txt")
    first = [r for r in rows if r[2] == 0]
    again = [r for r in rows if r[2] == 1]
    last_before = first[-1][0]
    lost = last_before - final["resumed_from"]
    lost_without_save = last_before - last_periodic  # what resuming from the periodic checkpoint costs
    assert again[0][0] == saved + 1 and again[-1][0] == TOTAL, (again[:1], again[-1:])
    assert 0 <= lost <= 2, (last_before, final)
    took = again[0][1] - when(action["created_at"])
    record(
        "restart (torchrun, on_restart save)",
        suspect_to_stepping_s=round(took, 1),  # here: from the admin's request to the first step after
        steps_lost=lost,
        steps_lost_without_save=lost_without_save,
        saved_at=saved,
        last_periodic=last_periodic,
    )
    assert took <= 60, took
