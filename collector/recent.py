"""The most recent raw op records of a job, kept in a bounded in-memory ring for inspection.

Raw records are monitoring data: they live here (and in the detector's own state), never in SQL,
and are lost with the process. ``GET /jobs/{job_id}/ops`` reads them.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from rankwatch.wire import DTYPES, KIND_NAMES, Records

__all__ = ["RecentOps"]


@dataclass(frozen=True, slots=True)
class _Block:
    rank: int
    gids: tuple[str, ...]
    records: Records


class RecentOps:
    """A FIFO of record blocks holding at most ``max_rows`` records in all."""

    def __init__(self, max_rows: int = 200_000) -> None:
        self.max_rows = max_rows
        self.rows = 0
        self._blocks: deque[_Block] = deque()

    def add(self, rank: int, gids: tuple[str, ...], records: Records) -> None:
        if not len(records):
            return
        self._blocks.append(_Block(rank, gids, records))
        self.rows += len(records)
        while self.rows > self.max_rows and len(self._blocks) > 1:
            self.rows -= len(self._blocks.popleft().records)

    def query(self, *, rank: int | None = None, group: str | None = None, limit: int = 1000) -> list[dict[str, Any]]:
        """The newest ``limit`` records matching the filters, oldest first."""
        out: list[dict[str, Any]] = []
        for block in reversed(self._blocks):
            if rank is not None and block.rank != rank:
                continue
            r = block.records
            idx = np.arange(len(r))
            if group is not None:
                if group not in block.gids:
                    continue
                idx = idx[r.group == block.gids.index(group)]
            for i in reversed(idx.tolist()):
                out.append(
                    {
                        "rank": block.rank,
                        "group": block.gids[int(r.group[i])],
                        "seq": int(r.seq[i]),
                        "kind": KIND_NAMES.get(int(r.kind[i]), str(int(r.kind[i]))),
                        "peer": int(r.peer[i]),
                        "bytes": int(r.nbytes[i]),
                        "dtype": DTYPES[int(r.dtype[i])] if int(r.dtype[i]) < len(DTYPES) else "other",
                        "t_enter_ns": int(r.t_enter[i]),
                        "t_start_ns": int(r.t_start[i]),
                        "t_end_ns": int(r.t_end[i]),
                        "duration_ms": round((int(r.t_end[i]) - int(r.t_enter[i])) / 1e6, 4),
                    }
                )
                if len(out) >= limit:
                    return out[::-1]
        return out[::-1]
