"""Two real ``rankwatch serve`` processes on one real PostgreSQL: one job is analysed by one of them,
whichever process a batch reaches; when that process is killed, the other takes the job over.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pgserver import PgServer
from sqlalchemy import select
from support import Service, clean_env, make_body, make_header, start_service

from rankwatch.collector.db import Database, open_database
from rankwatch.collector.models import GroupSummaryRow, JobLeaseRow, RankRow
from rankwatch.collector.settings import Settings
from rankwatch.wire import CONTENT_TYPE

pytestmark = pytest.mark.postgres
TTL = 3.0


@pytest.fixture
def pg_url(pg_server: PgServer) -> Iterator[str]:
    name = pg_server.create_database()
    yield pg_server.url(name)
    pg_server.drop_database(name)


def _send(svc: Service, rank: int, batch: int) -> httpx.Response:
    body = make_body(make_header(rank=rank, world=4, batch=batch, entered=3 * batch + 3), first_seq=3 * batch + 1)
    return httpx.post(svc.url + "/ingest", content=body, headers={"Content-Type": CONTENT_TYPE}, timeout=30)


def _lease(db: Database) -> JobLeaseRow | None:
    with db.sessions() as s:
        return s.get(JobLeaseRow, "job-a")


def _wait(pred: Any, timeout: float = 30.0) -> float:
    start = time.monotonic()
    while not pred():
        assert time.monotonic() - start < timeout, "timed out"
        time.sleep(0.1)
    return time.monotonic() - start


def test_one_job_is_analysed_once_and_taken_over(tmp_path: Path, pg_url: str) -> None:
    env = clean_env(RANKWATCH_LEASE_TTL_S=str(TTL), RANKWATCH_PERSIST_INTERVAL_S="0.5")
    a = start_service(tmp_path, "--db", pg_url, env=env)
    b = start_service(tmp_path, "--db", pg_url, env=env)
    db = open_database(Settings(db=pg_url).database_url)
    try:
        # the ranks of one job spread over both processes, as a load balancer would spread them
        for batch in range(3):
            for rank in range(4):
                r = _send(a if rank % 2 else b, rank, batch)
                assert r.status_code == 200 and r.json()["accepted"] == 3, r.text
        lease = _lease(db)
        assert lease is not None
        holder, other = (a, b) if lease.holder_url == a.url else (b, a)
        assert lease.holder_url == holder.url

        def summaries() -> list[GroupSummaryRow]:
            with db.sessions() as s:
                return list(s.scalars(select(GroupSummaryRow).where(GroupSummaryRow.job_id == "job-a")))

        _wait(lambda: sum(w.ops for w in summaries()) == 36)
        assert {w.writer for w in summaries()} == {lease.holder}  # one process analysed the job
        live = holder.job("job-a")
        assert live is not None and live["live"] is True and [r["ops"] for r in live["ranks"]] == [9, 9, 9, 9]
        stored = other.job("job-a")  # the other reads what the holder wrote, and holds nothing live
        assert stored is not None and stored["live"] is False
        assert other.get("/jobs/job-a/summaries")[0]["writer"] == lease.holder

        # the holder dies; nothing is sent meanwhile: the other's lease sweep takes the job over
        holder.stop(signal.SIGKILL)
        took = _wait(lambda: (row := _lease(db)) is not None and row.holder_url == other.url, timeout=4 * TTL)
        assert took <= TTL + TTL / 3 + 2.0, f"takeover took {took:.1f}s"
        new = _lease(db)
        assert new is not None and new.epoch == lease.epoch + 1
        # and carries on from what the dead holder had committed
        assert _send(other, 1, 2).json()["duplicate"] is True
        for rank in range(4):
            r = _send(other, rank, 3)
            assert r.status_code == 200 and r.json()["accepted"] == 3, r.text

        def ops() -> list[int]:
            with db.sessions() as s:
                return sorted(s.scalars(select(RankRow.ops).where(RankRow.job_id == "job-a")))

        _wait(lambda: ops() == [12, 12, 12, 12])
        _wait(lambda: sum(w.ops for w in summaries()) == 48)
        assert new.holder in {w.writer for w in summaries()}
    finally:
        for svc in (a, b):
            svc.stop(signal.SIGKILL)
        db.close()
