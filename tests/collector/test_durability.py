"""What was committed survives ``kill -9`` of a real ``rankwatch serve``, on SQLite and PostgreSQL.

The service takes batches from ranks; the test waits until the persist loop has committed them,
adds what other parts of the service commit (a job's policy, an active suspect and the outbox
event that pages about it), kills the process with SIGKILL, starts a new one on the same database
and port, and checks that it picks up where the first one was.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import select, update
from support import Service, clean_env, make_body, make_header, start_service

from rankwatch.collector.db import open_database
from rankwatch.collector.models import EventRow, GroupSummaryRow, JobRow, RankRow
from rankwatch.collector.settings import Settings
from rankwatch.collector.suspects import SuspectStore
from rankwatch.wire import CONTENT_TYPE


@dataclass
class Finding:
    key: str = "straggler:3"
    kind: str = "noncomm_slow"
    level: str = "rank"
    ranks: list[int] = field(default_factory=lambda: [3])
    nodes: list[str] = field(default_factory=lambda: ["node0"])
    link: None = None
    score: float = 0.9
    slowdown: float = 1.4
    first_seen: float = 0.0
    evidence: dict[str, Any] = field(default_factory=lambda: {"lateness_ms": {"3": 40.0}})


def _send(svc: Service, rank: int, batch: int, job: str = "job-a") -> dict[str, Any]:
    body = make_body(
        make_header(job=job, rank=rank, world=4, batch=batch, entered=3 * batch + 3), first_seq=3 * batch + 1
    )
    r = httpx.post(svc.url + "/ingest", content=body, headers={"Content-Type": CONTENT_TYPE}, timeout=30)
    assert r.status_code == 200, r.text
    return dict(r.json())


def _wait(pred: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def test_committed_state_survives_kill_9(tmp_path: Path, db_url: str) -> None:
    env = clean_env(RANKWATCH_PERSIST_INTERVAL_S="0.5")
    svc = start_service(tmp_path, "--db", db_url, env=env)
    db = open_database(Settings(db=db_url).database_url)
    try:
        for batch in range(3):
            for rank in range(4):
                assert _send(svc, rank, batch)["accepted"] == 3

        def persisted() -> bool:
            with db.sessions() as s:
                ops = s.scalars(select(RankRow.ops).where(RankRow.job_id == "job-a")).all()
                summed = sum(s.scalars(select(GroupSummaryRow.ops).where(GroupSummaryRow.job_id == "job-a")))
            return sorted(ops) == [9, 9, 9, 9] and summed == 36

        _wait(persisted)
        # what the rest of the service commits: a policy, and (for a job with no live batches, so no
        # analysis pass can decide it) an active suspect and the event that pages about it
        now = time.time()
        with db.sessions.begin() as s:
            s.execute(update(JobRow).where(JobRow.id == "job-a").values(policy={"mode": "approve"}))
            s.add(JobRow(id="job-old", first_seen=now - 60, last_seen=now - 60, world=4, state="running"))
        SuspectStore(db).reconcile("job-old", [Finding(first_seen=now - 30)], False, now)
        svc.stop(signal.SIGKILL)
        assert svc.proc.returncode == -signal.SIGKILL

        port = int(svc.url.rsplit(":", 1)[1])
        again = start_service(tmp_path, "--db", db_url, env=env, port=port)
        try:
            job = again.job("job-a")
            assert job is not None and job["policy"] == {"mode": "approve"}
            assert [(r["rank"], r["ops"]) for r in job["ranks"]] == [(0, 9), (1, 9), (2, 9), (3, 9)]
            (suspect,) = again.get("/suspects")
            assert (suspect["job_id"], suspect["status"], suspect["ranks"]) == ("job-old", "active", [3])
            time.sleep(1.5)  # analysis passes and persists run; nothing decides the suspect without data
            assert [s["status"] for s in again.get("/suspects")] == ["active"]
            with db.sessions() as s:
                assert [e.type for e in s.scalars(select(EventRow))] == ["suspect.opened"]
            assert sum(w["ops"] for w in again.get("/jobs/job-a/summaries")) == 36
            # the ranks carry on: a retried batch from before the kill is known, the next one is new
            assert _send(again, 2, 2)["duplicate"] is True
            assert _send(again, 2, 3)["accepted"] == 3
            assert again.job("job-a")["ranks"][2]["ops"] == 12  # type: ignore[index]
        finally:
            again.stop()
    finally:
        svc.stop(signal.SIGKILL)
        db.close()
