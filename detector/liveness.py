"""Who is alive: heartbeats, endings, and the first casualty of a crash.

Every batch is a heartbeat. A rank that said goodbye is finished, not dead. A rank silent for
``dead_after_s`` (and ``dead_flushes`` of its own send periods) is dead — a SIGSTOPped process
simply stops sending. When one rank crashes and the launcher then terminates all the others,
every rank ends, but only the first casualty is the suspect: the casualties are ordered by when
they ended (a crash or termination by the batch that said so; a silent rank by its last heartbeat
plus half a send period) and only those at the head of the wave are named. Everyone terminating
at once with nobody before them is a job stopped by its launcher, not a fault. A rank whose crash
says a peer went away (gloo's "Connection closed by peer", NCCL's "remote process exited", ...)
is a victim like a terminated one: it is named only when nobody crashed on their own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rankwatch.detector.config import DetectorConfig
from rankwatch.sim.blocks import STATE_CODES

__all__ = ["Casualty", "Liveness", "peer_failure"]

RUNNING, GOODBYE, TERMINATING, CRASHED = (STATE_CODES[s] for s in ("running", "goodbye", "terminating", "crashed"))


@dataclass(slots=True)
class Casualty:
    rank: int
    at: float  # server time it ended (estimated for silent ranks)
    how: str  # crashed, peer (crashed because a peer went away), terminating, silent


# what the backends raise in the survivors when another rank's process goes away
_PEER_FAILURE = (
    "connection closed by peer",
    "remote worker crash",
    "connection reset by peer",
    "broken pipe",
    "remote process exited",
    "remote peer",
    "socket closed",
    "nccl communicator was aborted",
    "process group was aborted",
    "timed out in call to",
    "watchdog caught collective operation timeout",
)


def peer_failure(reason: str | None) -> bool:
    """Whether a crash reason says the rank failed because another rank went away."""
    text = (reason or "").lower()
    return any(p in text for p in _PEER_FAILURE)


def _grow(a: np.ndarray, n: int, fill: Any) -> np.ndarray:
    if a.shape[0] >= n:
        return a
    out = np.full(n, fill, a.dtype)
    out[: a.shape[0]] = a
    return out


class Liveness:
    """Per-rank heartbeat state."""

    def __init__(self, cfg: DetectorConfig) -> None:
        self.cfg = cfg
        self.last_seen = np.full(0, np.nan)
        self.flush = np.full(0, 1.0)
        self.state = np.zeros(0, np.uint8)
        self.state_at = np.full(0, np.nan)
        self.offset = np.full(0, np.nan)  # server seconds minus the rank's monotonic seconds
        self.restart = np.full(0, -1, np.int64)
        self.notes: dict[int, dict[str, Any]] = {}
        self.stack_at: dict[int, float] = {}

    def ensure(self, world: int) -> None:
        self.last_seen = _grow(self.last_seen, world, np.nan)
        self.flush = _grow(self.flush, world, 1.0)
        self.state = _grow(self.state, world, 0)
        self.state_at = _grow(self.state_at, world, np.nan)
        self.offset = _grow(self.offset, world, np.nan)
        self.restart = _grow(self.restart, world, -1)

    def update(self, rows: np.ndarray, received_at: float, notes: dict[int, dict[str, Any]]) -> None:
        """Take one batch's rank rows (each rank once) and notes."""
        self._update_rows(rows, received_at)
        self._take_notes(notes, received_at)

    def update_many(
        self, rows: np.ndarray, received_at: np.ndarray, notes: list[tuple[dict[int, dict[str, Any]], float]]
    ) -> None:
        """Take several batches' rank rows, concatenated in the order they came (``received_at``
        per row), and each batch's notes; a rank may be in several."""
        r = rows["rank"]
        order = np.argsort(r, kind="stable")
        rs = r[order]
        first = np.ones(rs.shape[0], bool)
        first[1:] = rs[1:] != rs[:-1]
        if first.all():
            self._update_rows(rows, received_at)
        else:  # a rank's k-th row in the k-th pass: each pass has a rank once, in arrival order
            start = np.flatnonzero(first)
            occ = np.empty(rs.shape[0], np.int64)
            occ[order] = np.arange(rs.shape[0]) - np.repeat(start, np.diff(np.r_[start, rs.shape[0]]))
            for k in range(int(occ.max()) + 1):
                sel = occ == k
                self._update_rows(rows[sel], received_at[sel])
        for n, t in notes:
            self._take_notes(n, t)

    def _update_rows(self, rows: np.ndarray, received_at: float | np.ndarray) -> None:
        r = rows["rank"].astype(np.int64)
        self.last_seen[r] = received_at
        self.flush[r] = np.maximum(rows["flush_s"].astype(np.float64), 0.05)
        new_state = rows["state"]
        changed = new_state != self.state[r]
        self.state_at[r[changed]] = received_at[changed] if isinstance(received_at, np.ndarray) else received_at
        self.state[r] = new_state
        off = received_at - rows["mono_ns"].astype(np.float64) * 1e-9
        # the least-delayed batch gives the best offset; a restarted process has a new clock
        fresh = np.isnan(self.offset[r]) | (rows["restart"] != self.restart[r])
        self.offset[r] = np.where(fresh, off, np.fmin(self.offset[r], off))
        self.restart[r] = rows["restart"]

    def _take_notes(self, notes: dict[int, dict[str, Any]], received_at: float) -> None:
        for rank, note in notes.items():
            cur = self.notes.setdefault(rank, {})
            if note.get("incarnation") != cur.get("incarnation"):
                cur.clear()
            cur.update(note)
            if "stack" in note:
                self.stack_at[rank] = received_at
            else:
                cur.pop("stack", None)

    def known(self) -> np.ndarray:
        return ~np.isnan(self.last_seen)

    def silence(self, now: float) -> np.ndarray:
        """Seconds since each rank's last batch (nan if never seen)."""
        return now - self.last_seen

    def silent(self, now: float, flushes: float) -> np.ndarray:
        running = self.state == RUNNING
        return running & (np.nan_to_num(self.silence(now), nan=0.0) > flushes * self.flush + 0.25)

    def dead(self, now: float) -> np.ndarray:
        cfg = self.cfg
        limit = np.maximum(cfg.dead_after_s, cfg.dead_flushes * self.flush)
        return (self.state == RUNNING) & (np.nan_to_num(self.silence(now), nan=0.0) > limit)

    def casualties(self, now: float) -> list[Casualty]:
        cfg = self.cfg
        out: list[Casualty] = []
        for r in np.flatnonzero(self.state == CRASHED).tolist():
            how = "peer" if peer_failure(self.notes.get(r, {}).get("end_reason")) else "crashed"
            out.append(Casualty(r, float(self.state_at[r]), how))
        for r in np.flatnonzero(self.state == TERMINATING).tolist():
            out.append(Casualty(r, float(self.state_at[r]), "terminating"))
        for r in np.flatnonzero(self.silent(now, cfg.silent_flushes)).tolist():
            out.append(Casualty(r, float(self.last_seen[r] + 0.5 * self.flush[r]), "silent"))
        out.sort(key=lambda c: c.at)
        return out

    def first_casualties(self, now: float) -> tuple[list[Casualty], list[Casualty]]:
        """(suspects, the whole wave they started) among the ranks that ended.

        Silent ranks count only once dead, unless others ended around them (a crash wave).
        """
        cfg = self.cfg
        cas = self.casualties(now)
        if not cas:
            return [], []
        dead = self.dead(now)
        t0 = cas[0].at
        wave = [c for c in cas if c.at <= t0 + cfg.cascade_s]
        ended = [c for c in wave if c.how != "silent"]
        wave = [c for c in wave if c.how != "silent" or dead[c.rank] or ended]
        if not wave:
            return [], []
        primary = [c for c in wave if c.how in ("crashed", "silent")]
        if not primary:
            # nobody crashed on their own: the cause may still be going silent; once it had time
            # to, the first victim is the best lead there is
            peers = [c for c in wave if c.how == "peer"]
            if peers:
                return ([peers[0]] if now - peers[0].at > cfg.dead_after_s else []), wave
        if primary:
            t1 = primary[0].at
            return [c for c in primary if c.at <= t1 + cfg.casualty_tie_s], wave
        # only terminations: one clearly before the others is the suspect; a simultaneous stop is not a fault
        if len(wave) == 1:
            return wave, wave
        if wave[1].at - wave[0].at > max(2.0, 2 * cfg.casualty_tie_s):
            return [wave[0]], wave
        return [], wave
