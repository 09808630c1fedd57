"""Retention: old summaries, resolved suspects, actions and outbox events are deleted.

The collector's loop calls ``purge`` every ``cleanup_interval_s``. Each kind has its own horizon
(``RANKWATCH_RETENTION_*_DAYS``; 0 keeps it forever). What is still open is never deleted: an
active or isolated suspect stays however old it is. Each table is purged in its own transaction,
so one that fails (and is logged) does not hold back the others; several processes sharing a
database may purge at once, since deleting what is already gone is harmless.
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import delete

from rankwatch.collector.db import Database
from rankwatch.collector.models import ActionRow, EventRow, GroupSummaryRow, SuspectRow
from rankwatch.collector.settings import Settings

__all__ = ["purge"]

logger = logging.getLogger(__name__)
DAY_S = 86_400.0


def _plans(settings: Settings, now: float) -> list[tuple[str, float, Any]]:
    """(name, horizon in days, delete statement for rows older than it) per kind."""

    def cutoff(days: float) -> float:
        return now - days * DAY_S

    return [
        (
            "summaries",
            settings.retention_summaries_days,
            delete(GroupSummaryRow).where(
                GroupSummaryRow.window_start + GroupSummaryRow.window_s < cutoff(settings.retention_summaries_days)
            ),
        ),
        (
            "suspects",
            settings.retention_suspects_days,
            delete(SuspectRow).where(
                SuspectRow.status == "resolved", SuspectRow.resolved_at < cutoff(settings.retention_suspects_days)
            ),
        ),
        (
            "actions",
            settings.retention_actions_days,
            delete(ActionRow).where(ActionRow.updated_at < cutoff(settings.retention_actions_days)),
        ),
        (
            "events",
            settings.retention_events_days,
            delete(EventRow).where(EventRow.at < cutoff(settings.retention_events_days)),
        ),
    ]


def purge(db: Database, settings: Settings, now: float) -> dict[str, int]:
    """Delete what is past its retention; returns how many rows of each kind went."""
    out: dict[str, int] = {}
    for name, days, stmt in _plans(settings, now):
        if days <= 0:
            continue
        try:
            with db.sessions.begin() as s:
                result: Any = s.execute(stmt.execution_options(synchronize_session=False))
                out[name] = int(result.rowcount or 0)
        except Exception:
            logger.exception("retention: purging old %s failed", name)
    if any(out.values()):
        logger.info("retention: deleted %s", ", ".join(f"{n} {k}" for k, n in out.items() if n))
    return out
