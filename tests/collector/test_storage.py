"""Storage on SQLite and PostgreSQL: the schema, what the persist loop writes, summaries, retention.

Every test runs on both databases (the ``db_url`` fixture); the collector runs in-process with an
injected clock, so windows and horizons are exact.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from fastapi.testclient import TestClient
from sqlalchemy import func, inspect, select, update
from support import make_header

from rankwatch.api.app import create_app
from rankwatch.collector.db import open_database
from rankwatch.collector.models import (
    ActionRow,
    Base,
    EventRow,
    GroupRow,
    GroupSummaryRow,
    JobRow,
    RankRow,
    SuspectHistoryRow,
    SuspectRow,
)
from rankwatch.collector.retention import DAY_S, purge
from rankwatch.collector.service import Collector
from rankwatch.collector.settings import Settings
from rankwatch.collector.summaries import bucket_of, hist_percentile_ms
from rankwatch.wire import OpKind, Records, encode_batch

T0 = 1_800_000_000.0  # a window boundary for 60 s windows


class Clock:
    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _collector(tmp: Path, db_url: str, clock: Clock, **kw: Any) -> Collector:
    settings = Settings(data_dir=tmp, db=db_url, **kw)
    return Collector(settings, open_database(settings.database_url), clock=clock)


def _batch(
    rank: int, batch: int, durations_ms: list[float], *, first: int = 1, world: int = 2, nbytes: int = 1024
) -> bytes:
    """One batch of all_reduces on the world group, sequence numbers from ``first``, with the given
    in-collective times."""
    h = make_header(rank=rank, world=world, batch=batch, entered=first + len(durations_ms) - 1)
    rows = []
    for i, d in enumerate(durations_ms):
        t = 1_000_000_000 + (first + i) * 10_000_000
        rows.append((0, int(OpKind.ALL_REDUCE), 1, -1, first + i, nbytes, t, t, t + int(d * 1e6)))
    return encode_batch(h, Records.from_rows(rows))


def test_migrations_build_exactly_the_models(db_url: str) -> None:
    db = open_database(db_url if not db_url.startswith("postgresql://") else Settings(db=db_url).database_url)
    with db.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)
        tables = set(inspect(conn).get_table_names())
    db.close()
    assert diff == []
    assert {"group_summaries", "actions", "job_leases", "jobs", "ranks", "groups", "suspects", "events"} <= tables


def test_persist_writes_what_changed_and_keeps_the_policy(tmp_path: Path, db_url: str) -> None:
    clock = Clock()
    col = _collector(tmp_path, db_url, clock)
    col.ingest(_batch(0, 0, [1.0, 2.0]))
    col.ingest(_batch(1, 0, [1.0, 2.0]))
    assert col.persist() == 1
    with col.db.sessions.begin() as s:  # a policy set by someone else (the actions API, an admin)
        s.execute(update(JobRow).where(JobRow.id == "job-a").values(policy={"mode": "approve"}))
    clock.t += 1
    col.ingest(_batch(1, 1, [3.0], first=3))
    with col.jobs["job-a"].lock:
        changes = col.jobs["job-a"].take_changes(clock.t, col.instance)
        assert changes is not None
        assert [r["rank"] for r in changes.ranks] == [1]  # rank 0 sent nothing: not rewritten
        col.jobs["job-a"].put_back(changes)
    assert col.persist() == 1
    assert col.persist() == 0  # nothing changed since
    with col.db.sessions() as s:
        ops = dict(s.execute(select(RankRow.rank, RankRow.ops).where(RankRow.job_id == "job-a")).all())
        job = s.get(JobRow, "job-a")
        group = s.get(GroupRow, ("job-a", "0"))
    assert ops == {0: 2, 1: 3}
    assert job is not None and job.policy == {"mode": "approve"} and job.last_seen == clock.t
    assert group is not None and group.members == [0, 1] and group.ops == 5 and group.last_seq == 3


def test_summaries_per_group_and_window(tmp_path: Path, db_url: str) -> None:
    clock = Clock(T0 + 5)
    col = _collector(tmp_path, db_url, clock)
    rng = np.random.default_rng(1)
    first = [float(x) for x in rng.uniform(0.5, 50.0, size=200)]
    col.ingest(_batch(0, 0, first[:100]))
    col.ingest(_batch(1, 0, first[100:], nbytes=4096))
    clock.t = T0 + 65  # the next window
    col.ingest(_batch(0, 1, [7.0, 9.0], first=101))
    col.persist()
    with TestClient(create_app(col.settings, collector=col)) as c:
        rows = c.get("/jobs/job-a/summaries").json()
        assert c.get("/jobs/job-a/summaries", params={"since": T0 + 60}).json() == rows[:1]
        assert c.get("/jobs/nope/summaries").status_code == 404
    newest, oldest = rows
    assert (newest["window_start"], oldest["window_start"]) == ("2027-01-15T08:01:00.000Z", "2027-01-15T08:00:00.000Z")
    assert newest["ops"] == 2 and newest["ranks"] == 1 and newest["time_max_ms"] == pytest.approx(9.0)
    assert oldest["ops"] == 200 and oldest["ranks"] == 2 and oldest["bytes"] == 100 * 1024 + 100 * 4096
    assert oldest["kinds"] == {"all_reduce": 200} and oldest["writer"] == col.instance
    assert (oldest["seq_first"], oldest["seq_last"]) == (1, 100)
    exact = np.array(first)
    assert oldest["time_min_ms"] == pytest.approx(exact.min(), abs=1e-3)
    assert oldest["time_max_ms"] == pytest.approx(exact.max(), abs=1e-3)
    assert oldest["time_sum_s"] == pytest.approx(exact.sum() / 1000, rel=1e-6)
    for q, key in ((50, "time_p50_ms"), (99, "time_p99_ms")):  # four buckets per octave: within 19%
        assert oldest[key] == pytest.approx(np.percentile(exact, q), rel=0.2), key


def test_summaries_of_a_batch_with_several_groups() -> None:
    from rankwatch.collector.summaries import GroupSummaries

    rows = [
        (0, int(OpKind.ALL_REDUCE), 1, -1, 1, 100, 0, 0, 2_000_000),
        (1, int(OpKind.ALL_GATHER), 1, -1, 1, 10, 0, 0, 40_000_000),
        (0, int(OpKind.ALL_REDUCE), 1, -1, 2, 100, 0, 0, 4_000_000),
        (1, int(OpKind.BROADCAST), 1, 0, 2, 30, 0, 0, 1_000_000),
    ]
    sums = GroupSummaries(60.0)
    sums.add(3, ("dp", "tp"), Records.from_rows(rows), T0)
    sums.add(4, ("tp", "dp"), Records.from_rows([(0, int(OpKind.ALL_GATHER), 1, -1, 3, 5, 0, 0, 80_000_000)]), T0)
    got, _ = sums.take_rows("j", "w", T0)
    by = {r["gid"]: r for r in got}
    assert (by["dp"]["ops"], by["dp"]["bytes"], by["dp"]["time_min_ms"], by["dp"]["time_max_ms"]) == (2, 200, 2.0, 4.0)
    assert (by["tp"]["ops"], by["tp"]["bytes"], by["tp"]["time_min_ms"], by["tp"]["time_max_ms"]) == (3, 45, 1.0, 80.0)
    assert by["tp"]["kinds"] == {"all_gather": 2, "broadcast": 1} and by["dp"]["kinds"] == {"all_reduce": 2}
    # ranks: those whose batches name the group (rank 4 names dp without an op on it in this batch)
    assert (by["dp"]["seq_last"], by["tp"]["seq_last"], by["dp"]["ranks"], by["tp"]["ranks"]) == (2, 3, 2, 2)
    assert sums.take_rows("j", "w", T0)[0] == []  # written: nothing new
    sums.add(3, ("dp",), Records.from_rows(rows[:1]), T0 + 60)  # the next window
    (row,) = sums.take_rows("j", "w", T0 + 60)[0]
    assert (row["gid"], row["window_start"], row["ops"]) == ("dp", T0 + 60, 1)
    assert [k[1] for k in sums.windows] == [T0 + 60]  # the closed windows, written, are let go


def test_histogram_percentiles() -> None:
    durs = np.array([1_000_000] * 98 + [500_000_000] * 2)  # 1 ms, and two 500 ms outliers
    hist = np.bincount(bucket_of(durs), minlength=128)
    assert hist_percentile_ms(hist, 0.5, 1.0, 500.0) == pytest.approx(1.0, rel=0.2)
    assert hist_percentile_ms(hist, 0.99, 1.0, 500.0) == pytest.approx(500.0, rel=0.2)


def test_a_new_holder_carries_on_the_open_window(tmp_path: Path, db_url: str) -> None:
    clock = Clock(T0 + 1)
    first = _collector(tmp_path, db_url, clock)
    first.ingest(_batch(0, 0, [1.0, 1.0, 1.0]))
    first.stop()  # writes, and releases the job's lease
    second = _collector(tmp_path, db_url, clock)
    clock.t += 10
    second.ingest(_batch(0, 1, [1.0, 1.0], first=4))
    second.persist()
    with second.db.sessions() as s:
        (row,) = s.scalars(select(GroupSummaryRow))
    assert row.ops == 5 and row.writer == second.instance and row.seq_last == 5


def test_retention_deletes_only_what_is_past_its_horizon(tmp_path: Path, db_url: str) -> None:
    now = T0
    col = _collector(tmp_path, db_url, Clock(now))
    old, recent = now - 100 * DAY_S, now - DAY_S
    summary = {"window_s": 60.0, "ops": 1, "bytes": 1, "ranks": 1, "seq_first": 1, "seq_last": 1, "time_sum_s": 0.0}
    summary |= {"time_min_ms": 1.0, "time_p50_ms": 1.0, "time_p99_ms": 1.0, "time_max_ms": 1.0, "kinds": {}}
    summary |= {"hist": [], "writer": "x", "updated_at": now}
    suspect = {"job_id": "j", "key": "k", "kind": "rank_dead", "level": "rank", "ranks": [1], "nodes": ["n"]}
    suspect |= {"first_seen": old, "detected_at": old, "updated_at": old, "score": 1.0, "evidence": {}}
    action = {"job_id": "j", "type": "restart", "reason": "r", "state": "done", "steps": [], "actor": "a"}
    action |= {"dry_run": False, "created_at": old}
    with col.db.sessions.begin() as s:
        s.add(JobRow(id="j", first_seen=old, last_seen=now, world=2, state="running"))
        s.flush()
        s.add_all(
            [
                GroupSummaryRow(job_id="j", gid="0", window_start=now - 8 * DAY_S, **summary),
                GroupSummaryRow(job_id="j", gid="0", window_start=now - 6 * DAY_S, **summary),
                SuspectRow(**suspect, status="resolved", resolved_at=old),
                SuspectRow(**(suspect | {"key": "k2"}), status="active"),  # open: kept however old
                SuspectRow(**(suspect | {"key": "k3"}), status="resolved", resolved_at=recent),
                ActionRow(**action, updated_at=old),
                ActionRow(**action, updated_at=recent),
                EventRow(at=old, type="suspect.opened", job_id="j", payload={}),
                EventRow(at=recent, type="suspect.opened", job_id="j", payload={}),
            ]
        )
        s.flush()
        first_suspect = s.scalars(select(SuspectRow.id).order_by(SuspectRow.id)).first()
        s.add(SuspectHistoryRow(suspect_id=first_suspect, at=old, event="opened", status="active", score=1.0))
    assert purge(col.db, col.settings, now) == {"summaries": 1, "suspects": 1, "actions": 1, "events": 1}
    with col.db.sessions() as s:
        assert [r.window_start for r in s.scalars(select(GroupSummaryRow))] == [now - 6 * DAY_S]
        assert sorted(r.key for r in s.scalars(select(SuspectRow))) == ["k2", "k3"]
        assert s.scalar(select(func.count()).select_from(SuspectHistoryRow)) == 0  # went with its suspect
        assert [r.updated_at for r in s.scalars(select(ActionRow))] == [recent]
        assert [r.at for r in s.scalars(select(EventRow))] == [recent]
    assert purge(col.db, col.settings, now) == {"summaries": 0, "suspects": 0, "actions": 0, "events": 0}
    keep = Settings(data_dir=tmp_path, db=db_url, retention_events_days=0)  # 0: forever
    assert "events" not in purge(col.db, keep, now + 1000 * DAY_S)


def test_the_collector_loop_runs_the_cleanup(tmp_path: Path, db_url: str) -> None:
    clock = Clock()
    col = _collector(tmp_path, db_url, clock, cleanup_interval_s=3600)
    with col.db.sessions.begin() as s:
        s.add(EventRow(at=clock.t - 91 * DAY_S, type="suspect.opened", job_id="j", payload={}))
    col.tick()  # the first pass cleans up
    with col.db.sessions() as s:
        assert s.scalar(select(func.count()).select_from(EventRow)) == 0
        s.add(EventRow(at=clock.t - 91 * DAY_S, type="suspect.opened", job_id="j", payload={}))
        s.commit()
    clock.t += 60
    col.tick()  # not yet an hour later
    with col.db.sessions() as s:
        assert s.scalar(select(func.count()).select_from(EventRow)) == 1
    clock.t += 3600
    col.tick()
    with col.db.sessions() as s:
        assert s.scalar(select(func.count()).select_from(EventRow)) == 0


def test_processes_starting_at_once_upgrade_the_schema_once(db_url: str) -> None:
    from concurrent.futures import ThreadPoolExecutor

    url = Settings(db=db_url).database_url
    with ThreadPoolExecutor(4) as pool:  # four "processes" starting together on an empty database
        dbs = list(pool.map(lambda _: open_database(url), range(4)))
    with dbs[0].engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    for db in dbs:
        db.close()
    assert diff == []
