"""Recordings: a simulated job's batches on disk, as the collector would have received them.

``rankwatch simulate`` writes one; anything that takes wire batches (the collector's ingest, the
detector, a test) can replay it. The file is a sequence of frames::

    8 bytes   received_at, float64 little-endian (server seconds)
    4 bytes   length L of the body, uint32 little-endian
    L bytes   the body exactly as POSTed to /ingest (``wire.encode_batch``)

preceded by an 8-byte magic ``b"RWREC\\x00\\x01\\x00"``.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from rankwatch.sim.scenario import Scenario
from rankwatch.sim.ship import deliveries
from rankwatch.wire import encode_batch

__all__ = ["MAGIC", "SimulateSummary", "read_recording", "simulate"]

MAGIC = b"RWREC\x00\x01\x00"
_FRAME = struct.Struct("<dI")


@dataclass(frozen=True, slots=True)
class SimulateSummary:
    """What ``simulate`` wrote."""

    path: str
    batches: int
    records: int
    bytes: int
    ranks: int
    duration: float


def simulate(sc: Scenario, out: str | Path | BinaryIO) -> SimulateSummary:
    """Write every batch of a scenario to ``out`` (a path or a binary file object).

    Args:
        sc: the scenario (see ``rankwatch.sim.suite`` for named ones).
        out: where the recording goes.
    """
    own = not hasattr(out, "write")
    f: BinaryIO = open(out, "wb") if own else out  # type: ignore[assignment,arg-type]
    n = recs = size = 0
    try:
        f.write(MAGIC)
        for d in deliveries(sc):
            body = encode_batch(d.batch.header, d.batch.records)
            f.write(_FRAME.pack(d.received_at, len(body)))
            f.write(body)
            n += 1
            recs += len(d.batch.records)
            size += len(body)
    finally:
        if own:
            f.close()
    return SimulateSummary(str(out) if own else "<stream>", n, recs, size, sc.layout.world, sc.duration)


def read_recording(src: str | Path | BinaryIO) -> Iterator[tuple[float, bytes]]:
    """Yield ``(received_at, body)`` frames of a recording.

    Raises:
        ValueError: the file is not a recording, or it is truncated.
    """
    own = not hasattr(src, "read")
    f: BinaryIO = open(src, "rb") if own else src  # type: ignore[assignment,arg-type]
    try:
        if f.read(len(MAGIC)) != MAGIC:
            raise ValueError("not a rankwatch recording (bad magic bytes)")
        while True:
            head = f.read(_FRAME.size)
            if not head:
                return
            if len(head) != _FRAME.size:
                raise ValueError("recording is truncated inside a frame header")
            t, length = _FRAME.unpack(head)
            body = f.read(length)
            if len(body) != length:
                raise ValueError("recording is truncated inside a batch")
            yield t, body
    finally:
        if own:
            f.close()
