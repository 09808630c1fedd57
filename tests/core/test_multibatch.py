"""The multi-batch framing ``rankwatch agent`` sends: round trip and every way it can be malformed."""

from __future__ import annotations

import struct

import pytest

from rankwatch.errors import WireError
from rankwatch.multibatch import MULTI_MAGIC, decode_multi, encode_multi


def test_round_trip_keeps_every_batch_byte_for_byte() -> None:
    batches = [b"first", b"", b"\x00" * 1000, bytes(range(256))]
    assert decode_multi(encode_multi(batches)) == batches
    assert decode_multi(encode_multi([])) == []


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"RWM", "shorter than"),
        (b"XXXX" + struct.pack("<HHI", 1, 0, 0), "bad magic"),
        (MULTI_MAGIC + struct.pack("<HHI", 2, 0, 0), "version 2"),
        (MULTI_MAGIC + struct.pack("<HHI", 1, 4, 0), "unknown multi-batch flags"),
        (MULTI_MAGIC + struct.pack("<HHI", 1, 0, 1), "truncated before batch 0"),
        (MULTI_MAGIC + struct.pack("<HHII", 1, 0, 1, 10) + b"abc", "truncated inside batch 0"),
        (encode_multi([b"ab"]) + b"extra", "5 bytes after"),
        (MULTI_MAGIC + struct.pack("<HHI", 1, 0, 10**6), "the limit is"),
    ],
)
def test_malformed_framing_is_refused_with_a_reason(body: bytes, says: str) -> None:
    with pytest.raises(WireError, match=says):
        decode_multi(body)
