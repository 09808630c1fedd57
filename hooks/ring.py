"""A bounded ring of op records, written by the threads that see ops complete and drained by the shipper.

Appending is one ``deque.append`` and one ``next()`` on a counter, both atomic under the GIL, so the
training thread, gloo's completion threads and the CUDA poller may all write without a lock. When
the ring is full the oldest record is dropped; drops are derived, not counted on the hot path:
``appended - drained - len(ring)``.
"""

from __future__ import annotations

import itertools
from collections import deque
from typing import Any

__all__ = ["OpRing"]


class OpRing:
    """Bounded FIFO of record tuples with an exact count of what overflow dropped."""

    __slots__ = ("_appended", "_buf", "_drained", "append", "capacity")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._buf: deque[tuple[Any, ...]] = deque(maxlen=capacity)
        self._appended = itertools.count()
        self._drained = 0
        buf_append = self._buf.append
        counter = self._appended

        def append(record: tuple[Any, ...]) -> None:
            next(counter)
            buf_append(record)

        self.append = append

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
        self._drained += len(out)
        return out

    @property
    def appended(self) -> int:
        # itertools.count exposes its next value only through repr; reading it does not advance it.
        return int(repr(self._appended)[6:-1])

    @property
    def drops(self) -> int:
        """Records lost to overflow so far."""
        return max(0, self.appended - self._drained - len(self._buf))
