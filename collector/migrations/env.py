"""Alembic environment: runs on the connection ``rankwatch.collector.db.upgrade_schema`` passes in."""

from __future__ import annotations

from alembic import context

from rankwatch.collector.models import Base

connection = context.config.attributes.get("connection")
if connection is None:  # pragma: no cover - only through upgrade_schema
    raise RuntimeError("run migrations through rankwatch.collector.db.upgrade_schema")
context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
