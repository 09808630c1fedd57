"""Several ranks' batches in one request: what ``rankwatch agent`` sends the collector.

Each batch inside stays exactly as its rank encoded it, so the collector validates and
de-duplicates every rank's batch on its own, and answers each one separately::

    offset  size  what
    0       4     magic b"RWM\\x00"
    4       2     format version, little-endian (``MULTI_VERSION``)
    6       2     flags (none defined: 0)
    8       4     number K of batches
    12      ...   K times: a 4-byte little-endian length L, then L bytes of one batch (wire format)

The reply is JSON, ``{"results": [...]}``, one entry per batch in order: the reply the rank
would have had on its own (``accepted``, ``duplicate``, ``commands``, or ``detail``), plus its
HTTP ``status``.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from rankwatch.errors import WireError

__all__ = ["MULTI_CONTENT_TYPE", "MULTI_MAGIC", "MULTI_VERSION", "decode_multi", "encode_multi"]

MULTI_MAGIC = b"RWM\x00"
MULTI_VERSION = 1
MULTI_CONTENT_TYPE = "application/vnd.rankwatch.multibatch"
MAX_ITEMS = 16_384

_HEAD = struct.Struct("<4sHHI")
_LEN = struct.Struct("<I")


def encode_multi(batches: Sequence[bytes]) -> bytes:
    """Frame encoded batches into one multi-batch body."""
    if len(batches) > MAX_ITEMS:
        raise ValueError(f"{len(batches)} batches; a multi-batch holds at most {MAX_ITEMS}")
    parts = [_HEAD.pack(MULTI_MAGIC, MULTI_VERSION, 0, len(batches))]
    for b in batches:
        parts.append(_LEN.pack(len(b)))
        parts.append(b)
    return b"".join(parts)


def decode_multi(body: bytes) -> list[bytes]:
    """Split a multi-batch body into its batches (not decoded: each is checked on its own later).

    Raises:
        WireError: the framing is wrong; the message says where.
    """
    if len(body) < _HEAD.size:
        raise WireError(f"multi-batch is {len(body)} bytes, shorter than its {_HEAD.size}-byte prefix")
    magic, version, flags, count = _HEAD.unpack_from(body)
    if magic != MULTI_MAGIC:
        raise WireError("not a rankwatch multi-batch (bad magic bytes)")
    if version != MULTI_VERSION:
        raise WireError(f"multi-batch version {version} is not supported; this collector reads {MULTI_VERSION}")
    if flags:
        raise WireError(f"unknown multi-batch flags 0x{flags:x}")
    if count > MAX_ITEMS:
        raise WireError(f"multi-batch holds {count} batches; the limit is {MAX_ITEMS}")
    view = memoryview(body)
    off = _HEAD.size
    out: list[bytes] = []
    for i in range(count):
        if off + _LEN.size > len(body):
            raise WireError(f"multi-batch is truncated before batch {i}")
        (n,) = _LEN.unpack_from(body, off)
        off += _LEN.size
        if off + n > len(body):
            raise WireError(f"multi-batch is truncated inside batch {i}")
        out.append(bytes(view[off : off + n]))
        off += n
    if off != len(body):
        raise WireError(f"multi-batch has {len(body) - off} bytes after its {count} batches")
    return out
