"""Bearer tokens with three scopes: ``ingest`` (ranks), ``read`` (dashboards), ``admin`` (changes).

Tokens come from ``RANKWATCH_INGEST_TOKENS``/``READ_TOKENS``/``ADMIN_TOKENS`` (comma-separated)
and from ``RANKWATCH_TOKENS_FILE``, re-read whenever it changes, so tokens rotate without a
restart. File lines: ``<scope> <token> [job=<job id>]``; ``#`` starts a comment. A job-bound
ingest token can only send batches for that job. An admin token may also read. With no tokens
configured anywhere, everything is open (and ``rankwatch serve`` binds only to loopback).
Comparison is constant-time; tokens are never logged.
"""

from __future__ import annotations

import hmac
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from rankwatch.collector.settings import Settings
from rankwatch.errors import AuthError, ConfigError

__all__ = ["SCOPES", "Principal", "TokenStore"]

logger = logging.getLogger(__name__)
SCOPES = ("ingest", "read", "admin")


@dataclass(frozen=True, slots=True)
class Principal:
    """Who made a request: the scope of their token and the job an ingest token is bound to."""

    scope: str
    job: str | None = None
    anonymous: bool = False

    def __repr__(self) -> str:
        return f"Principal(scope={self.scope!r}, job={self.job!r}, anonymous={self.anonymous})"


class TokenStore:
    """The tokens the service accepts, from settings and an optional file."""

    def __init__(self, settings: Settings) -> None:
        self._static: list[tuple[str, str, str | None]] = [
            *(("ingest", t, None) for t in settings.ingest_tokens),
            *(("read", t, None) for t in settings.read_tokens),
            *(("admin", t, None) for t in settings.admin_tokens),
        ]
        self._file = settings.tokens_file
        self._file_tokens: list[tuple[str, str, str | None]] = []
        self._mtime: float | None = None
        self._lock = threading.Lock()
        if self._file is not None:
            self._reload(force=True)

    @property
    def open(self) -> bool:
        """No tokens configured: every route is open."""
        return not self._static and self._file is None

    def _reload(self, force: bool = False) -> None:
        assert self._file is not None
        try:
            mtime = os.stat(self._file).st_mtime_ns
        except OSError:
            if force:
                raise ConfigError(f"tokens file {self._file} cannot be read") from None
            return
        if not force and mtime == self._mtime:
            return
        with self._lock:
            self._file_tokens = _parse_file(Path(self._file))
            self._mtime = mtime
            logger.info("tokens file re-read: %d tokens", len(self._file_tokens))

    def authenticate(self, header: str | None, need: str) -> Principal:
        """The principal for an ``Authorization`` header, if it grants scope ``need``.

        Raises:
            AuthError: 401 without a known token, 403 with a token of another scope.
        """
        if self.open:
            return Principal(scope="admin", anonymous=True)
        if self._file is not None:
            self._reload()
        token = _bearer(header)
        if token is None:
            raise AuthError(f"this route needs a token with the {need!r} scope (Authorization: Bearer ...)", status=401)
        found: tuple[str, str, str | None] | None = None
        for entry in (*self._static, *self._file_tokens):  # compare with every token: constant time
            if hmac.compare_digest(entry[1].encode(), token.encode()) and (
                found is None or _rank(entry[0]) > _rank(found[0])
            ):
                found = entry
        if found is None:
            raise AuthError(f"unknown token; this route needs the {need!r} scope", status=401)
        scope, _, job = found
        if scope == need or (scope == "admin" and need == "read"):
            return Principal(scope=scope, job=job)
        raise AuthError(f"this token has the {scope!r} scope; this route needs {need!r}", status=403)


def _rank(scope: str) -> int:
    return {"ingest": 0, "read": 1, "admin": 2}.get(scope, -1)


def _bearer(header: str | None) -> str | None:
    if not header:
        return None
    kind, _, value = header.partition(" ")
    if kind.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


def _parse_file(path: Path) -> list[tuple[str, str, str | None]]:
    out: list[tuple[str, str, str | None]] = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) < 2 or parts[0] not in SCOPES:
            logger.warning("tokens file line %d ignored: expected '<scope> <token> [job=<id>]'", n)
            continue
        job = None
        for extra in parts[2:]:
            if extra.startswith("job="):
                job = extra[4:]
        out.append((parts[0], parts[1], job))
    return out
