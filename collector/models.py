"""SQLAlchemy 2 models: what people query later. Raw per-op records never come here.

Times are float seconds since the epoch (server clock), portable across SQLite and PostgreSQL;
the API renders them as ISO 8601.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, Float, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

__all__ = [
    "ActionRow",
    "Base",
    "DeliveryAttemptRow",
    "DeliveryRow",
    "EventRow",
    "GroupRow",
    "GroupSummaryRow",
    "JobLeaseRow",
    "JobRow",
    "OutboxCursorRow",
    "RankRow",
    "SuspectHistoryRow",
    "StandbyRow",
    "SuspectRow",
    "WebhookRow",
]


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


class JobRow(Base):
    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(256), primary_key=True)
    first_seen: Mapped[float] = mapped_column(Float)
    last_seen: Mapped[float] = mapped_column(Float, index=True)
    world: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(32), default="running")
    policy: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    meta: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)


class RankRow(Base):
    __tablename__ = "ranks"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    rank: Mapped[int] = mapped_column(Integer, primary_key=True)
    node: Mapped[str] = mapped_column(String(256), index=True)
    pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    incarnation: Mapped[str] = mapped_column(String(256))
    restart: Mapped[int] = mapped_column(Integer, default=0)
    state: Mapped[str] = mapped_column(String(32))
    first_seen: Mapped[float] = mapped_column(Float)
    last_seen: Mapped[float] = mapped_column(Float)
    ops: Mapped[int] = mapped_column(BigInteger, default=0)
    drops: Mapped[int] = mapped_column(BigInteger, default=0)
    batches: Mapped[int] = mapped_column(BigInteger, default=0)
    last_batch: Mapped[int] = mapped_column(BigInteger, default=-1)
    end_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    meta: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)


class GroupRow(Base):
    __tablename__ = "groups"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    gid: Mapped[str] = mapped_column(String(256), primary_key=True)
    desc: Mapped[str | None] = mapped_column(String(256), nullable=True)
    members: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)
    size: Mapped[int | None] = mapped_column(Integer, nullable=True)
    backend: Mapped[str | None] = mapped_column(String(64), nullable=True)
    last_seq: Mapped[int] = mapped_column(BigInteger, default=0)
    ops: Mapped[int] = mapped_column(BigInteger, default=0)
    op_counts: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)


class SuspectRow(Base):
    """A rank, node or link the detector blames; one row per fault, from opening to resolution."""

    __tablename__ = "suspects"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    key: Mapped[str] = mapped_column(String(512))
    kind: Mapped[str] = mapped_column(String(32), index=True)
    level: Mapped[str] = mapped_column(String(16))
    ranks: Mapped[list[Any]] = mapped_column(JSON)
    nodes: Mapped[list[Any]] = mapped_column(JSON)
    link: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)
    status: Mapped[str] = mapped_column(String(16), index=True)
    first_seen: Mapped[float] = mapped_column(Float)
    detected_at: Mapped[float] = mapped_column(Float, index=True)
    updated_at: Mapped[float] = mapped_column(Float)
    resolved_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    score: Mapped[float] = mapped_column(Float)
    slowdown: Mapped[float | None] = mapped_column(Float, nullable=True)
    peak_slowdown: Mapped[float | None] = mapped_column(Float, nullable=True)
    evidence: Mapped[dict[str, Any]] = mapped_column(JSON)
    flight_recorder: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)


class SuspectHistoryRow(Base):
    """What happened to a suspect, and when: opened, updated, resolved, isolated."""

    __tablename__ = "suspect_history"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    suspect_id: Mapped[int] = mapped_column(ForeignKey("suspects.id", ondelete="CASCADE"), index=True)
    at: Mapped[float] = mapped_column(Float)
    event: Mapped[str] = mapped_column(String(32))
    status: Mapped[str] = mapped_column(String(16))
    score: Mapped[float] = mapped_column(Float)
    slowdown: Mapped[float | None] = mapped_column(Float, nullable=True)
    note: Mapped[str | None] = mapped_column(Text, nullable=True)


class EventRow(Base):
    """The outbox: every event that may page someone, written in the transaction that caused it.

    Webhook delivery reads from here; nothing is lost if the service dies right after a commit.
    """

    __tablename__ = "events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[float] = mapped_column(Float, index=True)
    type: Mapped[str] = mapped_column(String(64))
    job_id: Mapped[str] = mapped_column(String(256), index=True)
    suspect_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    action_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)


class WebhookRow(Base):
    """A webhook subscription: where to send which events, in which format (``kind``).

    ``secret`` (signing key) and ``routing_key`` (PagerDuty) are kept so deliveries can use them;
    the API never shows them after creation.
    """

    __tablename__ = "webhooks"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    created_at: Mapped[float] = mapped_column(Float)
    kind: Mapped[str] = mapped_column(String(16))
    url: Mapped[str] = mapped_column(Text)
    description: Mapped[str | None] = mapped_column(String(200), nullable=True)
    secret: Mapped[str | None] = mapped_column(Text, nullable=True)
    routing_key: Mapped[str | None] = mapped_column(Text, nullable=True)
    job_id: Mapped[str | None] = mapped_column(String(256), nullable=True)
    kinds: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)
    min_score: Mapped[float | None] = mapped_column(Float, nullable=True)
    events: Mapped[list[Any]] = mapped_column(JSON)
    after_event_id: Mapped[int] = mapped_column(Integer, default=0)
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    disabled_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    disabled_reason: Mapped[str | None] = mapped_column(Text, nullable=True)


class DeliveryRow(Base):
    """One message to one subscription: pending until delivered or dead; ``msg_id`` never changes."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (UniqueConstraint("webhook_id", "event_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    webhook_id: Mapped[int] = mapped_column(ForeignKey("webhooks.id", ondelete="CASCADE"), index=True)
    event_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    event_type: Mapped[str] = mapped_column(String(64))
    msg_id: Mapped[str] = mapped_column(String(64), unique=True)
    order_key: Mapped[str | None] = mapped_column(String(300), nullable=True)
    body: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16), index=True)
    created_at: Mapped[float] = mapped_column(Float)
    next_attempt_at: Mapped[float] = mapped_column(Float, index=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    tries: Mapped[int] = mapped_column(Integer, default=0)
    delivered_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_status: Mapped[int | None] = mapped_column(Integer, nullable=True)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)


