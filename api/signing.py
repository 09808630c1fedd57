"""Standard Webhooks signatures (https://www.standardwebhooks.com, spec v1): sign, verify, make secrets.

A message carries ``webhook-id`` (the same on every retry and replay: the receiver's idempotency
key), ``webhook-timestamp`` (unix seconds of this attempt) and ``webhook-signature``:
``v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">``, keyed by the secret's base64-decoded
bytes (secrets look like ``whsec_<base64>``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import time
from collections.abc import Mapping

__all__ = ["SECRET_PREFIX", "check_secret", "generate_secret", "sign", "signature_headers", "verify"]

SECRET_PREFIX = "whsec_"
TOLERANCE_S = 300


def generate_secret() -> str:
    """A fresh secret: ``whsec_`` and 32 random bytes in base64."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def _key(secret: str) -> bytes:
    body = secret[len(SECRET_PREFIX) :] if secret.startswith(SECRET_PREFIX) else secret
    return base64.b64decode(body + "=" * (-len(body) % 4), validate=True)


def check_secret(secret: str) -> str:
    """A secret as given by a user, if it is ``whsec_`` and 24 to 64 base64-encoded bytes.

    Raises:
        ValueError: it is not.
    """
    if not secret.startswith(SECRET_PREFIX):
        raise ValueError(f"a webhook secret starts with {SECRET_PREFIX!r} followed by base64 (24 to 64 bytes)")
    try:
        n = len(_key(secret))
    except (binascii.Error, ValueError):
        raise ValueError("a webhook secret's part after 'whsec_' must be base64") from None
    if not 24 <= n <= 64:
        raise ValueError(f"a webhook secret must encode 24 to 64 bytes, not {n}")
    return secret


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value for one attempt: ``v1,<base64>``."""
    mac = hmac.new(_key(secret), f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def signature_headers(secret: str | None, msg_id: str, body: bytes, now: float | None = None) -> dict[str, str]:
    """``webhook-id``, ``webhook-timestamp`` and (with a secret) ``webhook-signature`` for one attempt."""
    ts = int(time.time() if now is None else now)
    headers = {"webhook-id": msg_id, "webhook-timestamp": str(ts)}
    if secret:
        headers["webhook-signature"] = sign(secret, msg_id, ts, body)
    return headers


def verify(
    secret: str, headers: Mapping[str, str], body: bytes, *, now: float | None = None, tolerance_s: int = TOLERANCE_S
) -> bool:
    """Whether a message is signed with ``secret`` and recent (what a receiver does; see the README)."""
    h = {k.lower(): v for k, v in headers.items()}
    msg_id, ts, sigs = h.get("webhook-id"), h.get("webhook-timestamp"), h.get("webhook-signature")
    if not (msg_id and ts and sigs and ts.isdigit()):
        return False
    if abs((time.time() if now is None else now) - int(ts)) > tolerance_s:
        return False
    expected = sign(secret, msg_id, int(ts), body)
    return any(hmac.compare_digest(expected, s) for s in sigs.split())
