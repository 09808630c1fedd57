"""The action log: remediation actions as recorded state machines, and the standby pool.

An action goes ``proposed -> approved -> running -> succeeded | failed`` (or is ``refused`` at
once, with the reason); every step is appended to ``steps`` with its time, actor and output.
Automatic actions are planned here, in the transaction that opens their suspect, so the suspect,
the action and the outbox events that page about both commit together; the API's executor then
claims approved actions and runs them through an actuator. Every write also writes an event.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session

from rankwatch.collector.db import Database
from rankwatch.collector.jobs import iso
from rankwatch.collector.models import ActionRow, EventRow, JobRow, RankRow, StandbyRow, SuspectRow
from rankwatch.collector.policy import Decision, Policy, decide
from rankwatch.collector.suspects import mark

__all__ = ["ActionBook", "action_public"]

logger = logging.getLogger(__name__)

AUTO = "rankwatch (policy)"
STATES = ("proposed", "approved", "running", "succeeded", "failed", "refused")


def action_public(row: ActionRow) -> dict[str, Any]:
    return {
        "id": row.id,
        "job_id": row.job_id,
        "type": row.type,
        "suspect_id": row.suspect_id,
        "node": row.node,
        "ranks": row.ranks,
        "reason": row.reason,
        "state": row.state,
        "dry_run": row.dry_run,
        "actor": row.actor,
        "error": row.error,
        "created_at": iso(row.created_at),
        "updated_at": iso(row.updated_at),
        "finished_at": iso(row.finished_at),
        "steps": row.steps,
    }


def _step(now: float, actor: str, what: str, **extra: Any) -> dict[str, Any]:
    return {"at": iso(now), "actor": actor, "step": what, **extra}


def _event(s: Session, row: ActionRow, now: float, kind: str) -> None:
    s.flush()
    payload = {"type": kind, "action": action_public(row)}
    s.add(EventRow(at=now, type=kind, job_id=row.job_id, suspect_id=row.suspect_id, action_id=row.id, payload=payload))


class ActionBook:
    """Reads and writes actions and the standby pool."""

    def __init__(self, db: Database, defaults: Policy) -> None:
        self.db = db
        self.defaults = defaults

    # -- policy ---------------------------------------------------------------------------------
    def policy(self, s: Session, job_id: str) -> Policy:
        row = s.get(JobRow, job_id)
        try:
            return Policy.from_json(row.policy if row is not None else None, self.defaults)
        except Exception:
            logger.warning("job %s has an unusable policy; using the defaults", job_id)
            return self.defaults

    def node_ranks(self, s: Session, job_id: str) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for rank, node in s.execute(select(RankRow.rank, RankRow.node).where(RankRow.job_id == job_id)):
            out.setdefault(node, []).append(rank)
        return {n: sorted(r) for n, r in out.items()}

    def isolated_nodes(self, s: Session, job_id: str) -> set[str]:
        rows = s.scalars(
            select(ActionRow).where(
                ActionRow.job_id == job_id,
                ActionRow.type.in_(("isolate", "swap")),
                ActionRow.state == "succeeded",
                ActionRow.dry_run.is_(False),
            )
        )
        released = self._released(s)
        return {r.node for r in rows if r.node and (r.node not in released or released[r.node] < r.created_at)}

    def _released(self, s: Session) -> dict[str, float]:
        out: dict[str, float] = {}
        for node, at in s.execute(
            select(ActionRow.node, ActionRow.created_at).where(
                ActionRow.type == "release", ActionRow.state == "succeeded"
            )
        ):
            if node:
                out[node] = max(out.get(node, 0.0), at)
        return out

    # -- automatic ------------------------------------------------------------------------------
    def plan(self, s: Session, suspect: SuspectRow, public: Mapping[str, Any], now: float) -> list[ActionRow]:
        """Record what the job's policy says to do about a suspect just opened (same transaction)."""
        policy = self.policy(s, suspect.job_id)
        if policy.mode == "observe":
            return []
        recent = [
            (r.created_at, r.type, r.state)
            for r in s.scalars(select(ActionRow).where(ActionRow.job_id == suspect.job_id, ActionRow.actor == AUTO))
        ]
        decisions = decide(
            policy, public, self.node_ranks(s, suspect.job_id), self.isolated_nodes(s, suspect.job_id), recent, now
        )
        return [self._record(s, suspect.job_id, suspect.id, d, AUTO, False, now) for d in decisions]

    def _record(
        self, s: Session, job_id: str, suspect_id: int | None, d: Decision, actor: str, dry_run: bool, now: float
    ) -> ActionRow:
        key = None if (dry_run or d.state == "refused" or suspect_id is None) else f"{suspect_id}:{d.type}"
        if key is not None:
            existing = s.scalars(select(ActionRow).where(ActionRow.key == key)).first()
            if existing is not None:
                return existing  # one suspect -> at most one such action
        steps = [_step(now, actor, d.state, reason=d.refusal or d.reason)]
        row = ActionRow(
            job_id=job_id,
            type=d.type,
            suspect_id=suspect_id,
            node=d.node,
            ranks=list(d.ranks),
            reason=d.reason,
            state=d.state,
            steps=steps,
            actor=actor,
            dry_run=dry_run,
            key=key,
            error=d.refusal,
            created_at=now,
            updated_at=now,
            finished_at=now if d.state == "refused" else None,
        )
        s.add(row)
        _event(s, row, now, f"action.{d.state}")
        return row

    # -- by request -----------------------------------------------------------------------------
    def request(
        self,
        job_id: str,
        type_: str,
        *,
        node: str | None,
        suspect_id: int | None,
        reason: str,
        dry_run: bool,
        actor: str,
        now: float,
    ) -> dict[str, Any]:
        """An action a person asked for: checked like automatic ones, approved at once (or refused)."""
        with self.db.sessions.begin() as s:
            if s.get(JobRow, job_id) is None:
                raise LookupError(f"no job {job_id!r}")
            policy = self.policy(s, job_id)
            node_ranks = self.node_ranks(s, job_id)
            suspect = s.get(SuspectRow, suspect_id) if suspect_id is not None else None
            if suspect_id is not None and (suspect is None or suspect.job_id != job_id):
                raise LookupError(f"job {job_id!r} has no suspect {suspect_id}")
            if node is None and suspect is not None:
                nodes = suspect.nodes or [n for n, rs in node_ranks.items() if set(rs) & set(suspect.ranks)]
                node = nodes[0] if len(set(nodes)) == 1 else None
            refusal = None
            if type_ in ("isolate", "swap"):
                if node is None:
                    refusal = "name the node (or a suspect on one node) to act on"
                elif node not in node_ranks:
                    refusal = f"node {node} is not a node of job {job_id}"
                elif node in policy.protect_nodes:
                    refusal = f"node {node} is protected by the job's policy (protect_nodes)"
                elif type_ == "isolate":
                    isolated = self.isolated_nodes(s, job_id)
                    share = (len(isolated | {node})) / max(1, len(node_ranks))
                    if share > policy.max_isolated_share:
                        refusal = (
                            f"isolating {node} would take {len(isolated | {node})} of the job's {len(node_ranks)} "
                            f"nodes (more than max_isolated_share {policy.max_isolated_share:g})"
                        )
            d = Decision(
                type_,
                node,
                tuple(node_ranks.get(node, ())) if node else (),
                "refused" if refusal else "approved",
                reason or f"asked by {actor}",
                refusal,
            )
            return action_public(self._record(s, job_id, suspect_id, d, actor, dry_run, now))

    def approve(self, action_id: int, actor: str, now: float) -> dict[str, Any] | None:
        with self.db.sessions.begin() as s:
            row = s.get(ActionRow, action_id)
            if row is None:
                return None
            if row.state != "proposed":
                raise ValueError(f"action {action_id} is {row.state}, not proposed")
            row.state = "approved"
            row.updated_at = now
            row.steps = [*row.steps, _step(now, actor, "approved")]
            _event(s, row, now, "action.approved")
            return action_public(row)

    # -- the executor's side --------------------------------------------------------------------
    def claim(self, now: float) -> ActionRow | None:
        """Take the oldest approved action to run (one process wins it)."""
        with self.db.sessions.begin() as s:
            for row in s.scalars(
                select(ActionRow).where(ActionRow.state == "approved").order_by(ActionRow.id).limit(5)
            ):
                got = s.execute(
                    update(ActionRow)
                    .where(ActionRow.id == row.id, ActionRow.state == "approved")
                    .values(state="running", updated_at=now)
                )
                if got.rowcount == 1:  # type: ignore[attr-defined]
                    s.refresh(row)
                    row.steps = [*row.steps, _step(now, "rankwatch", "running")]
                    _event(s, row, now, "action.started")
                    s.flush()
                    s.expunge(row)
                    return row
        return None

    def finish(
        self,
        action_id: int,
        ok: bool,
        steps: Sequence[dict[str, Any]],
        error: str | None,
        now: float,
        *,
        refused: bool = False,
    ) -> None:
        """Record how a running action ended: succeeded, failed, or refused by its actuator."""
        with self.db.sessions.begin() as s:
            row = s.get(ActionRow, action_id)
            if row is None:
                return
            row.state = "refused" if refused else "succeeded" if ok else "failed"
            row.error = error
            row.steps = [*row.steps, *steps, _step(now, "rankwatch", row.state)]
            row.updated_at = row.finished_at = now
            _event(s, row, now, "action.refused" if refused else "action.finished")
            if ok and not row.dry_run and row.type in ("isolate", "swap") and row.suspect_id is not None:
                sus = s.get(SuspectRow, row.suspect_id)
                if sus is not None and sus.status == "active":
                    mark(s, sus, "isolated", now, f"node {row.node} isolated by action {row.id}")

    def follow_up(self, parent: ActionRow, type_: str, now: float) -> dict[str, Any]:
        """The recovery that follows a successful isolation (restart): approved at once under
        ``auto``, proposed (waiting for its own approval) under ``approve``."""
        with self.db.sessions.begin() as s:
            state = "approved" if self.policy(s, parent.job_id).mode == "auto" else "proposed"
            d = Decision(type_, parent.node, tuple(parent.ranks or ()), state, f"{type_} after action {parent.id}")
            row = self._record(s, parent.job_id, parent.suspect_id, d, parent.actor, parent.dry_run, now)
            return action_public(row)

    def record_release(self, node: str, actor: str, ok: bool, output: str, now: float) -> dict[str, Any]:
        with self.db.sessions.begin() as s:
            job = s.scalars(
                select(ActionRow.job_id).where(ActionRow.node == node, ActionRow.type.in_(("isolate", "swap")))
            ).first()
            row = ActionRow(
                job_id=job or "",
                type="release",
                node=node,
                ranks=[],
                reason=f"release {node}",
                state="succeeded" if ok else "failed",
                steps=[_step(now, actor, "release", output=output)],
                actor=actor,
                dry_run=False,
                created_at=now,
                updated_at=now,
                finished_at=now,
            )
            if job is None:
                raise LookupError(f"no action ever isolated {node}")
            s.add(row)
            _event(s, row, now, "action.finished")
            return action_public(row)

    # -- queries --------------------------------------------------------------------------------
    def log(self, *, job_id: str | None = None, state: str | None = None, limit: int = 500) -> list[dict[str, Any]]:
        q = select(ActionRow).order_by(ActionRow.id.desc()).limit(limit)
        if job_id is not None:
            q = q.where(ActionRow.job_id == job_id)
        if state is not None:
            q = q.where(ActionRow.state == state)
        with self.db.sessions() as s:
            return [action_public(r) for r in s.scalars(q)]

    def get(self, action_id: int) -> dict[str, Any] | None:
        with self.db.sessions() as s:
            row = s.get(ActionRow, action_id)
            return None if row is None else action_public(row)

    # -- standby pool ---------------------------------------------------------------------------
    def add_standby(self, cluster: str, node: str, now: float) -> dict[str, Any]:
        with self.db.sessions.begin() as s:
            row = s.get(StandbyRow, (cluster, node))
            if row is None:
                row = StandbyRow(cluster=cluster, node=node, state="free", job_id=None, added_at=now, updated_at=now)
                s.add(row)
            return _standby_public(row)

    def list_standby(self, cluster: str | None = None) -> list[dict[str, Any]]:
        q = select(StandbyRow).order_by(StandbyRow.cluster, StandbyRow.node)
        if cluster is not None:
            q = q.where(StandbyRow.cluster == cluster)
        with self.db.sessions() as s:
            return [_standby_public(r) for r in s.scalars(q)]

    def remove_standby(self, cluster: str, node: str) -> bool:
        with self.db.sessions.begin() as s:
            row = s.get(StandbyRow, (cluster, node))
            if row is None:
                return False
            s.delete(row)
            return True

    def take_standby(self, job_id: str, cluster: str | None, now: float) -> str | None:
        with self.db.sessions.begin() as s:
            q = select(StandbyRow).where(StandbyRow.state == "free").order_by(StandbyRow.added_at)
            if cluster is not None:
                q = q.where(or_(StandbyRow.cluster == cluster, StandbyRow.cluster == "default"))
            for row in s.scalars(q):
                got = s.execute(
                    update(StandbyRow)
                    .where(StandbyRow.cluster == row.cluster, StandbyRow.node == row.node, StandbyRow.state == "free")
                    .values(state="used", job_id=job_id, updated_at=now)
                )
                if got.rowcount == 1:  # type: ignore[attr-defined]
                    return row.node
        return None


def _standby_public(row: StandbyRow) -> dict[str, Any]:
    return {
        "cluster": row.cluster,
        "node": row.node,
        "state": row.state,
        "job_id": row.job_id,
        "added_at": iso(row.added_at),
    }
