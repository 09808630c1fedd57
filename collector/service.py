"""The collector: takes batches, keeps per-job state, persists it, and runs the analysis loop.

``Collector.ingest`` is the whole ingest path: decode (columnar, no Python object per op),
validate, de-duplicate, fold into the job's state, hand the records to the job's detector, and
return the commands waiting for that rank. A background thread persists what changed and runs
each job's analysis; it never blocks ingest for long (a job's lock is held per job, briefly).

Several service processes may share one database: a process analyses only the jobs whose lease
it holds (``leases.py``); ``ingest`` raises ``NotHolder`` for the others, and the router forwards
those batches to the holder. A second thread keeps the leases: renews them, takes over those of
dead holders, and lets jobs that went quiet go (written out, lease released, memory freed).
What ``ingest`` acknowledged reaches the database within ``persist_interval_s``; raw records
never do.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from rankwatch.blockwire import BlockBody, check_membership, decode_blocks, is_block_body
from rankwatch.collector.actions import ActionBook
from rankwatch.collector.db import Database, upsert
from rankwatch.collector.flight import align_dumps
from rankwatch.collector.jobs import GroupInfo, JobChanges, JobState, RankInfo, iso, records_per_rank
from rankwatch.collector.leases import LeaseManager, NotHolder
from rankwatch.collector.models import GroupRow, GroupSummaryRow, JobRow, RankRow
from rankwatch.collector.policy import Policy
from rankwatch.collector.retention import purge
from rankwatch.collector.settings import Settings
from rankwatch.collector.suspects import SuspectStore
from rankwatch.errors import WireError
from rankwatch.wire import Batch, decode_batch

__all__ = ["Collector", "IngestResult"]

logger = logging.getLogger(__name__)


class IngestResult(dict[str, Any]):
    """The JSON reply to a batch: ``accepted`` records, ``duplicate``, ``commands`` for the rank."""


_FOLD_TURN_ROWS = 4096
"""Rows of held batches the analysis loop folds per turn of a job's lock (a few ms)."""


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
        self.actions = ActionBook(
            db,
            Policy(mode=settings.policy, actuator=settings.actuator, actuator_options=dict(settings.actuator_options)),
        )
        self.suspects = SuspectStore(db, actions=self.actions)
        self._last_cleanup = 0.0
        self.analyzers: list[Callable[[JobState, float], None]] = [self.analyze_job]
        self.instance = uuid.uuid4().hex[:12]
        self.leases = LeaseManager(
            db, instance=self.instance, url=settings.peer_url, ttl_s=settings.lease_ttl_s, clock=clock
        )
        self._lease_thread: threading.Thread | None = None
        self._persist_lock = threading.Lock()

    # -- ingest -----------------------------------------------------------------------------------
    def ingest(self, body: bytes, *, bound_job: str | None = None) -> IngestResult:
        """Take one batch: raw (``rankwatch.wire``) or block summaries (``rankwatch.blockwire``),
        told apart by their magic bytes.

        Args:
            body: the request body, in the wire format.
            bound_job: the job the caller's token is limited to, if any.

        Raises:
            WireError: the batch is malformed; nothing of it was taken.
            PermissionError: the token is bound to another job.
        """
        if is_block_body(body):
            return self.ingest_blocks(body, bound_job=bound_job)
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
            self._detect(job, lambda det: det.observe(batch, now))
            commands = job.commands_for(h["rank"], now)
        self.stats["batches"] += 1
        self.stats["records"] += len(batch.records)
        return IngestResult(accepted=len(batch.records), duplicate=False, commands=commands)

    def ingest_blocks(self, body: bytes, *, bound_job: str | None = None) -> IngestResult:
        """Take one block batch (one rank's, many ranks' from an aggregator, or ranks' own bodies
        merged by ``rankwatch agent``).

        The reply is a raw batch's (``accepted`` counts the op records the blocks stand for),
        plus ``block_seqs``: the block size of each group whose entry did not use the settled
        one. Commands carry a ``rank`` key, as a body may speak for several ranks.

        A merged body (``rankwatch.blockmerge``: flag bit 1) is decoded, folded into the job and
        given to the detector once, and answered ``{"results": [...]}``: for each rank, in the
        order of its rank objects, what its own body would have got (``status`` 200,
        ``accepted``, ``duplicate``, that rank's ``commands``, ``block_seqs`` for its groups).
        Ranks are de-duplicated one by one; a body that fails the checks is refused as a whole.

        Raises:
            WireError, PermissionError: as ``ingest``.
        """
        try:
            got = decode_blocks(body)
            if bound_job is not None and got.job != bound_job:
                raise PermissionError(f"this ingest token may only send batches for job {bound_job!r}")
            check_membership(got.batch)
        except (WireError, PermissionError):
            self.stats["rejected"] += 1
            raise
        now = self.clock()
        job = self._job(got.job, now)
        with job.lock:
            fresh = job.fresh_ranks(got)
            bb = job.apply_blocks(got, now, fresh)
            told = job.entry_block_sizes(got.batch.groups)
            if bb is not None:
                job.wire_bytes += len(body)
                self._detect(job, lambda det: det.observe_blocks(bb, now))
            if got.per_rank:
                results = _rank_results(job, got, fresh, told, now)
            else:
                ranks = [int(r["rank"]) for r in got.rank_info]
                commands = [c | {"rank": r} for r in ranks for c in job.commands_for(r, now)]
                sizes = {g["id"]: size for g, size in zip(got.batch.groups, told, strict=True) if size is not None}
        accepted = 0 if bb is None else int(bb.blocks["count"].sum(dtype="int64"))
        self.stats["records"] += accepted
        if got.per_rank:
            n_fresh = sum(fresh)
            self.stats["batches"] += n_fresh
            self.stats["duplicates"] += len(fresh) - n_fresh
            return IngestResult(results=results)
        if bb is None:
            self.stats["duplicates"] += 1
            return IngestResult(accepted=0, duplicate=True, commands=commands, block_seqs=sizes)
        self.stats["batches"] += 1
        return IngestResult(accepted=accepted, duplicate=False, commands=commands, block_seqs=sizes)

    def _detect(self, job: JobState, feed: Callable[[Any], None]) -> None:
        """Hand a batch to the job's detector, made on first use; a detector that fails loses the
        batch's analysis only, never the batch."""
        if job.detector is None and self.detector_factory is not None:
            job.detector = self.detector_factory(job.job_id)
        if job.detector is None:
            return
        try:
            feed(job.detector)
        except Exception:
            logger.exception("detector failed on a batch of job %s", job.job_id)

    def _job(self, job_id: str, now: float) -> JobState:
        """The job's state, if this process holds (or can take) its lease.

        Raises:
            NotHolder: another process analyses the job.
        """
        holder = self.leases.owner(job_id, now)
        if holder is not None:
            self._evict(job_id)
            raise NotHolder(job_id, holder)
        job = self.jobs.get(job_id)
        if job is not None:
            return job
        with self._jobs_lock:
            job = self.jobs.get(job_id)
            if job is None:
                with self.db.sessions() as s:
                    job = self._read_job(s, job_id, now) or self._new_job(job_id, now)
                self.jobs[job_id] = job
            return job

    def _new_job(self, job_id: str, now: float) -> JobState:
        return JobState(job_id, now, summary_window_s=self.settings.summary_window_s)

    def _evict(self, job_id: str) -> None:
        """Forget a job this process no longer analyses (its state is in the database)."""
        with self._jobs_lock:
            if self.jobs.pop(job_id, None) is not None:
                logger.info("job %s is analysed by another process now", job_id)

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
        """A job as this process knows it live, else as the database last had it."""
        now = self.clock()
        job = self.jobs.get(job_id)
        if job is not None:
            with job.lock:
                return job.detail(now) | {"live": True}
        with self.db.sessions() as s:
            stored = self._read_job(s, job_id, now)
        if stored is None:
            return None
        return stored.detail(now) | {"live": False}

    def knows_job(self, job_id: str) -> bool:
        """Whether this process or the database has heard of the job."""
        if job_id in self.jobs:
            return True
        with self.db.sessions() as s:
            return s.get(JobRow, job_id) is not None

    def summaries(
        self,
        job_id: str,
        *,
        group: str | None = None,
        since: float | None = None,
        until: float | None = None,
        limit: int = 1000,
    ) -> list[dict[str, Any]]:
        """The job's per-group summary rows, newest window first."""
        from rankwatch.collector.summaries import summary_public

        q = select(GroupSummaryRow).where(GroupSummaryRow.job_id == job_id)
        if group is not None:
            q = q.where(GroupSummaryRow.gid == group)
        if since is not None:
            q = q.where(GroupSummaryRow.window_start >= since)
        if until is not None:
            q = q.where(GroupSummaryRow.window_start < until)
        q = q.order_by(GroupSummaryRow.window_start.desc(), GroupSummaryRow.gid).limit(limit)
        with self.db.sessions() as s:
            return [summary_public(r) for r in s.scalars(q)]

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
            with job.lock:
                job.policy = policy
            self.persist([job])
        with self.db.sessions.begin() as s:
            row = s.get(JobRow, job_id)
            if row is None:
                return False
            row.policy = policy
        return True

    # -- persistence ------------------------------------------------------------------------------
    def load(self) -> int:
        """Pick up after a restart: take back the leases an earlier life of this process (same
        advertised URL) held, and load those jobs (ranks, groups, policies, open summary windows).
        Other jobs are read from the database when asked for, or loaded when a batch comes."""
        now = self.clock()
        taken = 0
        for job_id in self.leases.previous_life():
            try:
                self._job(job_id, now)
                taken += 1
            except NotHolder:
                pass
        if taken:
            logger.info("took back %d jobs this process analysed before a restart", taken)
        return taken

    def _read_job(self, s: Session, job_id: str, now: float) -> JobState | None:
        """A job's state as the database has it, or ``None`` if it has never been written."""
        row = s.get(JobRow, job_id)
        if row is None:
            return None
        job = self._new_job(row.id, row.first_seen)
        job.last_seen = row.last_seen
        job.world = row.world
        job.policy = row.policy
        job.dirty = False
        job.stored = True
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
                members_dirty=False,
            )
        job.records = sum(g.ops for g in job.groups.values())
        current = job.summaries.window_start(now)
        for sr in s.scalars(
            select(GroupSummaryRow).where(GroupSummaryRow.job_id == row.id, GroupSummaryRow.window_start >= current)
        ):
            job.summaries.restore(sr)
        return job

    def persist(self, jobs: list[JobState] | None = None) -> int:
        """Write what changed in every job (of ``jobs``, default all) since the last write.

        One transaction for all of them; only the rows that changed, each table in one
        statement. Jobs whose lease this process lost meanwhile are not written, and forgotten.
        """
        with self._persist_lock:  # one writer at a time, or an older snapshot could land last
            return self._persist(jobs)

    def _persist(self, jobs: list[JobState] | None) -> int:
        now = self.clock()
        pending: list[tuple[JobState, JobChanges]] = []
        for job in list(self.jobs.values()) if jobs is None else jobs:
            with job.lock:
                changes = job.take_changes(now, self.instance)
            if changes is not None:
                job.summaries.fold(changes.queued)  # outside the job's lock: ingest goes on
                changes.summaries, changes.window_keys = job.summaries.take_rows(job.job_id, self.instance, now)
                pending.append((job, changes))
        if not pending:
            return 0
        lost: set[str] = set()
        try:
            with self.db.sessions.begin() as s:
                held = self.leases.guard(s, [j.job_id for j, _ in pending])
                lost = {j.job_id for j, _ in pending} - held
                mine = [c for j, c in pending if j.job_id in held]
                upsert(s, JobRow.__table__, [c.job for c in mine], update=["last_seen", "world", "state"])  # type: ignore[arg-type]
                upsert(s, RankRow.__table__, [r for c in mine for r in c.ranks])  # type: ignore[arg-type]
                upsert(s, GroupRow.__table__, [g for c in mine for g in c.groups])  # type: ignore[arg-type]
                upsert(s, GroupRow.__table__, [g for c in mine for g in c.groups_with_members])  # type: ignore[arg-type]
                upsert(s, GroupSummaryRow.__table__, [r for c in mine for r in c.summaries])  # type: ignore[arg-type]
        except Exception:
            for job, changes in pending:
                with job.lock:
                    job.put_back(changes)
            raise
        for job, _ in pending:
            job.stored = job.stored or job.job_id not in lost
        for job_id in lost:
            self._evict(job_id)
        return len(pending) - len(lost)

    # -- analysis ---------------------------------------------------------------------------------
    def analyze_job(self, job: JobState, now: float) -> None:
        """Run the job's detector and reconcile its findings with the suspects in the database."""
        det = job.detector
        if det is None:
            return  # no batch since the service started: the suspects it had stay as they are
        # fold what the detector holds in short turns: ingest of this job waits on the lock meanwhile
        with job.lock:
            turns = getattr(det, "held_rows", 0) // _FOLD_TURN_ROWS
        for _ in range(turns):
            with job.lock:
                if not det.fold(_FOLD_TURN_ROWS):
                    break
        with job.lock:
            findings = list(det.evaluate(now))
            ready = bool(det.ready(now))
        if not job.stored:
            self.persist([job])  # the job row first: suspects refer to it
        self.suspects.reconcile(
            job.job_id, findings, ready, now, guard=lambda s: bool(self.leases.guard(s, [job.job_id]))
        )
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
        self._lease_thread = threading.Thread(target=self._keep_leases, name="rankwatch-leases", daemon=True)
        self._lease_thread.start()

    def stop(self) -> None:
        """Stop the loops, write what changed, and release the leases (others may take the jobs
        at once)."""
        self._stop.set()
        for t in (self._thread, self._lease_thread):
            if t is not None:
                t.join(timeout=10)
        try:
            self.persist()
        except Exception:
            logger.exception("final persist failed")
        try:
            self.leases.release()
        except Exception:
            logger.exception("releasing the leases failed")

    def tick(self) -> None:
        """One pass: analyse every job, persist what changed (also called directly by tests)."""
        now = self.clock()
        for job in list(self.jobs.values()):
            for analyze in self.analyzers:
                try:
                    analyze(job, now)
                except Exception:
                    logger.exception("analysis of job %s failed", job.job_id)
        if now - self._last_persist >= self.settings.persist_interval_s:
            self._last_persist = now
            self.persist()
        if now - self._last_cleanup >= self.settings.cleanup_interval_s:
            self._last_cleanup = now
            purge(self.db, self.settings, now)

    def _run(self) -> None:
        interval = self.settings.analysis_interval_s
        while not self._stop.wait(interval):
            try:
                self.tick()
            except Exception:
                logger.exception("analysis loop error")

    # -- leases -----------------------------------------------------------------------------------
    def keep_leases(self) -> None:
        """One pass of the lease thread: renew, let idle jobs go, take over dead holders' jobs."""
        now = self.clock()
        for job_id in self.leases.renew(list(self.jobs)):
            self._evict(job_id)
        idle = [j for j in list(self.jobs.values()) if now - j.last_seen > self.settings.job_idle_s]
        if idle:
            self.persist(idle)
            self.leases.release([j.job_id for j in idle])
            for j in idle:
                with self._jobs_lock:
                    self.jobs.pop(j.job_id, None)
            logger.info("let %d idle jobs go", len(idle))
        for job_id in self.leases.expired():
            try:
                self._job(job_id, now)
                logger.info("took over job %s from a holder that stopped renewing its lease", job_id)
            except NotHolder:
                pass

    def _keep_leases(self) -> None:
        while not self._stop.wait(self.settings.lease_ttl_s / 3):
            try:
                self.keep_leases()
            except Exception:
                logger.exception("lease loop error")


