"""The delivery worker's bookkeeping without HTTP: claims are leases, fan-out is once, gaps wait.

The worker is not started: these call ``fan_out`` and ``claim`` directly, on a clock the test moves.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select

from rankwatch.api.delivery import GAP_WAIT_S, LEASE_MARGIN_S, WebhookDispatcher
from rankwatch.api.webhooks import WebhookCreate, WebhookStore
from rankwatch.collector.db import Database, open_database
from rankwatch.collector.models import DeliveryRow, EventRow, OutboxCursorRow
from rankwatch.collector.settings import Settings


class Clock:
    def __init__(self) -> None:
        self.t = 1_800_000_000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def world(tmp_path: Path) -> Iterator[tuple[WebhookDispatcher, Database, Clock]]:
    clock = Clock()
    settings = Settings(data_dir=tmp_path, webhook_allow=["127.0.0.1"], webhook_timeout_s=10.0)
    db = open_database(settings.database_url)
    d = WebhookDispatcher(settings, clock=clock)
    d.db = db
    store = WebhookStore(db, d.allow, base_url="http://rw")
    store.create(WebhookCreate(url="http://127.0.0.1:9/hook"), clock())
    yield d, db, clock
    db.close()


def _event(db: Database, event_id: int, suspect_id: int | None = None) -> None:
    with db.sessions.begin() as s:
        s.add(EventRow(id=event_id, at=0.0, type="action.started", job_id="j", suspect_id=suspect_id, payload={}))


def _cursor(db: Database) -> int:
    with db.sessions() as s:
        row = s.get(OutboxCursorRow, "webhooks")
        return -1 if row is None else row.event_id


def _deliveries(db: Database) -> list[int | None]:
    with db.sessions() as s:
        return [e for e in s.scalars(select(DeliveryRow.event_id).order_by(DeliveryRow.event_id))]


def test_a_claim_is_a_lease_that_runs_out(world: tuple[WebhookDispatcher, Database, Clock]) -> None:
    d, db, clock = world
    _event(db, 1)
    assert d.fan_out() == 1 and d.fan_out() == 0  # once
    (c,) = d.claim(10)
    assert d.claim(10) == []  # claimed: nobody else takes it
    clock.t += d.settings.webhook_timeout_s + LEASE_MARGIN_S - 1
    assert d.claim(10) == []
    clock.t += 2  # the claimer died mid-attempt: the lease ran out, it is due again
    (again,) = d.claim(10)
    assert again.delivery_id == c.delivery_id and again.msg_id == c.msg_id


def test_per_webhook_and_per_suspect_limits(world: tuple[WebhookDispatcher, Database, Clock]) -> None:
    d, db, _clock = world
    for i in range(1, 7):
        _event(db, i, suspect_id=1 if i <= 2 else i)
    assert d.fan_out() == 6
    claims = d.claim(10)
    # events 1 and 2 are about one suspect: only the first goes; then 4 per webhook in all
    assert [c_.delivery_id for c_ in claims] == [1, 3, 4, 5]
    assert d.claim(10, {claims[0].webhook_id: 4}) == []


def test_fan_out_waits_at_a_gap_then_skips_it(world: tuple[WebhookDispatcher, Database, Clock]) -> None:
    d, db, clock = world
    _event(db, 1)
    _event(db, 3)  # 2 is in flight in another transaction (PostgreSQL commits out of order)
    assert d.fan_out() == 2 and _cursor(db) == 1  # the cursor waits below the gap
    with db.sessions() as s:
        assert s.scalar(select(func.count()).select_from(DeliveryRow)) == 2
    _event(db, 2)  # ... and commits late: it is not lost, nor is 3 sent twice
    assert d.fan_out() == 1 and _deliveries(db) == [1, 2, 3] and _cursor(db) == 3
    _event(db, 6)  # 4 and 5 never come (rolled back)
    assert d.fan_out() == 1 and d.fan_out() == 0 and _cursor(db) == 3
    clock.t += GAP_WAIT_S + 1
    assert d.fan_out() == 0 and _cursor(db) == 6  # given up on
    _event(db, 7)
    assert d.fan_out() == 1 and _deliveries(db) == [1, 2, 3, 6, 7]
