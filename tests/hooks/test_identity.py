"""A job launched without torchrun or a scheduler still gets one id, made once and shared."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support import SCRIPTS, Service, clean_env, free_port

pytestmark = pytest.mark.torchrun


def test_job_id_shared_through_the_store_without_a_launcher(service: Service, tmp_path: Path) -> None:
    port = free_port()
    (tmp_path / "out").mkdir()
    procs = []
    for rank in (0, 1):
        env = clean_env(
            RANKWATCH=service.url,
            RANKWATCH_FLUSH_S="0.25",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            RANK=str(rank),
            WORLD_SIZE="2",
            LOCAL_RANK=str(rank),
        )
        cmd = [sys.executable, str(SCRIPTS / "loop.py"), "5", "0.01", "out"]
        procs.append(subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, out.decode()[-2000:]
    jobs = service.get("/jobs")
    assert len(jobs) == 1, jobs  # both ranks under the same id
    job = service.wait_job(jobs[0]["id"], lambda j: len(j["ranks"]) == 2)
    assert job["id"].startswith("job-")
    assert {r["rank"] for r in job["ranks"]} == {0, 1}
