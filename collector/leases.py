"""Job leases: which of several service processes sharing one database analyses a job.

A process that gets a batch for a job nobody holds takes the job's lease (a row in
``job_leases``: holder, the holder's URL, an epoch, an expiry) and analyses the job; the others
forward the job's batches to the holder's URL. The holder renews its leases every third of the
TTL; when it dies they expire and the next process to see a batch of the job, or the periodic
sweep of expired leases, takes over. Taking, renewing and taking over are one
``INSERT ... ON CONFLICT DO UPDATE ... WHERE`` each, so two processes never both win.

Writes about a job (its rows, suspects, summaries) run ``guard`` inside their transaction: it
locks the job's lease row (PostgreSQL; SQLite serialises writers anyway) and drops the jobs whose
lease this process no longer holds at the epoch it took, so a holder that stalled past its TTL
cannot write over its successor.

A process whose advertised URL is the URL on a lease is a restarted life of the holder (only one
process can listen on that address) and takes the lease back at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import case, delete, select
from sqlalchemy.orm import Session

from rankwatch.collector.db import Database
from rankwatch.collector.models import JobLeaseRow
from rankwatch.errors import RankwatchError

__all__ = ["LeaseManager", "NotHolder"]

logger = logging.getLogger(__name__)

FOREIGN_RECHECK_S = 1.0
"""How long a process trusts what it read of another holder's lease before reading it again."""


class NotHolder(RankwatchError):
    """Another process holds the job's lease; the batch belongs there (never shown to a client)."""

    def __init__(self, job_id: str, url: str) -> None:
        super().__init__(f"job {job_id!r} is analysed by {url}")
        self.job_id = job_id
        self.url = url


@dataclass(slots=True)
class _Held:
    epoch: int
    expires_at: float


@dataclass(slots=True)
class _Foreign:
    url: str
    expires_at: float
    checked_at: float


