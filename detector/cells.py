"""Aligning members: block summaries wait here until every member of their group has reported.

A *cell* is one (channel, op class, block): the same ops on every member. Rows arrive from many
batches, possibly in parts; ``CellTable.take`` merges parts, hands back the cells every member has
completed (or that waited longer than the timeout, with the members that did report), and keeps the
rest. ``cell_stats`` then computes, for all those cells at once, what the principle needs:

- each member's mean time inside the cell's ops;
- its *lateness* per op: the longest mean in the cell minus its own (how long the others waited
  for it; the last to arrive spends the least time inside). Never the median: when half a group
  is slow, the median sits between the halves;
- its *wait* per op: its own mean minus the shortest (how long it waited for others);
- the cell's *transfer* time: the shortest time any member spent inside any of its ops, the
  part nobody waits for.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["PENDING_DTYPE", "CellStats", "CellTable", "cell_key", "cell_stats"]

PENDING_DTYPE = np.dtype(
    [
        ("key", "<i8"),
        ("slot", "<i8"),
        ("cnt", "<f8"),
        ("sum", "<f8"),  # seconds inside the ops
        ("mn", "<f8"),
        ("mx", "<f8"),
        ("t_first", "<f8"),  # server time of the first and last enter
        ("t_last", "<f8"),
        ("arrived", "<f8"),  # server time the first part arrived
    ]
)

_BLOCK_BITS = 32
_CLASS_BITS = 11


def cell_key(ch: np.ndarray, cls: np.ndarray, block: np.ndarray) -> np.ndarray:
    """Pack (channel, op class, block) into one sortable int64."""
    return (((ch.astype(np.int64) << _CLASS_BITS) | cls.astype(np.int64)) << _BLOCK_BITS) | (
        block.astype(np.int64) & ((1 << _BLOCK_BITS) - 1)
    )


def key_channel(key: np.ndarray) -> np.ndarray:
    return key >> (_CLASS_BITS + _BLOCK_BITS)


def key_class(key: np.ndarray) -> np.ndarray:
    return (key >> _BLOCK_BITS) & ((1 << _CLASS_BITS) - 1)


def key_block(key: np.ndarray) -> np.ndarray:
    return key & ((1 << _BLOCK_BITS) - 1)


class CellTable:
    """Block rows waiting for the rest of their group."""

    def __init__(self) -> None:
        self._parts: list[np.ndarray] = []
        self.rows = 0
        self.dropped_cells = 0

    def add(self, rows: np.ndarray) -> None:
        if rows.shape[0]:
            self._parts.append(rows)
            self.rows += rows.shape[0]

    def clear(self) -> None:
        self._parts = []
        self.rows = 0

    def take(
        self, now: float, ch_size: np.ndarray, ch_block: np.ndarray, wm_min: np.ndarray, timeout_s: float
    ) -> np.ndarray:
        """Merged rows (sorted by cell, then slot) of every cell ready for analysis.

        Args:
            now: server time.
            ch_size: members per channel.
            ch_block: block size per channel.
            wm_min: per channel, the lowest sequence number every member has completed.
            timeout_s: cells older than this are analysed with the members that reported.
        """
        if not self._parts:
            return np.zeros(0, PENDING_DTYPE)
        r = np.concatenate(self._parts) if len(self._parts) > 1 else self._parts[0]
        r = r[np.lexsort((r["slot"], r["key"]))]
        key, slot = r["key"], r["slot"]
        brk = np.ones(r.shape[0], bool)
        brk[1:] = (key[1:] != key[:-1]) | (slot[1:] != slot[:-1])
        st = np.flatnonzero(brk)
        if st.shape[0] != r.shape[0]:  # parts of one (cell, slot): add them up
            m = np.zeros(st.shape[0], PENDING_DTYPE)
            m["key"], m["slot"] = key[st], slot[st]
            for name, op in (
                ("cnt", np.add),
                ("sum", np.add),
                ("mn", np.minimum),
                ("mx", np.maximum),
                ("t_first", np.minimum),
                ("t_last", np.maximum),
                ("arrived", np.minimum),
            ):
                m[name] = op.reduceat(r[name], st)
            r = m
            key = r["key"]
        cbrk = np.ones(r.shape[0], bool)
        cbrk[1:] = key[1:] != key[:-1]
        cst = np.flatnonzero(cbrk)
        npres = np.diff(np.r_[cst, r.shape[0]])
        ckey = key[cst]
        ch = key_channel(ckey)
        end_seq = (key_block(ckey) + 1) * ch_block[ch]
        complete = (npres >= ch_size[ch]) & (wm_min[ch] >= end_seq)
        old = np.minimum.reduceat(r["arrived"], cst) < now - timeout_s
        ready = complete | (old & (npres >= 2))
        drop = old & ~ready
        self.dropped_cells += int(drop.sum())
        row_ready = np.repeat(ready, npres)
        row_keep = np.repeat(~ready & ~drop, npres)
        kept = r[row_keep]
        self._parts = [kept] if kept.shape[0] else []
        self.rows = kept.shape[0]
        return r[row_ready]


@dataclass(slots=True)
class CellStats:
    """Per-row and per-cell results for a set of ready cells (rows sorted by cell)."""

    # per row
    slot: np.ndarray
    cell: np.ndarray
    cnt: np.ndarray
    mean: np.ndarray
    late: np.ndarray  # seconds the others waited for this member, summed over the cell's ops
    wait: np.ndarray  # seconds this member waited for others
    dur: np.ndarray  # seconds inside
    lateflag: np.ndarray
    t: np.ndarray  # server time of the row's last enter
    t0: np.ndarray  # ...and of its first
    # per cell
    c_ch: np.ndarray
    c_cls: np.ndarray
    c_cnt: np.ndarray
    c_transfer: np.ndarray  # seconds per op: the shortest time inside any op, any member
    c_max: np.ndarray  # longest single op time inside, any member
    c_t: np.ndarray
    c_n: np.ndarray

    def __len__(self) -> int:
        return int(self.c_ch.shape[0])


def cell_stats(r: np.ndarray) -> CellStats:
    """Lateness, waiting and transfer time for merged rows of ready cells."""
    key = r["key"]
    n = r.shape[0]
    cbrk = np.ones(n, bool)
    if n:
        cbrk[1:] = key[1:] != key[:-1]
    cst = np.flatnonzero(cbrk)
    npres = np.diff(np.r_[cst, n])
    cell = np.repeat(np.arange(cst.shape[0]), npres)
    cnt = np.maximum(r["cnt"], 1.0)
    mean = r["sum"] / cnt
    if n:
        cmax = np.maximum.reduceat(mean, cst)
        cmin = np.minimum.reduceat(mean, cst)
        ccnt = np.maximum.reduceat(cnt, cst)
        cmx = np.maximum.reduceat(r["mx"], cst)
        # the transfer: the shortest time any member spent inside any op of the block (a mean of
        # means would mix up ops where different members arrived last)
        cmn = np.minimum.reduceat(r["mn"], cst)
        ct = np.maximum.reduceat(r["t_last"], cst)
    else:
        cmax = cmin = ccnt = cmx = ct = cmn = np.zeros(0)
    late_op = cmax[cell] - mean
    spread = (cmax - cmin)[cell]
    ckey = key[cst]
    return CellStats(
        slot=r["slot"],
        cell=cell,
        cnt=cnt,
        mean=mean,
        late=late_op * cnt,
        wait=(mean - cmin[cell]) * cnt,
        dur=r["sum"],
        lateflag=(late_op >= 0.5 * spread) & (spread > 0) & (npres[cell] >= 2),
        t=r["t_last"],
        t0=r["t_first"],
        c_ch=key_channel(ckey),
        c_cls=key_class(ckey),
        c_cnt=ccnt,
        c_transfer=cmn,
        c_max=cmx,
        c_t=ct,
        c_n=npres,
    )
