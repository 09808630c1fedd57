"""Engines, sessions and schema upgrades for SQLite (default) and PostgreSQL.

SQLite runs in WAL mode with ``synchronous=NORMAL``: a committed transaction survives the
process being killed. Its transactions start with ``BEGIN IMMEDIATE``, so two writers (the
persist loop and the lease thread, or two processes on one file) queue on the lock instead of
one of them failing mid-transaction on a stale snapshot. ``open_database`` upgrades the schema
with Alembic before anything else touches it, so ``rankwatch serve`` always runs on the current
schema. ``upsert`` writes many rows in one statement on either database.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, Table, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

__all__ = ["Database", "open_database", "upgrade_schema", "upsert"]

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
    dbapi_conn.isolation_level = None  # SQLAlchemy's "begin" event below emits BEGIN itself
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA busy_timeout=10000")
    cur.close()


def _sqlite_begin_immediate(conn: Any) -> None:
    conn.exec_driver_sql("BEGIN IMMEDIATE")


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        event.listen(engine, "connect", _sqlite_pragmas)
        event.listen(engine, "begin", _sqlite_begin_immediate)
        return engine
    if url.startswith("postgresql"):
        try:
            import psycopg  # noqa: F401
        except ImportError as exc:
            from rankwatch.errors import MissingExtraError

            raise MissingExtraError("PostgreSQL storage", "postgres") from exc
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)


def upsert(session: Session, table: Table, rows: list[dict[str, Any]], *, update: list[str] | None = None) -> None:
    """Insert ``rows`` into ``table``, or update the columns ``update`` (default: all but the key)
    where a row with the same primary key exists; one statement, executed for all rows at once.

    Both SQLite (3.24+) and PostgreSQL spell this ``INSERT ... ON CONFLICT DO UPDATE``.
    """
    if not rows:
        return
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        stmt: Any = pg_insert(table)
    elif dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        stmt = sqlite_insert(table)
    else:  # pragma: no cover - only SQLite and PostgreSQL are supported
        raise NotImplementedError(f"upsert on {dialect}")
    keys = [c.name for c in table.primary_key.columns]
    cols = update if update is not None else [c for c in rows[0] if c not in keys]
    stmt = stmt.on_conflict_do_update(index_elements=keys, set_={c: stmt.excluded[c] for c in cols})
    session.execute(stmt, rows)


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
