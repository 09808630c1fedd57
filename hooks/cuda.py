"""Timing NCCL ops from CUDA events, off the training thread.

On NCCL a collective call only enqueues work on a stream; the CPU-side return says nothing about
when it ran. rankwatch turns on c10d's own collective timing for NCCL groups
(``ProcessGroup._enable_collectives_timing``, the switch behind ``TORCH_NCCL_ENABLE_TIMING``),
which records a CUDA event before and after each kernel. This poller thread asks each pending
work ``is_completed()`` (an event query, never a synchronize) and, once it is, reads the kernel's
duration from the events. The time inside the kernel includes waiting for the last peer, exactly
what lateness is computed from.

Written for, and only exercised on, machines with a GPU; the tests skip it elsewhere.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any

import torch  # imported by process_group, this module's importer, already

if TYPE_CHECKING:
    from rankwatch.hooks.recorder import Recorder

__all__ = ["CudaPoller", "StreamSpan"]

logger = logging.getLogger(__name__)
_perf = time.perf_counter_ns

POLL_S = 0.002
IDLE_S = 0.02


class StreamSpan:
    """A synchronous NCCL collective's stand-in for the work it did not return.

    Since PyTorch 2.7 a collective called with ``async_op=False`` on NCCL runs on the caller's
    current stream and returns no ``Work`` at all (seen on torch 2.11 with an H200: every
    ``dist.all_reduce(t)`` came back ``None``), so there are no c10d events to read. Two timing
    events recorded on that stream around the call bracket the kernel instead; the poller asks
    them exactly as it asks a work.
    """

    __slots__ = ("end", "start")

    def __init__(self) -> None:
        self.start = torch.cuda.Event(enable_timing=True)
        self.end: Any = None
        self.start.record()

    def close(self) -> StreamSpan:
        self.end = torch.cuda.Event(enable_timing=True)
        self.end.record()
        return self

    def is_completed(self) -> bool:
        return bool(self.end.query())

    def _get_duration(self) -> float:
        return float(self.start.elapsed_time(self.end))


def stream_span() -> StreamSpan | None:
    """Events around a synchronous NCCL call, or None where they cannot be recorded (a stream
    being captured into a CUDA graph takes no timing events)."""
    try:
        if torch.cuda.is_current_stream_capturing():
            return None
        return StreamSpan()
    except Exception:
        return None


class CudaPoller:
    """Stamps NCCL ops with their GPU start and end once their events have fired."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self._new: deque[tuple[Any, int, Any]] = deque()
        self._pending: list[tuple[Any, int, Any]] = []
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # the poller thread, and a final batch stamping what is left

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="rankwatch-cuda", daemon=True)
        self._thread.start()

    def add(self, st: Any, op: int, work: Any) -> None:
        self._new.append((st, op, work))

    def poll_once(self) -> int:
        """Stamp what has completed; returns how many ops are still pending."""
        with self._lock:
            return self._poll()

    def _poll(self) -> int:
        from rankwatch.hooks.process_group import finish

        while self._new:
            self._pending.append(self._new.popleft())
        still: list[tuple[Any, int, Any]] = []
        for st, op, work in self._pending:
            try:
                done = work.is_completed()
            except Exception:
                continue  # an errored work: leave the op in flight, it never completed
            if not done:
                still.append((st, op, work))
                continue
            t_end = _perf()
            t_start = None
            try:
                ms = float(work._get_duration())
                if ms >= 0:
                    t_start = t_end - int(ms * 1e6)
            except Exception:
                pass
            info = st.inflight.get(op)
            if info is not None and t_start is not None and t_start < info[0]:
                t_start = info[0]
            finish(st, op, t_end, t_start)
        self._pending = still
        return len(still)

    def _run(self) -> None:
        rec = self.recorder
        while not rec.halted:
            try:
                with rec.torch_section() as allowed:
                    busy = self.poll_once() if allowed else 0
            except Exception:
                logger.debug("rankwatch: CUDA poller error", exc_info=True)
                busy = 0
            time.sleep(POLL_S if busy or self._new else IDLE_S)
