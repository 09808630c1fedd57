"""A bounded ring of op records, written by the threads that see ops complete and drained by the shipper.

Appending is one ``deque.append``, atomic under the GIL, so the training thread, gloo's
completion threads and the CUDA poller may all write without a lock. When the ring is full the
oldest record is dropped. Drops are not counted on the hot path: the recorder derives them from
the groups' op counters (``Recorder.drops``).
"""

from __future__ import annotations

from collections import deque
from typing import Any

__all__ = ["OpRing"]


class OpRing:
    """Bounded FIFO of record tuples."""

    __slots__ = ("_buf", "append", "capacity", "drained")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._buf: deque[tuple[Any, ...]] = deque(maxlen=capacity)
        self.append = self._buf.append
        self.drained = 0

    def __len__(self) -> int:
        return len(self._buf)

    def drain(self, limit: int) -> list[tuple[Any, ...]]:
        """Remove and return up to ``limit`` of the oldest records (shipper thread only)."""
        out: list[tuple[Any, ...]] = []
        pop = self._buf.popleft
        try:
            for _ in range(min(limit, len(self._buf))):
                out.append(pop())
        except IndexError:
            pass
        self.drained += len(out)
        return out
