"""A throwaway PostgreSQL server on loopback, for the storage and API tests.

``initdb`` + ``pg_ctl`` into a temporary directory, listening on 127.0.0.1 on a free port, with a
fresh database per test. The test command (``scripts/test.sh``) installs Debian's ``postgresql``
package when it is missing; when the server binaries still cannot be found the tests fail, they
do not skip. ``RANKWATCH_TEST_PG_URL`` (a superuser URL) points the tests at a server of your own
instead. Running as root, the server runs as the ``postgres`` user, since PostgreSQL refuses root.

``fsync`` is off: these tests kill rankwatch, never PostgreSQL, and a committed transaction is
visible to every later connection whether or not it reached the disk.
"""

from __future__ import annotations

import glob
import itertools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from support import free_port

PG_URL_ENV = "RANKWATCH_TEST_PG_URL"
_names = itertools.count(1)


def _bindir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(p.split("/")[4]))
    if found:
        return Path(found[-1]).parent
    pg_ctl = shutil.which("pg_ctl")
    return Path(pg_ctl).parent if pg_ctl else None


class PgServer:
    """One PostgreSQL server for the test session, and a database per test."""

    def __init__(self) -> None:
        self.external = os.environ.get(PG_URL_ENV)
        self.root: Path | None = None
        self.port = 0
        self._as: list[str] = []

    def start(self) -> None:
        if self.external:
            return
        bindir = _bindir()
        if bindir is None:
            raise RuntimeError(
                "PostgreSQL server binaries not found: run scripts/test.sh (it installs Debian's postgresql "
                f"package), or apt-get install postgresql, or set {PG_URL_ENV}"
            )
        self.root = Path(tempfile.mkdtemp(prefix="rankwatch-pg-"))
        if os.geteuid() == 0:
            shutil.chown(self.root, user="postgres")
            self._as = ["runuser", "-u", "postgres", "--"]
        data, log = self.root / "data", self.root / "server.log"
        self._run(
            str(bindir / "initdb"),
            "-D",
            str(data),
            "-A",
            "trust",
            "-U",
            "postgres",
            "-E",
            "UTF8",
            "--no-locale",
            "--no-sync",
        )
        self.port = free_port()
        options = f"-h 127.0.0.1 -p {self.port} -k {self.root} -c fsync=off -c max_connections=300"
        self._run(str(bindir / "pg_ctl"), "-D", str(data), "-l", str(log), "-w", "-t", "60", "-o", options, "start")
        self._bindir = bindir

    def _run(self, *cmd: str) -> None:
        proc = subprocess.run([*self._as, *cmd], capture_output=True, text=True, cwd=self.root)
        if proc.returncode != 0:
            log = (self.root / "server.log") if self.root else None
            extra = log.read_text()[-2000:] if log is not None and log.exists() else ""
            raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}\n{extra}")

    def stop(self) -> None:
        if self.root is None:
            return
        try:
            self._run(str(self._bindir / "pg_ctl"), "-D", str(self.root / "data"), "-m", "immediate", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    def url(self, dbname: str = "postgres") -> str:
        """A URL as a user gives it to ``rankwatch serve --db``."""
        if self.external:
            base = self.external.rsplit("/", 1)[0]
            return f"{base}/{dbname}"
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def _admin(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(sql)  # type: ignore[arg-type]

    def create_database(self) -> str:
        name = f"rw_test_{os.getpid()}_{next(_names)}"
        self._admin(f'CREATE DATABASE "{name}"')
        return name

    def drop_database(self, name: str) -> None:
        self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
