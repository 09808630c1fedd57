"""Engines, sessions and schema upgrades for SQLite (default) and PostgreSQL.

SQLite runs in WAL mode with ``synchronous=NORMAL``: a committed transaction survives the
process being killed. ``open_database`` upgrades the schema with Alembic before anything else
touches it, so ``rankwatch serve`` always runs on the current schema.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

__all__ = ["Database", "open_database", "upgrade_schema"]

logger = logging.getLogger(__name__)
MIGRATIONS = Path(__file__).with_name("migrations")


class Database:
    """An engine and its session factory."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.sessions: sessionmaker[Session] = sessionmaker(engine, expire_on_commit=False)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def close(self) -> None:
        self.engine.dispose()


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA busy_timeout=10000")
    cur.close()


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    if url.startswith("postgresql"):
        try:
            import psycopg  # noqa: F401
        except ImportError as exc:
            from rankwatch.errors import MissingExtraError

            raise MissingExtraError("PostgreSQL storage", "postgres") from exc
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)


def upgrade_schema(engine: Engine) -> None:
    """Bring the schema to the newest migration (idempotent)."""
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")


def open_database(url: str) -> Database:
    """Connect, upgrade the schema, and return the database."""
    engine = make_engine(url)
    upgrade_schema(engine)
    return Database(engine)
