"""The hooks' settings, read once from the environment of the training process."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from rankwatch.env import (
    COLLECTOR_URL_ENV,
    CONTROL_ENV,
    FLUSH_ENV,
    INJECT_ENV,
    RING_MB_ENV,
    CollectorURL,
    env_flag,
    parse_collector_url,
)
from rankwatch.errors import ConfigError

__all__ = ["HooksConfig"]

RECORD_COST_BYTES = 320
"""What one record costs in the ring: a 9-tuple and its ints, measured with tracemalloc."""


@dataclass(frozen=True, kw_only=True, slots=True)
class HooksConfig:
    """How the hooks in one rank behave."""

    collector: CollectorURL
    """Where batches go (``RANKWATCH``), with the token from its user-info."""
    flush_s: float = 1.0
    """Seconds between batches (``RANKWATCH_FLUSH_S``); every batch is also a heartbeat."""
    ring_mb: float = 64.0
    """Memory bound of the record ring (``RANKWATCH_RING_MB``); the oldest records drop beyond it."""
    control: bool = False
    """Whether commands that act on the job (exit) are honoured (``RANKWATCH_CONTROL=1``)."""
    inject: str = ""
    """Fault-injection spec for tests and demos (``RANKWATCH_INJECT``)."""
    timeout_s: float = 5.0
    """HTTP timeout for one batch; a hanging collector costs the shipper thread this, never training."""
    stack_after_s: float = 2.0
    """An op in flight (or no new op entered) this long, and slow for its group, sends the stack."""

    @property
    def ring_records(self) -> int:
        return max(1024, int(self.ring_mb * 1024 * 1024 / RECORD_COST_BYTES))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> HooksConfig | None:
        """The configuration, or None when ``RANKWATCH`` is unset or off.

        Raises:
            ConfigError: a variable is set to a value that cannot be used.
        """
        env = os.environ if environ is None else environ
        url = parse_collector_url(env.get(COLLECTOR_URL_ENV))
        if url is None:
            return None
        return cls(
            collector=url,
            flush_s=_positive(env, FLUSH_ENV, 1.0),
            ring_mb=_positive(env, RING_MB_ENV, 64.0),
            control=env_flag(CONTROL_ENV, env),
            inject=env.get(INJECT_ENV, ""),
        )


def _positive(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number, not {raw!r}") from None
    if value <= 0:
        raise ConfigError(f"{name} must be positive, not {raw!r}")
    return value
