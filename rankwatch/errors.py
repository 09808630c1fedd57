"""Every exception rankwatch raises on purpose, in one place.

    RankwatchError                 base of everything below
    ├── ConfigError                a setting or environment variable has a bad value
    ├── WireError                  a batch is malformed (the collector answers 400 with the message)
    ├── InjectSpecError            RANKWATCH_INJECT cannot be parsed
    ├── AuthError                  no token, or not one with the scope the route needs (401/403)
    ├── UnsafeURLError             (also a ValueError) a webhook URL the SSRF guard refuses
    └── MissingExtraError          (also an ImportError) an optional extra is not installed

The service maps these to HTTP in one place (``rankwatch.api``); the hooks never let any of them
reach training code.
"""

from __future__ import annotations

__all__ = [
    "AuthError",
    "ConfigError",
    "InjectSpecError",
    "MissingExtraError",
    "RankwatchError",
    "UnsafeURLError",
    "WireError",
]


class RankwatchError(Exception):
    """Base class of rankwatch's own errors."""


class ConfigError(RankwatchError, ValueError):
    """A setting or environment variable has a value rankwatch cannot use."""


class WireError(RankwatchError, ValueError):
    """A batch does not follow the wire format; the message says what is wrong."""


class InjectSpecError(ConfigError):
    """``RANKWATCH_INJECT`` does not follow the documented syntax."""


class MissingExtraError(RankwatchError, ImportError):
    """An optional dependency is missing; the message names the ``pip install`` to run."""

    def __init__(self, what: str, extra: str) -> None:
        super().__init__(f"{what} needs an optional dependency: pip install 'rankwatch[{extra}]'")


class UnsafeURLError(RankwatchError, ValueError):
    """A webhook URL is malformed, or reaches an address the SSRF guard refuses; the message says which."""


class AuthError(RankwatchError):
    """A request lacks a token with the scope a route needs (401) or has the wrong one (403)."""

    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message)
        self.status = status
