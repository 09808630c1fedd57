"""The FastAPI application: REST routes over the collector, with auth and error mapping in one place.

``create_app(settings)`` builds everything; nothing connects to a database before the app's
lifespan starts. Domain errors become HTTP answers in ``_install_error_handlers`` only.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal

from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field
from sqlalchemy.exc import OperationalError

from rankwatch import __version__
from rankwatch.api.auth import TokenStore
from rankwatch.api.delivery import WebhookDispatcher
from rankwatch.api.deps import AdminDep, CollectorDep, IngestDep, ReadDep
from rankwatch.api.ingest import INGEST_CONTENT_TYPES, FastIngestAPI
from rankwatch.api.remediation import Executor, make_router
from rankwatch.api.webhooks import router as webhooks_router
from rankwatch.blockwire import BLOCK_CONTENT_TYPE
from rankwatch.collector.db import open_database
from rankwatch.collector.routing import FORWARDED_HEADER, IngestRouter
from rankwatch.collector.service import Collector
from rankwatch.collector.settings import Settings
from rankwatch.errors import AuthError, WireError
from rankwatch.multibatch import MULTI_CONTENT_TYPE
from rankwatch.wire import CONTENT_TYPE

__all__ = ["create_app"]

logger = logging.getLogger(__name__)


def create_app(
    settings: Settings | None = None,
    *,
    collector: Collector | None = None,
    webhooks: WebhookDispatcher | None = None,
) -> FastAPI:
    """Build the service.

    Args:
        settings: the service's settings (default: from the environment).
        collector: an already built collector (tests); by default one is built at start-up on
            ``settings.database_url`` and its background loop started.
        webhooks: the webhook delivery worker (tests pass one with a pinned resolver); by default
            one is built. Either way it starts with the app and delivers from the collector's database.
    """
    settings = settings or Settings()
    dispatcher = webhooks or WebhookDispatcher(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        own = collector is None
        if own:
            db = open_database(settings.database_url)
            app.state.collector = Collector(settings, db, detector_factory=_detector_factory())
            app.state.collector.load()
            app.state.collector.start()
        dispatcher.start(app.state.collector.db)
        app.state.executor = Executor(app.state.collector)
        if own:
            app.state.executor.start()
        try:
            yield
        finally:
            dispatcher.stop()
            await app.state.router.aclose()
            if own:
                app.state.executor.stop()
                app.state.collector.stop()
                app.state.collector.db.close()

    app = FastIngestAPI(
        title="rankwatch",
        version=__version__,
        description="Which rank, node or link is slowing or hanging your distributed training job.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.tokens = TokenStore(settings)
    app.state.webhooks = dispatcher
    app.state.router = IngestRouter()
    if collector is not None:
        app.state.collector = collector
    _install_error_handlers(app)
    _install_routes(app, settings)
    app.include_router(webhooks_router)
    app.include_router(make_router())
    return app


def _detector_factory() -> Callable[[str], Any] | None:
    try:
        from rankwatch.detector import DetectorConfig, JobDetector
    except ImportError:
        return None

    def make(_job_id: str) -> Any:
        return JobDetector(DetectorConfig())

    return make


def _metrics_text(collector: Collector) -> str:
    from sqlalchemy import func, select

    from rankwatch.collector.models import DeliveryRow, SuspectRow

    lines: list[str] = []

    def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP {name} {help_}")
        lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            lines.append(f"{name}{labels} {value:g}")

    st = collector.stats
    metric("rankwatch_ingest_batches_total", "counter", "Batches accepted.", [("", st["batches"])])
    metric("rankwatch_ingest_records_total", "counter", "Op records accepted.", [("", st["records"])])
    metric("rankwatch_ingest_duplicates_total", "counter", "Replayed batches dropped.", [("", st["duplicates"])])
    metric("rankwatch_ingest_rejected_total", "counter", "Batches refused with a 4xx.", [("", st["rejected"])])
    metric("rankwatch_jobs_in_memory", "gauge", "Jobs this process analyses now.", [("", len(collector.jobs))])
    with collector.db.sessions() as s:
        sus = s.execute(
            select(SuspectRow.kind, SuspectRow.status, func.count()).group_by(SuspectRow.kind, SuspectRow.status)
        ).all()
        dels = s.execute(select(DeliveryRow.status, func.count()).group_by(DeliveryRow.status)).all()
    metric(
        "rankwatch_suspects",
        "gauge",
        "Suspects in the database by kind and status.",
        [(f'{{kind="{k}",status="{st_}"}}', n) for k, st_, n in sus],
    )
    metric(
        "rankwatch_webhook_deliveries",
        "gauge",
        "Webhook deliveries by status.",
        [(f'{{status="{st_}"}}', n) for st_, n in dels],
    )
    return "\n".join(lines) + "\n"


class CommandCreate(BaseModel):
    """A command for the ranks of a live job, delivered in the replies to their next batches."""

    type: Literal["exit", "dump_flight_recorder"]
    ranks: list[int] | None = Field(None, description="which ranks (default: every rank of the job)")
    code: int = Field(1, ge=0, le=255, description="exit code, for type=exit")
    reason: str = Field("", max_length=500, description="why, shown in the ranks' logs")
    at_seq: int | None = Field(
        None,
        ge=1,
        description="for type=exit: exit on the training thread just before op at_seq of `group`, the same point "
        "on every rank, after running the script's on_restart callbacks (e.g. a collective checkpoint)",
    )
    group: str | None = Field(None, description="the group at_seq counts in (default: the world group, '0')")
    timeout_s: float = Field(60.0, gt=0, le=3600, description="with at_seq: exit anyway after this long")


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(AuthError)
    async def _auth(_request: Request, exc: AuthError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return JSONResponse({"detail": str(exc)}, status_code=exc.status, headers=headers)

    @app.exception_handler(WireError)
    async def _wire(_request: Request, exc: WireError) -> JSONResponse:
        return JSONResponse({"detail": f"malformed batch: {exc}"}, status_code=400)

    @app.exception_handler(ValueError)
    async def _invalid(_request: Request, exc: ValueError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=422)

    @app.exception_handler(PermissionError)
    async def _forbidden(_request: Request, exc: PermissionError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=403)

    @app.exception_handler(OperationalError)
    async def _database_down(_request: Request, exc: OperationalError) -> JSONResponse:
        logger.warning("database unavailable: %s", type(exc.orig).__name__)
        return JSONResponse({"detail": "the database is unavailable; retry"}, status_code=503)


def _install_routes(app: FastAPI, settings: Settings) -> None:
    max_body = int(settings.max_body_mb * 1024 * 1024)

    @app.get("/healthz", tags=["service"])
    def read_health(request: Request) -> dict[str, Any]:
        """Liveness: open to everyone, says nothing secret."""
        c = getattr(request.app.state, "collector", None)
        return {"ok": True, "version": __version__, "jobs": len(c.jobs) if c is not None else 0}

    @app.get("/metrics", tags=["service"], response_class=Response)
    def read_metrics(_: ReadDep, collector: CollectorDep) -> Response:
        """Prometheus metrics (text format 0.0.4): ingest counters, jobs in memory, suspects by kind
        and status, webhook deliveries by status. Needs a read token like every other GET."""
        return Response(_metrics_text(collector), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/ingest", tags=["ingest"])
    async def create_batch(request: Request, principal: IngestDep, collector: CollectorDep) -> Response:
        """Take one batch from a rank (wire format, ``Content-Type: application/vnd.rankwatch.batch``),
        block summaries of one or more ranks (``application/vnd.rankwatch.blocks``), or several
        ranks' batches from ``rankwatch agent`` (``application/vnd.rankwatch.multibatch``,
        answered ``{"results": [...]}``, one reply per batch).

        The reply carries the commands waiting for that rank. With several service processes,
        a batch of a job another process analyses is forwarded there and its reply relayed.
        """
        ctype = request.headers.get("content-type", "").split(";")[0].strip()
        if ctype not in INGEST_CONTENT_TYPES:
            raise HTTPException(
                415,
                f"batches must be sent as {CONTENT_TYPE}, {BLOCK_CONTENT_TYPE} or {MULTI_CONTENT_TYPE}, "
                f"not {ctype or 'no content type'}",
            )
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > max_body:
            raise HTTPException(413, f"batch is {length} bytes; the limit is {max_body}")
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > max_body:
                raise HTTPException(413, f"batch is larger than the limit of {max_body} bytes")
        router: IngestRouter = request.app.state.router
        auth = request.headers.get("authorization")
        forwarded = FORWARDED_HEADER.lower() in request.headers
        if ctype == MULTI_CONTENT_TYPE:
            multi = await router.ingest_multi(
                collector, bytes(body), bound_job=principal.job, authorization=auth, forwarded=forwarded
            )
            return JSONResponse(multi)
        status, reply = await router.ingest(
            collector, bytes(body), bound_job=principal.job, authorization=auth, forwarded=forwarded
        )
        return JSONResponse(reply, status_code=status)

    @app.get("/jobs", tags=["jobs"])
    def read_jobs(_: ReadDep, collector: CollectorDep) -> list[dict[str, Any]]:
        """Jobs the service has seen, most recent first."""
        return collector.list_jobs()

    @app.get("/jobs/{job_id}", tags=["jobs"])
    def read_job(job_id: str, _: ReadDep, collector: CollectorDep) -> dict[str, Any]:
        """One job: its ranks (node, pid, last seen, ops, drops), groups (members, last sequence
        number, op counts by kind) and the ranks of each node."""
        job = collector.get_job(job_id)
        if job is None:
            raise HTTPException(404, f"no job {job_id!r}")
        return job

    @app.get("/jobs/{job_id}/summaries", tags=["jobs"])
    def read_job_summaries(
        job_id: str,
        _: ReadDep,
        collector: CollectorDep,
        group: str | None = None,
        since: Annotated[float | None, Query(description="window start at or after, seconds since the epoch")] = None,
        until: Annotated[float | None, Query(description="window start before, seconds since the epoch")] = None,
        limit: Annotated[int, Query(ge=1, le=100_000)] = 1000,
    ) -> list[dict[str, Any]]:
        """Per-group summaries over time, newest window first: op records, bytes, ranks reporting,
        and in-collective time (sum, min, p50, p99, max) per group per window
        (``RANKWATCH_SUMMARY_WINDOW_S``). Written every ``RANKWATCH_PERSIST_INTERVAL_S``."""
        if not collector.knows_job(job_id):
            raise HTTPException(404, f"no job {job_id!r}")
        return collector.summaries(job_id, group=group, since=since, until=until, limit=limit)

    @app.get("/jobs/{job_id}/ops", tags=["jobs"])
    def read_job_ops(
        job_id: str,
        _: ReadDep,
        collector: CollectorDep,
        rank: int | None = None,
        group: str | None = None,
        limit: Annotated[int, Query(ge=1, le=100_000)] = 1000,
    ) -> list[dict[str, Any]]:
        """The newest raw op records the service still holds in memory for a job (oldest first),
        optionally of one rank and/or one group. Times are on each rank's own monotonic clock."""
        ops = collector.recent_ops(job_id, rank=rank, group=group, limit=limit)
        if ops is None:
            raise HTTPException(404, f"no live job {job_id!r}")
        return ops

    @app.post("/jobs/{job_id}/commands", tags=["jobs"], status_code=202)
    def create_commands(job_id: str, body: CommandCreate, _: AdminDep, collector: CollectorDep) -> list[dict[str, Any]]:
        """Queue a command for ranks of a live job: ``dump_flight_recorder`` (PyTorch's own ring,
        served by ``GET /jobs/{job_id}/flight-recorder``) or ``exit`` with a code (honoured only by
        jobs that set ``RANKWATCH_CONTROL=1``; others ignore and count it)."""
        args: dict[str, Any] = {"reason": body.reason} if body.reason else {}
        if body.type == "exit":
            args["code"] = body.code
            if body.at_seq is not None:
                args.update(at_seq=body.at_seq, group=body.group or "0", timeout_s=body.timeout_s)
        queued = collector.queue_commands(job_id, body.type, body.ranks, **args)
        if queued is None:
            raise HTTPException(404, f"no live job {job_id!r}")
        return queued

    @app.get("/jobs/{job_id}/commands", tags=["jobs"])
    def read_commands(job_id: str, _: ReadDep, collector: CollectorDep) -> list[dict[str, Any]]:
        """Commands queued for a job's ranks and whether each was done or ignored."""
        job = collector.jobs.get(job_id)
        if job is None:
            raise HTTPException(404, f"no live job {job_id!r}")
        with job.lock:
            return job.command_status()

    @app.get("/suspects", tags=["suspects"])
    def read_suspects(
        _: ReadDep,
        collector: CollectorDep,
        job_id: str | None = None,
        status: Literal["active", "resolved", "isolated"] | None = None,
        kind: Literal["noncomm_slow", "comm_slow", "noncomm_hang", "comm_hang", "rank_dead"] | None = None,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 500,
    ) -> list[dict[str, Any]]:
        """Suspects, newest first: who is slowing or hanging a job, since when, how much, and why."""
        return collector.suspects.list(job_id=job_id, status=status, kind=kind, limit=limit)

    @app.get("/suspects/{suspect_id}", tags=["suspects"])
    def read_suspect(suspect_id: int, _: ReadDep, collector: CollectorDep) -> dict[str, Any]:
        """One suspect with its evidence and history."""
        s = collector.suspects.get(suspect_id)
        if s is None:
            raise HTTPException(404, f"no suspect {suspect_id}")
        return s

    @app.get("/suspects/{suspect_id}/flight-recorder", tags=["suspects"])
    def read_suspect_flight_recorder(suspect_id: int, _: ReadDep, collector: CollectorDep) -> dict[str, Any]:
        """For a hang: the Flight Recorder dumps of the stuck group's ranks, aligned by group and
        sequence number (the first sequence number some members never reached, and who)."""
        fr = collector.suspects.flight_recorder(suspect_id)
        if fr is None:
            raise HTTPException(404, f"no suspect {suspect_id}")
        return fr

    @app.get("/jobs/{job_id}/stacks", tags=["jobs"])
    def read_stacks(job_id: str, _: ReadDep, collector: CollectorDep) -> dict[str, str | None]:
        """The last Python stack each rank's training thread sent (ranks send it when an op is
        stuck in flight, or when they have entered no collective for a while)."""
        job = collector.jobs.get(job_id)
        if job is None:
            raise HTTPException(404, f"no live job {job_id!r}")
        with job.lock:
            return {str(r): job.ranks[r].stack for r in sorted(job.ranks)}

    @app.get("/jobs/{job_id}/flight-recorder", tags=["jobs"])
    def read_flight_recorder(job_id: str, _: ReadDep, collector: CollectorDep) -> dict[str, Any]:
        """The latest Flight Recorder dump each rank sent (after a ``dump_flight_recorder`` command)."""
        dumps = collector.flight_recorder(job_id)
        if dumps is None:
            raise HTTPException(404, f"no live job {job_id!r}")
        return {str(rank): d for rank, d in sorted(dumps.items())}