class DeliveryAttemptRow(Base):
    """One HTTP attempt of a delivery: when, the status code or the error, how long it took."""

    __tablename__ = "webhook_attempts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    delivery_id: Mapped[int] = mapped_column(ForeignKey("webhook_deliveries.id", ondelete="CASCADE"), index=True)
    at: Mapped[float] = mapped_column(Float)
    duration_ms: Mapped[float] = mapped_column(Float)
    status_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)


class OutboxCursorRow(Base):
    """How far a reader of the events outbox has got (``webhooks``: fanned out up to ``event_id``)."""

    __tablename__ = "outbox_cursors"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    event_id: Mapped[int] = mapped_column(Integer, default=0)


class StandbyRow(Base):
    """A spare node registered for swaps and restarts, per cluster."""

    __tablename__ = "standby_nodes"

    cluster: Mapped[str] = mapped_column(String(128), primary_key=True)
    node: Mapped[str] = mapped_column(String(256), primary_key=True)
    state: Mapped[str] = mapped_column(String(16))  # free | used
    job_id: Mapped[str | None] = mapped_column(String(256), nullable=True)
    added_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)


class GroupSummaryRow(Base):
    """One process group of a job over one time window: what people chart later.

    Written by the persist loop from counters kept at ingest (never a row per op). ``ops`` counts
    op records, one per member rank per collective. In-collective time is ``t_end - t_enter`` on
    each rank's own clock; the percentiles come from ``hist`` (log buckets, four per octave from
    1 us: ``[[bucket, count], ...]``), which is kept so another process can carry on the window.
    """

    __tablename__ = "group_summaries"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    gid: Mapped[str] = mapped_column(String(256), primary_key=True)
    window_start: Mapped[float] = mapped_column(Float, primary_key=True, index=True)
    window_s: Mapped[float] = mapped_column(Float)
    ops: Mapped[int] = mapped_column(BigInteger)
    bytes: Mapped[int] = mapped_column(BigInteger)
    ranks: Mapped[int] = mapped_column(Integer)  # ranks whose batches named the group in the window
    seq_first: Mapped[int] = mapped_column(BigInteger)
    seq_last: Mapped[int] = mapped_column(BigInteger)
    time_sum_s: Mapped[float] = mapped_column(Float)
    time_min_ms: Mapped[float] = mapped_column(Float)
    time_p50_ms: Mapped[float] = mapped_column(Float)
    time_p99_ms: Mapped[float] = mapped_column(Float)
    time_max_ms: Mapped[float] = mapped_column(Float)
    kinds: Mapped[dict[str, Any]] = mapped_column(JSON)
    hist: Mapped[list[Any]] = mapped_column(JSON)
    writer: Mapped[str] = mapped_column(String(64))
    updated_at: Mapped[float] = mapped_column(Float)


class ActionRow(Base):
    """A remediation action (isolate, restart, swap): who asked, why, what was done, how it went.

    ``key`` makes a request idempotent: asking again with the same key returns the same action.
    ``steps`` is the plan and its progress, one entry per step the actuator takes.
    """

    __tablename__ = "actions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    type: Mapped[str] = mapped_column(String(32))
    suspect_id: Mapped[int | None] = mapped_column(
        ForeignKey("suspects.id", ondelete="SET NULL"), nullable=True, index=True
    )
    node: Mapped[str | None] = mapped_column(String(256), nullable=True)
    ranks: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)
    reason: Mapped[str] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(32), index=True)
    steps: Mapped[list[Any]] = mapped_column(JSON)
    actor: Mapped[str] = mapped_column(String(256))
    dry_run: Mapped[bool] = mapped_column(Boolean, default=False)
    key: Mapped[str | None] = mapped_column(String(256), nullable=True, unique=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[float] = mapped_column(Float, index=True)
    updated_at: Mapped[float] = mapped_column(Float, index=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class JobLeaseRow(Base):
    """Which service process analyses a job, until when, and where to forward the job's batches.

    ``epoch`` grows on every change of holder, so a holder can tell that it lost the lease even
    if the same process got it back since.
    """

    __tablename__ = "job_leases"

    job_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    holder: Mapped[str] = mapped_column(String(64))
    holder_url: Mapped[str] = mapped_column(String(512))
    epoch: Mapped[int] = mapped_column(BigInteger)
    acquired_at: Mapped[float] = mapped_column(Float)
    expires_at: Mapped[float] = mapped_column(Float, index=True)
