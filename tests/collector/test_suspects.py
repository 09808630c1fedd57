"""Suspects open, persist, resolve, and survive a restart, driven by a scripted detector.

The detector is injected (the collector's ``detector_factory`` seam) so these tests pin down the
collector's bookkeeping alone; the real detector has its own tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from support import make_body, make_header

from rankwatch.api.app import create_app
from rankwatch.collector.db import open_database
from rankwatch.collector.models import EventRow
from rankwatch.collector.service import Collector
from rankwatch.collector.settings import Settings
from rankwatch.wire import CONTENT_TYPE


@dataclass
class Finding:
    key: str
    kind: str = "noncomm_slow"
    level: str = "rank"
    ranks: list[int] = field(default_factory=lambda: [1])
    nodes: list[str] = field(default_factory=lambda: ["node0"])
    link: tuple[str, str] | None = None
    score: float = 0.9
    slowdown: float | None = 1.5
    first_seen: float = 0.0
    evidence: dict[str, Any] = field(default_factory=lambda: {"lateness_ms": {"1": 50.0}})


class ScriptedDetector:
    findings: list[Finding] = []
    ready_now = True
    observed = 0

    def observe(self, batch: Any, received_at: float) -> None:
        ScriptedDetector.observed += 1

    def evaluate(self, now: float) -> list[Finding]:
        return list(ScriptedDetector.findings)

    def ready(self, now: float) -> bool:
        return ScriptedDetector.ready_now


class Clock:
    def __init__(self) -> None:
        self.t = 1_800_000_000.0

    def __call__(self) -> float:
        return self.t


def _app(tmp: Path, clock: Clock, db_url: str) -> tuple[TestClient, Collector]:
    settings = Settings(data_dir=tmp, db=db_url)
    collector = Collector(
        settings, open_database(settings.database_url), detector_factory=lambda _j: ScriptedDetector(), clock=clock
    )
    collector.load()
    return TestClient(create_app(settings, collector=collector)), collector


@pytest.fixture
def clock() -> Clock:
    ScriptedDetector.findings = []
    ScriptedDetector.ready_now = True
    return Clock()


def _ingest(c: TestClient, rank: int = 0, batch: int = 0) -> None:
    r = c.post(
        "/ingest", content=make_body(make_header(rank=rank, batch=batch)), headers={"Content-Type": CONTENT_TYPE}
    )
    assert r.status_code == 200, r.text


def test_open_update_resolve(tmp_path: Path, clock: Clock, db_url: str) -> None:
    c, col = _app(tmp_path, clock, db_url)
    _ingest(c)
    col.tick()
    assert c.get("/suspects").json() == []
    ScriptedDetector.findings = [Finding(key="straggler:1", first_seen=clock.t - 2.0)]
    clock.t += 1
    col.tick()
    (s,) = c.get("/suspects", params={"job_id": "job-a"}).json()
    assert (s["kind"], s["level"], s["ranks"], s["status"]) == ("noncomm_slow", "rank", [1], "active")
    assert s["slowdown"] == 1.5 and s["detection_latency_s"] == 3.0
    # the same fault on the next passes is the same suspect, not a new one
    for _ in range(3):
        clock.t += 1
        col.tick()
    assert len(c.get("/suspects").json()) == 1
    # gone: resolved, with its history
    ScriptedDetector.findings = []
    clock.t += 1
    col.tick()
    detail = c.get(f"/suspects/{s['id']}").json()
    assert detail["status"] == "resolved" and detail["resolved_at"] is not None
    assert [h["event"] for h in detail["history"]] == ["opened", "resolved"]
    assert c.get("/suspects", params={"status": "active"}).json() == []
    assert len(c.get("/suspects", params={"status": "resolved", "kind": "noncomm_slow"}).json()) == 1
    with col.db.sessions() as sess:
        assert [e.type for e in sess.scalars(select(EventRow).order_by(EventRow.id))] == [
            "suspect.opened",
            "suspect.resolved",
        ]


def test_not_resolved_until_the_detector_is_ready(tmp_path: Path, clock: Clock, db_url: str) -> None:
    c, col = _app(tmp_path, clock, db_url)
    _ingest(c)
    ScriptedDetector.findings = [Finding(key="hang:0:7", kind="noncomm_hang", slowdown=None)]
    col.tick()
    ScriptedDetector.findings = []
    ScriptedDetector.ready_now = False
    clock.t += 5
    col.tick()
    assert c.get("/suspects").json()[0]["status"] == "active"
    ScriptedDetector.ready_now = True
    col.tick()
    assert c.get("/suspects").json()[0]["status"] == "resolved"


def test_active_suspects_survive_a_restart(tmp_path: Path, clock: Clock, db_url: str) -> None:
    c, col = _app(tmp_path, clock, db_url)
    _ingest(c)
    ScriptedDetector.findings = [Finding(key="straggler:1")]
    col.tick()
    col.stop()
    # a new service process on the same database: no batch yet, nothing analysed: still active
    ScriptedDetector.findings = []
    c2, col2 = _app(tmp_path, clock, db_url)
    clock.t += 30
    col2.tick()
    assert [s["status"] for s in c2.get("/suspects").json()] == ["active"]
    # fresh data arrives and the (ready) detector no longer reports it: now it resolves
    _ingest(c2, batch=1)
    col2.tick()
    assert [s["status"] for s in c2.get("/suspects").json()] == ["resolved"]


def test_unknown_suspect_is_404(tmp_path: Path, clock: Clock, db_url: str) -> None:
    c, _ = _app(tmp_path, clock, db_url)
    assert c.get("/suspects/99").status_code == 404
    assert c.get("/suspects", params={"kind": "nonsense"}).status_code == 422