def _check_membership(batch: Batch) -> None:
    rank = batch.header["rank"]
    for i, g in enumerate(batch.header["groups"]):
        runs = g.get("ranks")
        if runs and not any(start <= rank < stop and (rank - start) % step == 0 for start, stop, step in runs):
            raise WireError(f"rank {rank} reports groups[{i}] ({g['id']!r}) but is not one of its members")


def _rank_results(
    job: JobState, got: BlockBody, fresh: list[bool], told: list[int | None], now: float
) -> list[dict[str, Any]]:
    """Each rank's own answer to a merged block body (call under the job's lock)."""
    bb = got.batch
    records = records_per_rank(bb)
    tell = any(size is not None for size in told)
    out: list[dict[str, Any]] = []
    for info, new, n_records in zip(got.rank_info, fresh, records, strict=True):
        rank = int(info["rank"])
        sizes: dict[str, int] = {}
        if tell:
            for e in info["group_entries"]:
                size = told[e]
                if size is not None:
                    sizes[bb.groups[e]["id"]] = size
        out.append(
            {
                "status": 200,
                "accepted": n_records if new else 0,
                "duplicate": not new,
                "commands": [c | {"rank": rank} for c in job.commands_for(rank, now)],
                "block_seqs": sizes,
            }
        )
    return out


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
