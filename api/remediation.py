"""Remediation: the executor that runs approved actions through actuators, and its REST routes.

The collector records actions (``rankwatch.collector.actions``); this module claims approved
ones, builds the actuator the job's policy names, runs the step, records what it did, and, after
an automatic isolation, records the recovery (restart from checkpoint) the policy asks for. A
restart through the control channel asks every rank to exit just before the same op of the world
group, so scripts that registered ``rankwatch.hooks.on_restart`` checkpoint first.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Query, Request
from pydantic import BaseModel, Field
from sqlalchemy import select

from rankwatch.api.actuators import Actuator, StepResult, Target, make_actuator
from rankwatch.api.deps import AdminDep, ReadDep
from rankwatch.collector.actions import AUTO, ActionBook
from rankwatch.collector.models import ActionRow, RankRow
from rankwatch.collector.service import Collector

__all__ = ["Executor", "make_router"]

logger = logging.getLogger(__name__)


class Executor:
    """Runs approved actions, one at a time, on a background thread."""

    def __init__(self, collector: Collector, *, interval_s: float = 0.5, clock: Any = time.time) -> None:
        self.collector = collector
        self.book: ActionBook = collector.actions
        self.interval_s = interval_s
        self.clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.actuator_override: Actuator | None = None  # tests inject a recording actuator here
        self.comeback_timeout_s = 180.0
        self._before: dict[tuple[str, str], set[str]] = {}  # (job, node) -> incarnations at isolation

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="rankwatch-actions", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if not self.run_once():
                    self._stop.wait(self.interval_s)
            except Exception:
                logger.exception("action executor error")
                self._stop.wait(self.interval_s)

    def run_once(self) -> bool:
        """Run the next approved action, if any; returns whether there was one."""
        row = self.book.claim(self.clock())
        if row is None:
            return False
        try:
            self._execute(row)
        except Exception as exc:
            logger.exception("action %s failed", row.id)
            self.book.finish(row.id, False, [], f"{type(exc).__name__}: {exc}", self.clock())
        return True

    def _execute(self, row: ActionRow) -> None:
        with self.book.db.sessions() as s:
            policy = self.book.policy(s, row.job_id)
        actuator = self.actuator_override or make_actuator(policy.actuator, policy.actuator_options)
        target = self._target(row)
        dry = bool(row.dry_run)
        result: StepResult
        if row.type == "isolate":
            before = self._incarnations(row.job_id)
            result = actuator.isolate(target, dry_run=dry)
            if result.ok and not dry:
                self._before[(row.job_id, target.node)] = before
        elif row.type == "restart" and self._launcher_restarts(actuator, row):
            result = self._await_comeback(row.job_id, target.node)
        elif row.type == "restart":
            before = self._incarnations(row.job_id)
            result = actuator.restart(target, self._request_exit(policy.exit_code), dry_run=dry)
            if result.ok and not dry and result.data.get("commands"):
                # the ranks were told to exit: "succeeded" means the launcher brought them back
                back = self._await_comeback(
                    row.job_id, None, before, since="the exit commands", commands=result.data["commands"]
                )
                result = StepResult(back.ok, f"{result.output}\n{back.output}", {**result.data, **back.data})
        elif row.type == "swap":
            standby = None if dry else self.book.take_standby(row.job_id, None, self.clock())
            result = actuator.swap(Target(**{**target.__dict__, "standby": standby}), dry_run=dry)
            if standby:
                result.data["standby"] = standby
        else:
            result = StepResult(False, f"unknown action type {row.type!r}")
        now = self.clock()
        step = {"at": None, "actor": f"actuator {getattr(actuator, 'name', '?')}", "step": row.type, **result.public()}
        from rankwatch.collector.jobs import iso

        step["at"] = iso(now)
        error = None if result.ok else result.output[-500:]
        self.book.finish(row.id, result.ok, [step], error, now, refused=result.refused)
        if result.ok and not dry and row.type == "isolate" and row.actor == AUTO and policy.recovery == "restart":
            self.book.follow_up(row, "restart", now)

    def _incarnations(self, job_id: str) -> set[str]:
        job = self.collector.jobs.get(job_id)
        if job is None:
            return set()
        with job.lock:
            return {r.incarnation for r in job.ranks.values()}

    def _launcher_restarts(self, actuator: Actuator, row: ActionRow) -> bool:
        """A restart after an isolation the launcher answers by itself (torchrun re-rendezvousing
        without a stopped agent): telling the ranks to exit too would cost a second restart."""
        if row.dry_run or not getattr(actuator, "restarts_on_isolate", False) or not row.node:
            return False
        with self.book.db.sessions() as s:
            return row.node in self.book.isolated_nodes(s, row.job_id)

    def _await_comeback(
        self,
        job_id: str,
        node: str | None,
        before: set[str] | None = None,
        since: str = "the isolation",
        commands: Sequence[str] = (),
    ) -> StepResult:
        """Wait until ranks of a new incarnation (none on ``node``) are stepping: each has recorded
        ops since the collector first heard from it — a process that only said hello is not enough.
        If every one of ``commands`` (exit commands) came back ignored, nothing will restart: fail now."""
        if before is None and node is not None:
            before = self._before.pop((job_id, node), None)
        if before is None:
            before = self._incarnations(job_id)
        without = f" without {node}" if node else ""
        start = self.clock()
        first_ops: dict[str, int] = {}  # new incarnation -> the rank's op count when first seen
        deadline = time.monotonic() + self.comeback_timeout_s
        while time.monotonic() < deadline and not self._stop.is_set():
            job = self.collector.jobs.get(job_id)
            if job is not None:
                with job.lock:
                    fresh = [r for r in job.ranks.values() if r.incarnation not in before and r.node != node]
                    for r in fresh:
                        first_ops.setdefault(r.incarnation, r.ops)
                    new = [r for r in fresh if r.ops > first_ops[r.incarnation] or r.state == "goodbye"]
                    results = [c["result"] for c in job.command_status() if c["id"] in commands]
                    if results and all(x == "ignored" for x in results) and not new:
                        return StepResult(
                            False,
                            "the ranks ignored the exit command: the job does not allow control (RANKWATCH_CONTROL=1)",
                        )
                    if new:
                        ranks = sorted(r.rank for r in new)
                        nodes = sorted({r.node for r in new})
                        restart = max(r.restart for r in new)
                        return StepResult(
                            True,
                            f"the launcher restarted the job{without}: ranks {ranks} on {nodes} stepping "
                            f"again (restart {restart}) {self.clock() - start:.1f}s after {since}",
                            {"ranks": ranks, "nodes": nodes, "restart": restart},
                        )
            time.sleep(0.25)
        return StepResult(False, f"the job did not come back{without} within {self.comeback_timeout_s:.0f}s")

    def _target(self, row: ActionRow) -> Target:
        with self.book.db.sessions() as s:
            ranks = list(s.scalars(select(RankRow).where(RankRow.job_id == row.job_id)))
        meta = {r.rank: {**(r.meta or {}), "pid": r.pid, "node": r.node} for r in ranks}
        on_node = tuple(sorted(r.rank for r in ranks if r.node == row.node)) or tuple(row.ranks or ())
        return Target(
            job_id=row.job_id,
            node=row.node or "",
            reason=row.reason,
            ranks=on_node,
            meta=meta,
            all_ranks=tuple(sorted(r.rank for r in ranks)),
        )

    def _request_exit(self, code: int) -> Any:
        def request(job_id: str, ranks: Sequence[int], exit_code: int, reason: str) -> list[str]:
            job = self.collector.jobs.get(job_id)
            args: dict[str, Any] = {"code": exit_code or code, "reason": reason}
            if job is not None:
                with job.lock:
                    world = job.groups.get("0")
                    ops = job.recent.query(group="0", limit=400)
                if world is not None and world.last_seq:
                    args.update(at_seq=world.last_seq + _margin(ops), group="0", timeout_s=30.0)
            live = [r for r in ranks if job is not None and r in job.ranks]
            queued = self.collector.queue_commands(job_id, "exit", live, **args) or []
            return [c["id"] for c in queued]

        return request


def _margin(ops: list[dict[str, Any]]) -> int:
    """Sequence numbers the world group gets through in ~5 s (at least 5): when every rank will
    have heard the command and none will have passed the op it names.

    The rate is read per rank (sequence numbers over that rank's own clock): the recent records
    hold every rank's copy of each op, so counting records would multiply the rate by the number
    of ranks and plan the exit that many times too late.
    """
    by_rank: dict[Any, list[dict[str, Any]]] = {}
    for o in ops:
        by_rank.setdefault(o.get("rank"), []).append(o)
    per_s = 0.0
    for rows in by_rank.values():
        if len(rows) < 2:
            continue
        rows.sort(key=lambda o: o["seq"])
        span = (rows[-1]["t_enter_ns"] - rows[0]["t_enter_ns"]) / 1e9
        if span > 0:
            per_s = max(per_s, (rows[-1]["seq"] - rows[0]["seq"]) / span)
    return max(5, int(per_s * 5) + 1)


# -- REST ---------------------------------------------------------------------------------------
class ActionCreate(BaseModel):
    """Ask for an action on a job."""

    type: Literal["isolate", "restart", "swap"]
    node: str | None = Field(None, description="the node to act on (or give suspect_id)")
    suspect_id: int | None = Field(None, description="the suspect this answers; its node is the target")
    reason: str = Field("", max_length=500)
    dry_run: bool = Field(False, description="say what would be done, change nothing")


class PolicyUpdate(BaseModel):
    """A job's remediation policy; fields left out keep the service's defaults."""

    mode: Literal["observe", "approve", "auto"] | None = None
    recovery: Literal["restart", "swap"] | None = None
    actuator: Literal["none", "slurm", "kubernetes", "torchrun", "torchft", "command"] | None = None
    actuator_options: dict[str, Any] | None = None
    kinds: list[str] | None = None
    min_score: float | None = Field(None, ge=0, le=1)
    budget: int | None = Field(None, ge=0)
    budget_window_s: float | None = Field(None, gt=0)
    cooldown_s: float | None = Field(None, ge=0)
    max_isolated_share: float | None = Field(None, gt=0, le=1)
    exit_code: int | None = Field(None, ge=0, le=255)
    protect_nodes: list[str] | None = None


class StandbyCreate(BaseModel):
    node: str = Field(..., min_length=1, max_length=256)
    cluster: str = Field("default", min_length=1, max_length=128)


class ReleaseRequest(BaseModel):
    actuator: str | None = Field(None, description="default: the actuator of the job that isolated the node")


def make_router() -> APIRouter:
    """The remediation routes: reading needs a read token, everything else an admin token."""
    router = APIRouter(tags=["remediation"])

    def collector(request: Request) -> Collector:
        return request.app.state.collector  # type: ignore[no-any-return]

    def actor(principal: Any) -> str:
        return "anonymous (open service)" if getattr(principal, "anonymous", False) else f"{principal.scope} token"

    @router.post("/jobs/{job_id}/actions", status_code=201)
    def create_action(job_id: str, body: ActionCreate, principal: AdminDep, request: Request) -> dict[str, Any]:
        """Ask for isolate / restart / swap on a job, now (or as a dry run). Refusals are recorded too."""
        c = collector(request)
        live = c.jobs.get(job_id)
        if live is not None:
            c.persist([live])  # the checks read the job's nodes from the database: bring it up to date
        try:
            return c.actions.request(
                job_id,
                body.type,
                node=body.node,
                suspect_id=body.suspect_id,
                reason=body.reason,
                dry_run=body.dry_run,
                actor=actor(principal),
                now=c.clock(),
            )
        except LookupError as exc:
            raise HTTPException(404, str(exc)) from None

    @router.get("/actions")
    def read_actions(
        _: ReadDep,
        request: Request,
        job_id: str | None = None,
        state: Literal["proposed", "approved", "running", "succeeded", "failed", "refused"] | None = None,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 500,
    ) -> list[dict[str, Any]]:
        """The action log, newest first: every decision, refusal and step, with its actor."""
        return collector(request).actions.log(job_id=job_id, state=state, limit=limit)

    @router.get("/actions/{action_id}")
    def read_action(action_id: int, _: ReadDep, request: Request) -> dict[str, Any]:
        a = collector(request).actions.get(action_id)
        if a is None:
            raise HTTPException(404, f"no action {action_id}")
        return a

    @router.post("/actions/{action_id}/approve")
    def approve_action(action_id: int, principal: AdminDep, request: Request) -> dict[str, Any]:
        """Approve an action the ``approve`` policy proposed; the executor then runs it."""
        c = collector(request)
        try:
            a = c.actions.approve(action_id, actor(principal), c.clock())
        except ValueError as exc:
            raise HTTPException(409, str(exc)) from None
        if a is None:
            raise HTTPException(404, f"no action {action_id}")
        return a

    @router.get("/jobs/{job_id}/policy")
    def read_policy(job_id: str, _: ReadDep, request: Request) -> dict[str, Any]:
        c = collector(request)
        with c.db.sessions() as s:
            return c.actions.policy(s, job_id).public()

    @router.put("/jobs/{job_id}/policy")
    def update_policy(job_id: str, body: PolicyUpdate, _: AdminDep, request: Request) -> dict[str, Any]:
        """Set a job's policy: observe (report and page), approve (propose and wait), auto (act)."""
        c = collector(request)
        data = body.model_dump(exclude_none=True)
        from rankwatch.collector.policy import Policy

        policy = Policy.from_json(data, c.actions.defaults)  # ConfigError -> 422 with the field named
        if not c.set_policy(job_id, data):
            raise HTTPException(404, f"no job {job_id!r}")
        return policy.public()

    @router.post("/standby", status_code=201)
    def create_standby(body: StandbyCreate, _: AdminDep, request: Request) -> dict[str, Any]:
        """Register a spare node: ``swap`` takes one, ``restart`` may."""
        c = collector(request)
        return c.actions.add_standby(body.cluster, body.node, c.clock())

    @router.get("/standby")
    def read_standby(_: ReadDep, request: Request, cluster: str | None = None) -> list[dict[str, Any]]:
        return collector(request).actions.list_standby(cluster)

    @router.delete("/standby/{cluster}/{node}", status_code=204)
    def delete_standby(cluster: str, node: str, _: AdminDep, request: Request) -> None:
        if not collector(request).actions.remove_standby(cluster, node):
            raise HTTPException(404, f"no standby node {node} in {cluster}")

    @router.post("/nodes/{node}/release")
    def release_node(node: str, body: ReleaseRequest, principal: AdminDep, request: Request) -> dict[str, Any]:
        """Return an isolated node to service through the actuator that isolated it."""
        c = collector(request)
        with c.db.sessions() as s:
            last = s.scalars(
                select(ActionRow)
                .where(ActionRow.node == node, ActionRow.type.in_(("isolate", "swap")), ActionRow.state == "succeeded")
                .order_by(ActionRow.id.desc())
            ).first()
            if last is None:
                raise HTTPException(404, f"rankwatch never isolated {node}")
            policy = c.actions.policy(s, last.job_id)
        executor: Executor | None = getattr(request.app.state, "executor", None)
        act = (executor.actuator_override if executor else None) or make_actuator(
            body.actuator or policy.actuator, policy.actuator_options if not body.actuator else {}
        )
        res = act.release(node)
        return c.actions.record_release(node, actor(principal), res.ok, res.output, c.clock())

    return router
