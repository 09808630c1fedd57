"""Suspects in the database: opened when the detector first blames someone, resolved when it stops.

``SuspectStore.reconcile`` turns one analysis pass's findings into database changes: a new finding
opens a suspect, a finding that persists updates it, and an active suspect the detector no longer
reports is resolved — but only once the detector says it has analysed enough fresh data
(``ready``), so a service restart never pages a false "resolved". Every open and resolve writes
its history row and an outbox event in the same transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from rankwatch.collector.db import Database
from rankwatch.collector.jobs import iso
from rankwatch.collector.models import EventRow, SuspectHistoryRow, SuspectRow

__all__ = ["KINDS", "LEVELS", "STATUSES", "SuspectStore", "suspect_public"]

logger = logging.getLogger(__name__)

KINDS = ("noncomm_slow", "comm_slow", "noncomm_hang", "comm_hang", "rank_dead")
LEVELS = ("rank", "node", "link")
STATUSES = ("active", "resolved", "isolated")
UPDATE_EVERY_S = 5.0
OPEN = ("active", "isolated")


def suspect_public(row: SuspectRow, history: Sequence[SuspectHistoryRow] | None = None) -> dict[str, Any]:
    """A suspect as the API shows it."""
    out: dict[str, Any] = {
        "id": row.id,
        "job_id": row.job_id,
        "kind": row.kind,
        "level": row.level,
        "ranks": row.ranks,
        "nodes": row.nodes,
        "link": row.link,
        "status": row.status,
        "first_seen": iso(row.first_seen),
        "detected_at": iso(row.detected_at),
        "updated_at": iso(row.updated_at),
        "resolved_at": iso(row.resolved_at),
        "score": round(row.score, 4),
        "slowdown": None if row.slowdown is None else round(row.slowdown, 4),
        "peak_slowdown": None if row.peak_slowdown is None else round(row.peak_slowdown, 4),
        "detection_latency_s": round(row.detected_at - row.first_seen, 3),
        "evidence": row.evidence,
    }
    if history is not None:
        out["history"] = [
            {
                "at": iso(h.at),
                "event": h.event,
                "status": h.status,
                "score": round(h.score, 4),
                "slowdown": h.slowdown,
                "note": h.note,
            }
            for h in history
        ]
    return out


def mark(s: Session, row: SuspectRow, status: str, now: float, note: str) -> None:
    """Set a suspect's status inside ``s``'s transaction, with its history and an outbox event."""
    row.status = status
    row.updated_at = now
    if status == "resolved":
        row.resolved_at = now
    s.add(_history(row, now, status, note))
    _event(s, row, now, f"suspect.{status}")


class SuspectStore:
    """Reads and writes suspects; one per service process."""

    def __init__(self, db: Database, actions: Any = None) -> None:
        self.db = db
        self.actions = actions  # an ActionBook: plans what the job's policy says for a new suspect

    def reconcile(
        self,
        job_id: str,
        findings: Sequence[Any],
        ready: bool,
        now: float,
        *,
        guard: Callable[[Session], bool] | None = None,
    ) -> list[dict[str, Any]]:
        """Apply one analysis pass for a job; returns the events it wrote (opened/resolved).

        ``guard``, run first inside the transaction, may veto it (this process lost the job's
        lease): then nothing is written.
        """
        events: list[dict[str, Any]] = []
        with self.db.sessions.begin() as s:
            if guard is not None and not guard(s):
                return []
            open_rows = {
                r.key: r
                for r in s.scalars(select(SuspectRow).where(SuspectRow.job_id == job_id, SuspectRow.status.in_(OPEN)))
            }
            seen: set[str] = set()
            for f in findings:
                seen.add(f.key)
                row = open_rows.get(f.key)
                if row is None:
                    row = _new_row(job_id, f, now)
                    s.add(row)
                    s.flush()
                    s.add(_history(row, now, "opened"))
                    events.append(_event(s, row, now, "suspect.opened"))
                    if self.actions is not None:
                        self.actions.plan(s, row, events[-1]["suspect"], now)
                elif now - row.updated_at >= UPDATE_EVERY_S or _changed(row, f):
                    _update(row, f, now)
            if ready:
                for key, row in open_rows.items():
                    if key in seen or row.status != "active":
                        continue
                    row.status = "resolved"
                    row.resolved_at = now
                    row.updated_at = now
                    s.add(_history(row, now, "resolved", "the detector no longer reports it"))
                    events.append(_event(s, row, now, "suspect.resolved"))
        for e in events:
            logger.info("%s: suspect %s %s in job %s", e["type"], e["suspect"]["id"], e["suspect"]["kind"], job_id)
        return events

    def set_status(self, suspect_id: int, status: str, now: float, note: str) -> dict[str, Any] | None:
        """Mark a suspect (e.g. ``isolated`` once its node is drained), with history and an event."""
        with self.db.sessions.begin() as s:
            row = s.get(SuspectRow, suspect_id)
            if row is None:
                return None
            mark(s, row, status, now, note)
            return suspect_public(row)

    def attach_flight_recorder(self, suspect_id: int, dumps: dict[str, Any]) -> None:
        with self.db.sessions.begin() as s:
            row = s.get(SuspectRow, suspect_id)
            if row is not None:
                row.flight_recorder = dumps

    def list(
        self, *, job_id: str | None = None, status: str | None = None, kind: str | None = None, limit: int = 500
    ) -> list[dict[str, Any]]:
        q = select(SuspectRow).order_by(SuspectRow.detected_at.desc()).limit(limit)
        if job_id is not None:
            q = q.where(SuspectRow.job_id == job_id)
        if status is not None:
            q = q.where(SuspectRow.status == status)
        if kind is not None:
            q = q.where(SuspectRow.kind == kind)
        with self.db.sessions() as s:
            return [suspect_public(r) for r in s.scalars(q)]

    def get(self, suspect_id: int) -> dict[str, Any] | None:
        with self.db.sessions() as s:
            row = s.get(SuspectRow, suspect_id)
            if row is None:
                return None
            history = list(
                s.scalars(
                    select(SuspectHistoryRow)
                    .where(SuspectHistoryRow.suspect_id == suspect_id)
                    .order_by(SuspectHistoryRow.id)
                )
            )
            return suspect_public(row, history)

    def flight_recorder(self, suspect_id: int) -> dict[str, Any] | None:
        with self.db.sessions() as s:
            row = s.get(SuspectRow, suspect_id)
            return None if row is None else (row.flight_recorder or {})

    def open_keys(self, job_id: str) -> dict[str, int]:
        with self.db.sessions() as s:
            rows = s.execute(
                select(SuspectRow.key, SuspectRow.id).where(SuspectRow.job_id == job_id, SuspectRow.status.in_(OPEN))
            )
            return {k: i for k, i in rows}


def _new_row(job_id: str, f: Any, now: float) -> SuspectRow:
    slowdown = _num(f.slowdown)
    return SuspectRow(
        job_id=job_id,
        key=f.key,
        kind=f.kind,
        level=f.level,
        ranks=[int(r) for r in f.ranks],
        nodes=[str(n) for n in f.nodes],
        link=list(f.link) if f.link else None,
        status="active",
        first_seen=float(min(f.first_seen, now)),
        detected_at=now,
        updated_at=now,
        score=float(f.score),
        slowdown=slowdown,
        peak_slowdown=slowdown,
        evidence=_jsonable(f.evidence),
    )


def _update(row: SuspectRow, f: Any, now: float) -> None:
    slowdown = _num(f.slowdown)
    row.score = float(f.score)
    row.slowdown = slowdown
    if slowdown is not None and (row.peak_slowdown is None or slowdown > row.peak_slowdown):
        row.peak_slowdown = slowdown
    row.evidence = _jsonable(f.evidence)
    row.ranks = [int(r) for r in f.ranks]
    row.nodes = [str(n) for n in f.nodes]
    row.updated_at = now


def _changed(row: SuspectRow, f: Any) -> bool:
    return sorted(row.ranks) != sorted(int(r) for r in f.ranks) or abs(row.score - float(f.score)) > 0.2


def _history(row: SuspectRow, now: float, event: str, note: str | None = None) -> SuspectHistoryRow:
    return SuspectHistoryRow(
        suspect_id=row.id, at=now, event=event, status=row.status, score=row.score, slowdown=row.slowdown, note=note
    )


def _event(s: Any, row: SuspectRow, now: float, kind: str) -> dict[str, Any]:
    s.flush()
    payload = {"type": kind, "suspect": suspect_public(row)}
    s.add(EventRow(at=now, type=kind, job_id=row.job_id, suspect_id=row.id, payload=payload))
    return payload


def _num(v: Any) -> float | None:
    if v is None:
        return None
    v = float(v)
    return v if v == v and v not in (float("inf"), float("-inf")) else None


def _jsonable(obj: Any) -> Any:
    """Evidence as plain JSON (numpy scalars and arrays, tuples, sets, NaN made safe)."""
    import math

    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set)):
        return [_jsonable(v) for v in obj]
    if hasattr(obj, "tolist"):
        return _jsonable(obj.tolist())
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, (int, str, bool)) or obj is None:
        return obj
    if hasattr(obj, "item"):
        return _jsonable(obj.item())
    return str(obj)
