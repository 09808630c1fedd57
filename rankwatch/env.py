"""Environment variable names and the one place the ranks' ``RANKWATCH`` URL is parsed.

Precedence everywhere is: explicit argument, then environment variable, then default.
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass

from rankwatch.errors import ConfigError

__all__ = [
    "ADMIN_TOKENS_ENV",
    "COLLECTOR_URL_ENV",
    "CONTROL_ENV",
    "DB_ENV",
    "DEFAULT_PORT",
    "DEFAULT_URL",
    "INGEST_TOKENS_ENV",
    "INJECT_ENV",
    "JOB_ENV",
    "NODE_ENV",
    "READ_TOKENS_ENV",
    "CollectorURL",
    "parse_collector_url",
]

COLLECTOR_URL_ENV = "RANKWATCH"
JOB_ENV = "RANKWATCH_JOB"
NODE_ENV = "RANKWATCH_NODE"
CONTROL_ENV = "RANKWATCH_CONTROL"
INJECT_ENV = "RANKWATCH_INJECT"
FLUSH_ENV = "RANKWATCH_FLUSH_S"
RING_MB_ENV = "RANKWATCH_RING_MB"
WIRE_MODE_ENV = "RANKWATCH_WIRE_MODE"
BLOCK_MODE_MIN_WORLD_ENV = "RANKWATCH_BLOCK_MODE_MIN_WORLD"
LOG_ENV = "RANKWATCH_LOG"

DB_ENV = "RANKWATCH_DB"
DATA_DIR_ENV = "RANKWATCH_DATA_DIR"
INGEST_TOKENS_ENV = "RANKWATCH_INGEST_TOKENS"
READ_TOKENS_ENV = "RANKWATCH_READ_TOKENS"
ADMIN_TOKENS_ENV = "RANKWATCH_ADMIN_TOKENS"
TOKENS_FILE_ENV = "RANKWATCH_TOKENS_FILE"
WEBHOOK_ALLOW_ENV = "RANKWATCH_WEBHOOK_ALLOW"
POLICY_ENV = "RANKWATCH_POLICY"
ACTUATOR_ENV = "RANKWATCH_ACTUATOR"

DEFAULT_PORT = 7433
DEFAULT_URL = f"http://127.0.0.1:{DEFAULT_PORT}"

_OFF = ("", "0", "false", "no", "off")


@dataclass(frozen=True, slots=True)
class CollectorURL:
    """Where a rank ships its batches, and the token it sends."""

    base: str
    """Scheme, host and port (and path prefix), without user-info: ``http://host:7433``."""
    token: str | None
    """Bearer token taken from the URL's user-info part, if any."""

    def __repr__(self) -> str:  # never show the token
        return f"CollectorURL(base={self.base!r}, token={'***' if self.token else None})"


def parse_collector_url(value: str | None) -> CollectorURL | None:
    """Parse the value of ``RANKWATCH``.

    ``1``/``true``/``on`` mean the local default; a URL may carry a token as user-info
    (``http://TOKEN@host:7433``). Unset or ``0``/``off`` mean rankwatch is off (``None``).

    Raises:
        ConfigError: the value is neither a switch nor an http(s) URL.
    """
    if value is None or value.strip().lower() in _OFF:
        return None
    value = value.strip()
    if value.lower() in ("1", "true", "yes", "on"):
        value = DEFAULT_URL
    if "://" not in value:
        value = "http://" + value
    parts = urllib.parse.urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{COLLECTOR_URL_ENV} must be 1 or an http(s) URL, not {parts.scheme!r}")
    token = None
    if parts.username:
        token = urllib.parse.unquote(parts.username)
        if parts.password:
            token = f"{token}:{urllib.parse.unquote(parts.password)}"
    host = parts.hostname
    if ":" in host:
        host = f"[{host}]"
    netloc = host if parts.port is None else f"{host}:{parts.port}"
    base = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
    return CollectorURL(base=base, token=token)


def env_flag(name: str, environ: Mapping[str, str] | None = None) -> bool:
    """True when the variable is set to something other than an 'off' word."""
    env = os.environ if environ is None else environ
    return env.get(name, "").strip().lower() not in _OFF