class LeaseManager:
    """This process's side of the job leases."""

    def __init__(
        self,
        db: Database,
        *,
        instance: str,
        url: str,
        ttl_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.db = db
        self.instance = instance
        self.url = url
        self.ttl_s = ttl_s
        self.clock = clock
        self.held: dict[str, _Held] = {}
        self._foreign: dict[str, _Foreign] = {}
        self._lock = threading.Lock()
        # port 0 means "any free port": every such process would claim the same URL
        self._url_is_unique = not url.rstrip("/").endswith(":0")

    # -- who holds a job --------------------------------------------------------------------------
    def owner(self, job_id: str, now: float | None = None) -> str | None:
        """``None`` when this process holds ``job_id``'s lease (taking it if it is free or
        expired), else the URL of the process that holds it.

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database could not be asked, and this process
                did not hold the lease already.
        """
        now = self.clock() if now is None else now
        held = self.held.get(job_id)
        if held is not None and held.expires_at > now:
            return None
        foreign = self._foreign.get(job_id)
        if foreign is not None and foreign.expires_at > now and now - foreign.checked_at < FOREIGN_RECHECK_S:
            return foreign.url
        try:
            return self._take(job_id, now)
        except Exception:
            if held is not None:  # nobody can take it over without the database either
                logger.warning("could not renew the lease of job %s; still analysing it", job_id, exc_info=True)
                held.expires_at = now + 1.0  # ask again in a second, not on every batch
                return None
            raise

    def holds(self, job_id: str) -> bool:
        return job_id in self.held

    def _take(self, job_id: str, now: float) -> str | None:
        with self.db.sessions.begin() as s:
            self._upsert(s, [job_id], now)
            row = s.get(JobLeaseRow, job_id)
            assert row is not None
            return self._note(row, now)

    def _upsert(self, s: Session, job_ids: Iterable[str], now: float) -> None:
        t = JobLeaseRow.__table__
        ins = _insert_for(s)(t)
        mine = t.c.holder == ins.excluded.holder
        takeover = (t.c.expires_at < ins.excluded.acquired_at) | mine
        if self._url_is_unique:
            takeover = takeover | (t.c.holder_url == ins.excluded.holder_url)
        stmt = ins.on_conflict_do_update(
            index_elements=["job_id"],
            set_={
                "holder": ins.excluded.holder,
                "holder_url": ins.excluded.holder_url,
                "epoch": case((mine, t.c.epoch), else_=t.c.epoch + 1),
                "acquired_at": case((mine, t.c.acquired_at), else_=ins.excluded.acquired_at),
                "expires_at": ins.excluded.expires_at,
            },
            where=takeover,
        )
        rows = [
            {
                "job_id": j,
                "holder": self.instance,
                "holder_url": self.url,
                "epoch": 1,
                "acquired_at": now,
                "expires_at": now + self.ttl_s,
            }
            for j in sorted(job_ids)  # one order everywhere: no lock-order deadlocks between processes
        ]
        if rows:
            s.execute(stmt, rows)

    def _note(self, row: JobLeaseRow, now: float) -> str | None:
        with self._lock:
            if row.holder == self.instance:
                prev = self.held.get(row.job_id)
                if prev is None or prev.epoch != row.epoch:
                    logger.info("took the lease of job %s (epoch %d)", row.job_id, row.epoch)
                self.held[row.job_id] = _Held(epoch=row.epoch, expires_at=row.expires_at)
                self._foreign.pop(row.job_id, None)
                return None
            self.held.pop(row.job_id, None)
            self._foreign[row.job_id] = _Foreign(url=row.holder_url, expires_at=row.expires_at, checked_at=now)
            return row.holder_url

    def forget_foreign(self, job_id: str) -> None:
        """Read the lease again next time (its holder did not answer a forwarded batch)."""
        self._foreign.pop(job_id, None)

    # -- keeping leases ---------------------------------------------------------------------------
    def renew(self, job_ids: Iterable[str] | None = None) -> list[str]:
        """Extend the leases this process holds; returns the jobs whose lease it lost."""
        now = self.clock()
        jobs = sorted(self.held if job_ids is None else job_ids)
        if not jobs:
            return []
        before = {j: self.held[j].epoch for j in jobs if j in self.held}
        with self.db.sessions.begin() as s:
            self._upsert(s, jobs, now)
            rows = list(s.scalars(select(JobLeaseRow).where(JobLeaseRow.job_id.in_(jobs))))
        lost = []
        for row in rows:
            self._note(row, now)
            if row.holder != self.instance or (row.job_id in before and before[row.job_id] != row.epoch):
                lost.append(row.job_id)
        for j in lost:
            with self._lock:
                self.held.pop(j, None)
        return lost

    def expired(self, limit: int = 100) -> list[str]:
        """Jobs whose lease has run out: their holder died without releasing them."""
        now = self.clock()
        with self.db.sessions() as s:
            return list(
                s.scalars(
                    select(JobLeaseRow.job_id)
                    .where(JobLeaseRow.expires_at < now, JobLeaseRow.holder != self.instance)
                    .order_by(JobLeaseRow.expires_at)
                    .limit(limit)
                )
            )

    def previous_life(self) -> list[str]:
        """Jobs leased to this process's URL by an earlier process (this one, restarted)."""
        if not self._url_is_unique:
            return []
        with self.db.sessions() as s:
            return list(
                s.scalars(
                    select(JobLeaseRow.job_id).where(
                        JobLeaseRow.holder_url == self.url, JobLeaseRow.holder != self.instance
                    )
                )
            )

    def release(self, job_ids: Iterable[str] | None = None) -> None:
        """Give leases up (a job gone idle, or a clean shutdown): others may take them at once."""
        jobs = sorted(self.held if job_ids is None else job_ids)
        if not jobs:
            return
        with self.db.sessions.begin() as s:
            s.execute(delete(JobLeaseRow).where(JobLeaseRow.job_id.in_(jobs), JobLeaseRow.holder == self.instance))
        with self._lock:
            for j in jobs:
                self.held.pop(j, None)

    def guard(self, s: Session, job_ids: Iterable[str]) -> set[str]:
        """Of ``job_ids``, those this process still holds at the epoch it took them; call inside
        the transaction that writes about them (their lease rows stay locked until it ends)."""
        jobs = sorted(set(job_ids))
        if not jobs:
            return set()
        rows = s.execute(
            select(JobLeaseRow.job_id, JobLeaseRow.holder, JobLeaseRow.epoch)
            .where(JobLeaseRow.job_id.in_(jobs))
            .order_by(JobLeaseRow.job_id)
            .with_for_update()
        )
        ok = set()
        for job_id, holder, epoch in rows:
            held = self.held.get(job_id)
            if holder == self.instance and held is not None and held.epoch == epoch:
                ok.add(job_id)
        return ok


def _insert_for(s: Session) -> Callable[..., Any]:
    if s.get_bind().dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    return sqlite_insert
