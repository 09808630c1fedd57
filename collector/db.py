"""Engines, sessions and schema upgrades for SQLite (default) and PostgreSQL.

SQLite runs in WAL mode with ``synchronous=NORMAL``: a committed transaction survives the
process being killed. Write transactions (``db.sessions.begin()``) start with ``BEGIN
IMMEDIATE``, so two writers (the persist loop and the lease thread, or two processes on one
file) queue on the lock instead of one failing halfway on a stale snapshot; reads
(``db.sessions()``) begin as usual and never wait for a writer. ``open_database`` upgrades the schema
with Alembic before anything else touches it, so ``rankwatch serve`` always runs on the current
schema. ``upsert`` writes many rows in one statement on either database.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from sqlalchemy import JSON, Engine, Table, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

__all__ = ["Database", "Sessions", "open_database", "upgrade_schema", "upsert"]

logger = logging.getLogger(__name__)
MIGRATIONS = Path(__file__).with_name("migrations")
_WAL_SWITCH_S = 10.0  # as long as busy_timeout: how long opening a file another process is switching may wait


class Sessions:
    """``sessions()`` for reading, ``sessions.begin()`` for a transaction that writes.

    The two differ on SQLite only: a writing transaction takes the write lock when it begins.
    """

    def __init__(self, engine: Engine) -> None:
        self._read: sessionmaker[Session] = sessionmaker(engine, expire_on_commit=False)
        self._write: sessionmaker[Session] = sessionmaker(
            engine.execution_options(rankwatch_write=True), expire_on_commit=False
        )

    def __call__(self) -> Session:
        return self._read()

    def begin(self) -> AbstractContextManager[Session]:
        return self._write.begin()


class Database:
    """An engine and its sessions."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.sessions = Sessions(engine)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def close(self) -> None:
        self.engine.dispose()


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    import sqlite3

    dbapi_conn.isolation_level = None  # SQLAlchemy's "begin" event below emits BEGIN itself
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA busy_timeout=10000")
    # Switching a new file to WAL needs the file to itself, and SQLite reports "database is
    # locked" at once (without its busy handler) when another process or connection is opening
    # or switching the same file at that moment. WAL is a property of the file and stays, so:
    # try again until the file is in WAL, by our switch or another's, for as long as busy_timeout.
    deadline = time.monotonic() + _WAL_SWITCH_S
    delay = 0.005
    while True:
        try:
            cur.execute("PRAGMA journal_mode=WAL")
            break
        except sqlite3.OperationalError:
            try:
                if cur.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal":
                    break
            except sqlite3.OperationalError:
                pass
            if time.monotonic() >= deadline:
                raise
            time.sleep(delay)
            delay = min(0.2, delay * 2)
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def _sqlite_begin(conn: Any) -> None:
    conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get("rankwatch_write") else "BEGIN")


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        event.listen(engine, "connect", _sqlite_pragmas)
        event.listen(engine, "begin", _sqlite_begin)
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

    Both SQLite (3.24+) and PostgreSQL spell this ``INSERT ... ON CONFLICT DO UPDATE``. The
    statement goes to the driver's ``executemany`` as it is, with JSON columns encoded here:
    the persist loop writes thousands of rows a pass, and SQLAlchemy's per-row parameter
    processing cost it more than the database did (it also held the GIL the event loop needs).
    """
    if not rows:
        return
    dialect = session.get_bind().dialect.name
    cols = tuple(rows[0])
    keys = tuple(c.name for c in table.primary_key.columns)
    sets = tuple(update if update is not None else [c for c in cols if c not in keys])
    sql = _upsert_sql(dialect, table, cols, keys, sets)
    json_cols = [c for c in cols if isinstance(table.c[c].type, JSON)]
    if json_cols:
        rows = [r | {c: None if r[c] is None else json.dumps(r[c]) for c in json_cols} for r in rows]
    session.connection().exec_driver_sql(sql, rows)  # type: ignore[arg-type]


@functools.lru_cache(maxsize=64)
def _upsert_sql(dialect: str, table: Table, cols: tuple[str, ...], keys: tuple[str, ...], sets: tuple[str, ...]) -> str:
    if dialect not in ("sqlite", "postgresql"):  # pragma: no cover - only these two are supported
        raise NotImplementedError(f"upsert on {dialect}")

    def value(c: str) -> str:
        if dialect == "sqlite":
            return f":{c}"
        return f"%({c})s::json" if isinstance(table.c[c].type, JSON) else f"%({c})s"

    names = ", ".join(f'"{c}"' for c in cols)
    values = ", ".join(value(c) for c in cols)
    assign = ", ".join(f'"{c}" = excluded."{c}"' for c in sets)
    conflict = ", ".join(f'"{k}"' for k in keys)
    return f'INSERT INTO "{table.name}" ({names}) VALUES ({values}) ON CONFLICT ({conflict}) DO UPDATE SET {assign}'


MIGRATION_LOCK = 0x72616E6B  # "rank": the advisory lock several processes starting at once queue on


def upgrade_schema(engine: Engine) -> None:
    """Bring the schema to the newest migration (idempotent). Several processes starting at once
    on one database take turns: the first upgrades, the others find nothing left to do."""
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with engine.execution_options(rankwatch_write=True).begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK})")
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")


def open_database(url: str) -> Database:
    """Connect, upgrade the schema, and return the database."""
    engine = make_engine(url)
    upgrade_schema(engine)
    return Database(engine)
