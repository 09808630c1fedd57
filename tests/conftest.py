"""Fixtures over ``support``: a real service per test, a torchrun runner in the test's tmp dir, and
the database URL storage and API tests run against (SQLite and PostgreSQL, each test on both)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pgserver import PgServer
from support import Run, Service, start_service, torchrun


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    svc = start_service(tmp_path)
    yield svc
    svc.stop()


@pytest.fixture
def run_torchrun(tmp_path: Path) -> Any:
    def run(script: str | Path, *args: str, **kw: Any) -> Run:
        return torchrun(tmp_path, script, *args, **kw)

    return run


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """The session's PostgreSQL server, started on first use (see ``pgserver.py``)."""
    server = PgServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty database for one test: SQLite in its tmp dir, or a new PostgreSQL database."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'data' / 'rankwatch.db'}"
        return
    pg: PgServer = request.getfixturevalue("pg_server")
    name = pg.create_database()
    yield pg.url(name)
    pg.drop_database(name)
