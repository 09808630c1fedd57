"""Job leases between service processes sharing a database, and forwarding to the holder.

Two collectors (two "processes") share one database (SQLite and PostgreSQL) and one clock; the
forwarding tests connect the non-holder's router to the holder's app in-process. The real
processes are in ``test_cluster.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from support import make_body, make_header

from rankwatch.api.app import create_app
from rankwatch.collector.db import open_database
from rankwatch.collector.leases import LeaseManager, NotHolder
from rankwatch.collector.models import JobLeaseRow, RankRow
from rankwatch.collector.routing import IngestRouter
from rankwatch.collector.service import Collector
from rankwatch.collector.settings import Settings
from rankwatch.multibatch import MULTI_CONTENT_TYPE, encode_multi
from rankwatch.wire import CONTENT_TYPE

TTL = 15.0


class Clock:
    def __init__(self) -> None:
        self.t = 1_800_000_000.0

    def __call__(self) -> float:
        return self.t


def _collector(tmp: Path, db_url: str, clock: Clock, port: int) -> Collector:
    settings = Settings(data_dir=tmp, db=db_url, port=port, lease_ttl_s=TTL)
    return Collector(settings, open_database(settings.database_url), clock=clock)


@pytest.fixture
def pair(tmp_path: Path, db_url: str) -> tuple[Collector, Collector, Clock]:
    clock = Clock()
    return _collector(tmp_path, db_url, clock, 7001), _collector(tmp_path, db_url, clock, 7002), clock


def _lease(c: Collector, job: str = "job-a") -> JobLeaseRow:
    with c.db.sessions() as s:
        row = s.get(JobLeaseRow, job)
        assert row is not None
        return row


def test_one_holder_at_a_time(pair: tuple[Collector, Collector, Clock]) -> None:
    a, b, clock = pair
    assert a.leases.owner("job-a") is None  # free: a takes it
    assert b.leases.owner("job-a") == "http://127.0.0.1:7001"
    assert _lease(a).holder == a.instance and _lease(a).epoch == 1
    clock.t += TTL - 1
    assert a.leases.renew() == []  # a renews in time: still a's
    clock.t += TTL - 1
    assert b.leases.owner("job-a") == "http://127.0.0.1:7001"
    assert _lease(a).epoch == 1


def test_an_expired_lease_is_taken_over_and_its_holder_steps_back(pair: tuple[Collector, Collector, Clock]) -> None:
    a, b, clock = pair
    a.ingest(make_body())
    a.persist()
    clock.t += TTL + 0.1  # a stopped renewing (dead, or stalled)
    assert b.leases.expired() == ["job-a"]
    b.keep_leases()  # the sweep takes it over, and loads the job
    assert _lease(a).holder == b.instance and _lease(a).epoch == 2
    assert b.jobs["job-a"].ranks[0].ops == 3 and b.jobs["job-a"].ranks[0].last_batch == 0
    # a comes back to life with the job still in memory: it must not write over b, and steps back
    with a.jobs["job-a"].lock:
        a.jobs["job-a"].dirty = True
    assert a.persist() == 0
    assert "job-a" not in a.jobs
    assert a.leases.renew(["job-a"]) == ["job-a"]
    with pytest.raises(NotHolder) as info:
        a.ingest(make_body(make_header(batch=1, entered=6), first_seq=4))
    assert info.value.url == "http://127.0.0.1:7002"
    # b de-duplicates with the state a had written: the old batch is a replay, the new one is taken
    assert b.ingest(make_body())["duplicate"] is True
    assert b.ingest(make_body(make_header(batch=1, entered=6), first_seq=4))["accepted"] == 3


def test_a_released_lease_is_free_at_once_and_a_restart_takes_its_own_back(
    tmp_path: Path, db_url: str, pair: tuple[Collector, Collector, Clock]
) -> None:
    a, b, clock = pair
    a.leases.owner("job-a")
    a.leases.release()
    assert b.leases.owner("job-a") is None
    # b "restarts" (a new process on the same URL): it takes its leases back without waiting
    again = _collector(tmp_path, db_url, clock, 7002)
    assert again.load() == 1
    assert _lease(a).holder == again.instance and "job-a" in again.jobs
    assert a.leases.owner("job-a") == "http://127.0.0.1:7002"


def test_the_guard_vetoes_suspect_writes_of_a_lost_lease(pair: tuple[Collector, Collector, Clock]) -> None:
    a, b, clock = pair
    a.ingest(make_body())
    a.persist()
    clock.t += TTL + 1
    assert b.leases.owner("job-a") is None

    class Finding:
        key, kind, level, ranks, nodes, link = "k", "noncomm_slow", "rank", [1], ["n"], None
        score, slowdown, first_seen, evidence = 1.0, 1.5, clock.t, {}

    vetoed = a.suspects.reconcile(
        "job-a", [Finding()], True, clock.t, guard=lambda s: bool(a.leases.guard(s, ["job-a"]))
    )
    assert vetoed == [] and a.suspects.list() == []
    b.ingest(make_body(make_header(batch=1, entered=6), first_seq=4))
    b.persist()
    opened = b.suspects.reconcile(
        "job-a", [Finding()], True, clock.t, guard=lambda s: bool(b.leases.guard(s, ["job-a"]))
    )
    assert [e["type"] for e in opened] == ["suspect.opened"] and len(b.suspects.list()) == 1


def test_idle_jobs_are_let_go(pair: tuple[Collector, Collector, Clock]) -> None:
    a, _, clock = pair
    a.ingest(make_body())
    clock.t += a.settings.job_idle_s + 1
    a.keep_leases()
    assert "job-a" not in a.jobs
    with a.db.sessions() as s:
        assert s.get(JobLeaseRow, "job-a") is None  # released: anyone may take the job
        assert s.scalar(select(RankRow.ops).where(RankRow.job_id == "job-a")) == 3  # written first
    assert a.get_job("job-a")["live"] is False  # type: ignore[index]


def test_batches_reach_the_holder_and_commands_come_back(pair: tuple[Collector, Collector, Clock]) -> None:
    a, b, _ = pair
    holder = create_app(a.settings, collector=a)
    other = create_app(b.settings, collector=b)
    other.state.router = IngestRouter(transport=httpx.ASGITransport(app=holder))
    hdr = {"Content-Type": CONTENT_TYPE}
    with TestClient(holder) as ha, TestClient(other) as hb:
        assert ha.post("/ingest", content=make_body(), headers=hdr).json()["accepted"] == 3
        (cmd,) = a.queue_commands("job-a", "dump_flight_recorder", [0]) or []
        r = hb.post("/ingest", content=make_body(make_header(batch=1, entered=6), first_seq=4), headers=hdr)
        assert r.status_code == 200 and r.json()["accepted"] == 3
        assert [c["id"] for c in r.json()["commands"]] == [cmd["id"]]  # relayed back to the rank
        # a multi-batch to the non-holder: one batch of another job it takes itself, two forwarded
        mixed = encode_multi(
            [
                make_body(make_header(rank=1)),
                make_body(make_header(job="job-b")),
                b"garbage",
                make_body(make_header(rank=1, batch=1, entered=6), first_seq=4),
            ]
        )
        got = hb.post("/ingest", content=mixed, headers={"Content-Type": MULTI_CONTENT_TYPE}).json()["results"]
        assert [g["status"] for g in got] == [200, 200, 400, 200]
        assert got[0]["accepted"] == 3 and "shorter than" in got[2]["detail"] and got[3]["accepted"] == 3
        # a batch forwarded to a process that is not the holder is not forwarded again
        r = ha.post(
            "/ingest", content=make_body(make_header(job="job-b")), headers=hdr | {"X-Rankwatch-Forwarded-By": "x"}
        )
        assert r.status_code == 503 and "retry" in r.json()["detail"]
    assert a.jobs["job-a"].ranks[0].ops == 6 and a.jobs["job-a"].ranks[1].ops == 6
    assert "job-a" not in b.jobs and b.jobs["job-b"].ranks[0].ops == 3
    assert other.state.router.forwarded == 3


def test_an_unreachable_holder_gets_the_rank_a_503(pair: tuple[Collector, Collector, Clock]) -> None:
    a, b, _ = pair
    a.ingest(make_body())

    def refuse(request: httpx.Request) -> Any:
        raise httpx.ConnectError("connection refused", request=request)

    other = create_app(b.settings, collector=b)
    other.state.router = IngestRouter(transport=httpx.MockTransport(refuse))
    with TestClient(other) as hb:
        r = hb.post("/ingest", content=make_body(make_header(rank=1)), headers={"Content-Type": CONTENT_TYPE})
    assert r.status_code == 503 and "did not answer" in r.json()["detail"]


def test_two_managers_race_for_one_lease(tmp_path: Path, db_url: str) -> None:
    settings = Settings(data_dir=tmp_path, db=db_url)
    db = open_database(settings.database_url)
    clock = Clock()
    managers = [LeaseManager(db, instance=f"p{i}", url=f"http://h{i}:1", ttl_s=TTL, clock=clock) for i in range(4)]
    owners = [m.owner(f"job-{j}") for j in range(5) for m in managers]
    for j in range(5):  # for each job: exactly one manager holds it, the others name it
        mine = [m for m in managers if m.holds(f"job-{j}")]
        assert len(mine) == 1
        assert owners[j * 4 : j * 4 + 4].count(None) == 1
        assert set(owners[j * 4 : j * 4 + 4]) - {None} == {mine[0].url}
