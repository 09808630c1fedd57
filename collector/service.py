"""The collector: takes batches, keeps per-job state, persists it, and runs the analysis loop.

``Collector.ingest`` is the whole ingest path: decode (columnar, no Python object per op),
validate, de-duplicate, fold into the job's state, hand the records to the job's detector, and
return the commands waiting for that rank. A background thread persists what changed and runs
each job's analysis; it never blocks ingest for long (a job's lock is held per job, briefly).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import select

from rankwatch.collector.actions import ActionBook
from rankwatch.collector.db import Database
from rankwatch.collector.flight import align_dumps
from rankwatch.collector.jobs import GroupInfo, JobState, RankInfo, iso
from rankwatch.collector.models import GroupRow, JobRow, RankRow
from rankwatch.collector.policy import Policy
from rankwatch.collector.settings import Settings
from rankwatch.collector.suspects import SuspectStore
from rankwatch.errors import WireError
from rankwatch.wire import Batch, decode_batch

__all__ = ["Collector", "IngestResult"]

logger = logging.getLogger(__name__)

PERSIST_EVERY_S = 2.0


class IngestResult(dict[str, Any]):
    """The JSON reply to a batch: ``accepted`` records, ``duplicate``, ``commands`` for the rank."""


class Collector:
    """Ingest, per-job state, persistence and the analysis loop of one service process."""

    def __init__(
        self,
        settings: Settings,
        db: Database,
        *,
        detector_factory: Callable[[str], Any] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.db = db
        self.clock = clock
        self.jobs: dict[str, JobState] = {}
        self._jobs_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.detector_factory = detector_factory
        self.stats = {"batches": 0, "records": 0, "duplicates": 0, "rejected": 0}
        self._last_persist = 0.0
        self.actions = ActionBook(db, Policy(mode=settings.policy, actuator=settings.actuator))
        self.suspects = SuspectStore(db, actions=self.actions)
        self.analyzers: list[Callable[[JobState, float], None]] = [self.analyze_job]

    # -- ingest -----------------------------------------------------------------------------------
    def ingest(self, body: bytes, *, bound_job: str | None = None) -> IngestResult:
        """Take one batch.

        Args:
            body: the request body, in the wire format.
            bound_job: the job the caller's token is limited to, if any.

        Raises:
            WireError: the batch is malformed; nothing of it was taken.
            PermissionError: the token is bound to another job.
        """
        try:
            batch = decode_batch(body)
        except WireError:
            self.stats["rejected"] += 1
            raise
        h = batch.header
        if bound_job is not None and h["job"] != bound_job:
            self.stats["rejected"] += 1
            raise PermissionError(f"this ingest token may only send batches for job {bound_job!r}")
        _check_membership(batch)
        now = self.clock()
        job = self._job(h["job"], now)
        with job.lock:
            if job.is_duplicate(h["rank"], h["incarnation"], h["batch"]):
                self.stats["duplicates"] += 1
                return IngestResult(accepted=0, duplicate=True, commands=job.commands_for(h["rank"], now))
            job.apply(batch, now)
            job.wire_bytes += len(body)
            if job.detector is None and self.detector_factory is not None:
                job.detector = self.detector_factory(job.job_id)
            if job.detector is not None:
                try:
                    job.detector.observe(batch, now)
                except Exception:
                    logger.exception("detector failed on a batch of job %s", job.job_id)
            commands = job.commands_for(h["rank"], now)
        self.stats["batches"] += 1
        self.stats["records"] += len(batch.records)
        return IngestResult(accepted=len(batch.records), duplicate=False, commands=commands)

    def _job(self, job_id: str, now: float) -> JobState:
        job = self.jobs.get(job_id)
        if job is not None:
            return job
        with self._jobs_lock:
            job = self.jobs.get(job_id)
            if job is None:
                job = self.jobs[job_id] = JobState(job_id, now)
            return job

    # -- queries ----------------------------------------------------------------------------------
    def list_jobs(self) -> list[dict[str, Any]]:
        now = self.clock()
        live = {j.job_id: j.summary(now) for j in list(self.jobs.values())}
        with self.db.sessions() as s:
            for row in s.scalars(select(JobRow).order_by(JobRow.last_seen.desc())):
                if row.id not in live:
                    live[row.id] = _job_row_summary(row)
        return sorted(live.values(), key=lambda j: j["last_seen"] or "", reverse=True)

    def get_job(self, job_id: str) -> dict[str, Any] | None:
        job = self.jobs.get(job_id)
        if job is not None:
            with job.lock:
                return job.detail(self.clock())
        return None

    def recent_ops(
        self, job_id: str, *, rank: int | None = None, group: str | None = None, limit: int = 1000
    ) -> list[dict[str, Any]] | None:
        job = self.jobs.get(job_id)
        if job is None:
            return None
        with job.lock:
            return job.recent.query(rank=rank, group=group, limit=limit)

    def queue_commands(
        self, job_id: str, kind: str, ranks: list[int] | None, **args: Any
    ) -> list[dict[str, Any]] | None:
        """Queue a command for some (or all) ranks of a live job; it rides on their next replies."""
        job = self.jobs.get(job_id)
        if job is None:
            return None
        now = self.clock()
        with job.lock:
            targets = sorted(job.ranks) if ranks is None else ranks
            unknown = [r for r in targets if r not in job.ranks]
            if unknown:
                raise ValueError(f"job {job_id!r} has no ranks {unknown}")
            cmds = [job.queue_command(r, kind, now, **args) for r in targets]
            return [{"id": c.id, "rank": c.rank, "type": c.type, **c.args} for c in cmds]

    def flight_recorder(self, job_id: str) -> dict[int, dict[str, Any]] | None:
        job = self.jobs.get(job_id)
        if job is None:
            return None
        with job.lock:
            return dict(job.flight_recorder)

    def set_policy(self, job_id: str, policy: dict[str, Any]) -> bool:
        """Store a job's remediation policy (validated by the caller); False for an unknown job."""
        job = self.jobs.get(job_id)
        if job is not None:
            self.persist([job])
        with self.db.sessions.begin() as s:
            row = s.get(JobRow, job_id)
            if row is None:
                return False
            row.policy = policy
        return True

    # -- persistence ------------------------------------------------------------------------------
    def load(self) -> int:
        """Bring back the jobs the database knows (after a restart): ranks, groups, policies."""
        now = self.clock()
        with self.db.sessions() as s:
            for row in s.scalars(select(JobRow)):
                job = JobState(row.id, row.first_seen)
                job.last_seen = row.last_seen
                job.world = row.world
                job.dirty = False
                for rr in s.scalars(select(RankRow).where(RankRow.job_id == row.id)):
                    job.ranks[rr.rank] = RankInfo(
                        rank=rr.rank,
                        node=rr.node,
                        incarnation=rr.incarnation,
                        first_seen=rr.first_seen,
                        last_seen=rr.last_seen,
                        pid=rr.pid,
                        restart=rr.restart,
                        state=rr.state,
                        ops=rr.ops,
                        drops=rr.drops,
                        batches=rr.batches,
                        last_batch=rr.last_batch,
                        end_reason=rr.end_reason,
                        meta=rr.meta or {},
                    )
                for gr in s.scalars(select(GroupRow).where(GroupRow.job_id == row.id)):
                    job.groups[gr.gid] = GroupInfo(
                        gid=gr.gid,
                        desc=gr.desc,
                        members=gr.members,
                        size=gr.size,
                        backend=gr.backend,
                        last_seq=gr.last_seq,
                        ops=gr.ops,
                        op_counts=dict(gr.op_counts or {}),
                    )
                job.records = sum(g.ops for g in job.groups.values())
                self.jobs[row.id] = job
        logger.info("loaded %d jobs from the database at %.0f", len(self.jobs), now)
        return len(self.jobs)

    def persist(self, jobs: list[JobState] | None = None) -> int:
        """Write every job (of ``jobs``, default all) that changed since the last write."""
        dirty = [j for j in (list(self.jobs.values()) if jobs is None else jobs) if j.dirty]
        if not dirty:
            return 0
        with self.db.sessions.begin() as s:
            for job in dirty:
                with job.lock:
                    job.dirty = False
                    s.merge(
                        JobRow(
                            id=job.job_id,
                            first_seen=job.first_seen,
                            last_seen=job.last_seen,
                            world=job.world,
                            state=job.state(),
                        )
                    )
                    for info in job.ranks.values():
                        s.merge(
                            RankRow(
                                job_id=job.job_id,
                                rank=info.rank,
                                node=info.node,
                                pid=info.pid,
                                incarnation=info.incarnation,
                                restart=info.restart,
                                state=info.state,
                                first_seen=info.first_seen,
                                last_seen=info.last_seen,
                                ops=info.ops,
                                drops=info.drops,
                                batches=info.batches,
                                last_batch=info.last_batch,
                                end_reason=info.end_reason,
                                meta=info.meta,
                            )
                        )
                    for g in job.groups.values():
                        s.merge(
                            GroupRow(
                                job_id=job.job_id,
                                gid=g.gid,
                                desc=g.desc,
                                members=g.members,
                                size=g.size,
                                backend=g.backend,
                                last_seq=g.last_seq,
                                ops=g.ops,
                                op_counts=dict(g.op_counts),
                            )
                        )
        return len(dirty)

    # -- analysis ---------------------------------------------------------------------------------
    def analyze_job(self, job: JobState, now: float) -> None:
        """Run the job's detector and reconcile its findings with the suspects in the database."""
        det = job.detector
        if det is None:
            return  # no batch since the service started: the suspects it had stay as they are
        with job.lock:
            findings = list(det.evaluate(now))
            ready = bool(det.ready(now))
        self.persist([job])  # the job row first: suspects refer to it
        self.suspects.reconcile(job.job_id, findings, ready, now)
        self._flight_recorder_for_hangs(job, findings, now)

    def _flight_recorder_for_hangs(self, job: JobState, findings: list[Any], now: float) -> None:
        """Ask the ranks of a stuck group for their Flight Recorder once; attach the aligned dumps."""
        keys = None
        for f in findings:
            ranks = list(getattr(f, "flight_recorder_ranks", None) or [])
            if not ranks:
                continue
            with job.lock:
                request = job.fr_requests.get(f.key)
                if request is None:
                    ranks = [r for r in ranks if r in job.ranks]
                    cmds = [job.queue_command(r, "dump_flight_recorder", now) for r in ranks]
                    job.fr_requests[f.key] = request = {c.rank: c.id for c in cmds}
                got = {
                    r: job.flight_recorder[r]["trace"]
                    for r, cid in request.items()
                    if r in job.flight_recorder and job.flight_recorder[r].get("command") == cid
                }
                members = {g.gid: g.members or sorted(g.reporters) for g in job.groups.values()}
            if not got:
                continue
            if keys is None:
                keys = self.suspects.open_keys(job.job_id)
            sid = keys.get(f.key)
            if sid is not None and len(got) > job.fr_attached.get(f.key, 0):
                aligned = align_dumps({r: got.get(r) for r in request}, members)
                self.suspects.attach_flight_recorder(sid, aligned)
                job.fr_attached[f.key] = len(got)

    # -- background loop --------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="rankwatch-analysis", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        try:
            self.persist()
        except Exception:
            logger.exception("final persist failed")

    def tick(self) -> None:
        """One pass: analyse every job, persist what changed (also called directly by tests)."""
        now = self.clock()
        for job in list(self.jobs.values()):
            for analyze in self.analyzers:
                try:
                    analyze(job, now)
                except Exception:
                    logger.exception("analysis of job %s failed", job.job_id)
        if now - self._last_persist >= PERSIST_EVERY_S:
            self._last_persist = now
            self.persist()

    def _run(self) -> None:
        interval = self.settings.analysis_interval_s
        while not self._stop.wait(interval):
            try:
                self.tick()
            except Exception:
                logger.exception("analysis loop error")


def _check_membership(batch: Batch) -> None:
    rank = batch.header["rank"]
    for i, g in enumerate(batch.header["groups"]):
        runs = g.get("ranks")
        if runs and not any(start <= rank < stop and (rank - start) % step == 0 for start, stop, step in runs):
            raise WireError(f"rank {rank} reports groups[{i}] ({g['id']!r}) but is not one of its members")


def _job_row_summary(row: JobRow) -> dict[str, Any]:
    return {
        "id": row.id,
        "world": row.world,
        "ranks_seen": None,
        "nodes": None,
        "first_seen": iso(row.first_seen),
        "last_seen": iso(row.last_seen),
        "state": row.state,
        "rank_states": {},
        "ops": None,
        "groups": None,
    }
