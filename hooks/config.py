"""The hooks' settings, read once from the environment of the training process."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from rankwatch.env import (
    BLOCK_MODE_MIN_WORLD_ENV,
    COLLECTOR_URL_ENV,
    CONTROL_ENV,
    FLUSH_ENV,
    INJECT_ENV,
    RING_MB_ENV,
    WIRE_MODE_ENV,
    CollectorURL,
    env_flag,
    parse_collector_url,
)
from rankwatch.errors import ConfigError

__all__ = ["HooksConfig"]

WIRE_MODES = ("auto", "raw", "blocks")
BLOCK_MODE_MIN_WORLD = 1024
"""In ``auto`` wire mode, jobs of at least this many ranks send block summaries."""

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
    wire_mode: str = "auto"
    """``raw`` records, ``blocks`` summaries, or ``auto``: blocks from ``block_min_world`` ranks
    (``RANKWATCH_WIRE_MODE``)."""
    block_min_world: int = BLOCK_MODE_MIN_WORLD
    """World size from which ``auto`` sends blocks (``RANKWATCH_BLOCK_MODE_MIN_WORLD``)."""
    block_s: float = 0.2
    """About how long one block spans (the detector's ``raw_block_s``: both modes cut alike)."""

    def blocks_for(self, world: int) -> bool:
        """Whether a job of ``world`` ranks ships block summaries."""
        return self.wire_mode == "blocks" or (self.wire_mode == "auto" and world >= self.block_min_world)

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
            wire_mode=_choice(env, WIRE_MODE_ENV, WIRE_MODES),
            block_min_world=int(_positive(env, BLOCK_MODE_MIN_WORLD_ENV, BLOCK_MODE_MIN_WORLD)),
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


def _choice(env: Mapping[str, str], name: str, choices: tuple[str, ...]) -> str:
    raw = (env.get(name) or choices[0]).strip().lower()
    if raw not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(choices)}, not {raw!r}")
    return raw
