"""Block mode of the shipper: a rank sends block summaries of its ops instead of one record each.

For large jobs (``RANKWATCH_WIRE_MODE=blocks``, or ``auto`` and a world of at least
``RANKWATCH_BLOCK_MODE_MIN_WORLD`` ranks) every rank summarises its records into
sequence-aligned blocks (``rankwatch.sim.blocks.summarise``) and ships ``rankwatch.blockwire``
bodies. All members of a group must cut the same blocks, so a group's block size is not the
rank's to pick: the rank proposes one from its op rate (``block_want``), the collector settles
the group's size on the first word it hears and tells every member in its replies
(``block_seqs``). Until then the group's records wait here. A block's records are also held
until the block is complete (or old), so a block usually travels as one row, not in parts.
Progress (entered, completed, in flight since), stacks, endings and commands are as in raw mode.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from rankwatch.sim.blocks import BLOCK_SEQS
from rankwatch.wire import Records

__all__ = ["BlockShaper", "want_block"]

_SEND, _RECV = 13, 14
_FIELDS = ("group", "kind", "dtype", "peer", "seq", "nbytes", "t_enter", "t_start", "t_end")


def want_block(ops: int, period_s: float, block_s: float) -> int:
    """The block size a rank proposes: a power of two of ops spanning about ``block_s``, at most
    ``BLOCK_SEQS`` (the rule the detector uses for raw records)."""
    want = ops / max(period_s, 1e-3) * block_s
    return int(min(BLOCK_SEQS, 2 ** max(0, math.floor(math.log2(max(want, 1.0))))))


def _concat(a: Records, b: Records) -> Records:
    if not len(a):
        return b
    if not len(b):
        return a
    return Records(*(np.concatenate((getattr(a, f), getattr(b, f))) for f in _FIELDS))


def _take(r: Records, mask: np.ndarray) -> Records:
    return Records(*(getattr(r, f)[mask] for f in _FIELDS))


class BlockShaper:
    """Records waiting for their group's block size or for their block to complete."""

    def __init__(self, *, flush_s: float, block_s: float, max_held: int, hold_s: float | None = None) -> None:
        self.flush_s = flush_s
        self.block_s = block_s
        self.max_held = max_held
        self.hold_ns = int(1e9 * (hold_s if hold_s is not None else max(2.0, 2 * flush_s)))
        self.sizes: dict[str, int] = {}  # group key -> block size the collector settled
        self.held = Records.empty()  # ``group`` is the recorder's group index
        self.dropped = 0

    def learn(self, sizes: Any) -> None:
        """Take the block sizes a reply settled (``{group id: size}``); ignore anything else."""
        if not isinstance(sizes, Mapping):
            return
        for key, b in sizes.items():
            if isinstance(b, int) and not isinstance(b, bool) and 1 <= b <= BLOCK_SEQS and b & (b - 1) == 0:
                self.sizes[str(key)] = b

    def shape(
        self, new: Records, keys: list[str], now_ns: int, *, final: bool = False
    ) -> tuple[Records, dict[int, int], dict[int, int]]:
        """Split what can be summarised now from what must wait.

        Args:
            new: records drained this period (``group`` = the recorder's group index).
            keys: group id of each recorder group index.
            now_ns: the rank's monotonic clock now.
            final: the last batch: nothing waits (a group still without a size uses its proposal).

        Returns:
            The records to summarise, the block size of each group index they name, and the
            proposal for each group index still without a size.
        """
        wants: dict[int, int] = {}
        if len(new):
            coll = (new.kind != _SEND) & (new.kind != _RECV)
            n_by_group = np.bincount(new.group[coll].astype(np.intp), minlength=len(keys))
            for gx in np.flatnonzero(n_by_group).tolist():
                if keys[gx] not in self.sizes:
                    wants[gx] = want_block(int(n_by_group[gx]), self.flush_s, self.block_s)
        r = _concat(self.held, new)
        n = len(r)
        if not n:
            return r, {}, wants
        g = r.group.astype(np.intp)
        present = np.unique(g).tolist()
        bs_of = np.zeros(len(keys), np.int64)
        for gi in present:
            b = self.sizes.get(keys[gi])
            if b is None and final:
                b = wants.get(gi) or 1
                wants[gi] = b
            bs_of[gi] = b or 0
        bs = bs_of[g]
        send = bs > 0
        if not final:
            # collectives of the last, incomplete block of each group wait for the rest of it
            coll = (r.kind != _SEND) & (r.kind != _RECV)
            hi = np.zeros(len(keys), np.int64)
            np.maximum.at(hi, g[coll], r.seq[coll])
            cut = np.where(bs_of > 0, (hi // np.maximum(bs_of, 1)) * bs_of, 0)
            fresh = r.t_enter > now_ns - self.hold_ns
            send &= ~(coll & (r.seq > cut[g]) & fresh)
        out = _take(r, send)
        held = _take(r, ~send)
        over = len(held) - self.max_held
        if over > 0:  # the oldest go, as in the ring; the collector hears of them as drops
            self.dropped += over
            keep = np.argsort(held.t_enter, kind="stable")[over:]
            held = _take(held, np.sort(keep))
        self.held = held
        sizes = {gi: int(bs_of[gi]) for gi in np.unique(out.group.astype(np.intp)).tolist()} if len(out) else {}
        return out, sizes, wants
