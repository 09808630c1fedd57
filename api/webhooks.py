"""Webhook subscriptions and their delivery log: ``/webhooks`` routes and the store behind them.

A subscription says where (``url``), in which format (``kind``: generic, pagerduty, slack,
alertmanager), about what (``events``, filtered by ``job_id``, suspect ``kinds`` and a minimum
``min_score``). Secrets are write-only: a generic webhook's signing secret is returned once, when
rankwatch generates it; after that the API says only whether one is set. URLs are shown without
their credentials and query, and a Slack URL (itself the secret) without its path.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any, Literal

import httpx
from fastapi import APIRouter, HTTPException, Query
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from sqlalchemy import func, select

from rankwatch.api import payloads
from rankwatch.api.delivery import WebhookDispatcher, json_body, new_msg_id
from rankwatch.api.deps import AdminDep, CollectorDep, DispatcherDep, ReadDep
from rankwatch.api.signing import check_secret, generate_secret
from rankwatch.api.ssrf import AllowList, Resolver, check_url, parse_url, system_resolver
from rankwatch.collector.db import Database
from rankwatch.collector.jobs import iso
from rankwatch.collector.models import DeliveryAttemptRow, DeliveryRow, EventRow, WebhookRow
from rankwatch.collector.suspects import KINDS

__all__ = ["DeliveryStateError", "WebhookCreate", "WebhookStore", "redact_url", "router", "webhook_public"]

logger = logging.getLogger(__name__)

SuspectKind = Literal["noncomm_slow", "comm_slow", "noncomm_hang", "comm_hang", "rank_dead"]
assert set(SuspectKind.__args__) == set(KINDS)  # type: ignore[attr-defined]


class DeliveryStateError(Exception):
    """A delivery or webhook is not in a state that allows the request (HTTP 409)."""


class WebhookCreate(BaseModel):
    """A new subscription."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["generic", "pagerduty", "slack", "alertmanager"] = "generic"
    url: str | None = Field(
        None, description="Receiver URL (http or https). PagerDuty: defaults to the Events API v2 endpoint."
    )
    description: str | None = Field(None, max_length=200, description="Your name for it, shown in listings.")
    secret: SecretStr | None = Field(
        None, description="generic/alertmanager: Standard Webhooks signing secret (whsec_...); generic: made if absent."
    )
    routing_key: SecretStr | None = Field(None, description="pagerduty: the integration's routing key.")
    job_id: str | None = Field(None, max_length=256, description="Only events of this job.")
    kinds: list[SuspectKind] | None = Field(None, description="Only suspects of these kinds.")
    min_score: float | None = Field(None, ge=0, description="Only suspects that open with at least this score.")
    events: list[str] | None = Field(
        None,
        description=f"Event types (default: {', '.join(payloads.DEFAULT_EVENTS)}; pagerduty/alertmanager: suspects).",
    )

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None:
            parse_url(value)  # shape only; the SSRF guard runs with the service's allow-list
        return value

    @model_validator(mode="after")
    def _combination(self) -> WebhookCreate:
        if self.kind == "pagerduty":
            if self.routing_key is None or not self.routing_key.get_secret_value().strip():
                raise ValueError("a pagerduty webhook needs a routing_key (the integration key of a PagerDuty service)")
            key = self.routing_key.get_secret_value()
            if len(key) > 128 or any(ch.isspace() for ch in key):
                raise ValueError("routing_key must be at most 128 characters without spaces")
            self.url = self.url or payloads.PAGERDUTY_URL
        else:
            if self.url is None:
                raise ValueError(f"a {self.kind} webhook needs a url")
            if self.routing_key is not None:
                raise ValueError("routing_key is for pagerduty webhooks only")
        if self.secret is not None:
            if self.kind not in ("generic", "alertmanager"):
                raise ValueError(f"{self.kind} webhooks are not signed; leave secret out")
            check_secret(self.secret.get_secret_value())
        allowed = payloads.KIND_EVENTS[self.kind]
        if self.events is None:
            self.events = [e for e in payloads.DEFAULT_EVENTS if e in allowed]
        if not self.events:
            raise ValueError("events must name at least one event type")
        for e in self.events:
            if e not in payloads.EVENT_TYPES:
                raise ValueError(f"unknown event type {e!r}; known: {', '.join(payloads.EVENT_TYPES)}")
            if e not in allowed:
                raise ValueError(f"{self.kind} webhooks take only {', '.join(allowed)}, not {e!r}")
        self.events = list(dict.fromkeys(self.events))
        return self


def redact_url(url: str, kind: str) -> str:
    """A URL fit to show: no credentials, no query values, and no path for Slack (the path is its secret)."""
    try:
        u = httpx.URL(url)
    except Exception:
        return "(unparseable)"
    host = f"[{u.host}]" if ":" in u.host else u.host
    netloc = ("***@" if u.userinfo else "") + host + (f":{u.port}" if u.port else "")
    path = "/…" if kind == "slack" and u.path not in ("", "/") else u.path
    return f"{u.scheme}://{netloc}{path}" + ("?…" if u.query else "")


def webhook_public(row: WebhookRow) -> dict[str, Any]:
    """A subscription as the API shows it: never its secret or routing key."""
    return {
        "id": row.id,
        "kind": row.kind,
        "url": redact_url(row.url, row.kind),
        "description": row.description,
        "job_id": row.job_id,
        "kinds": row.kinds,
        "min_score": row.min_score,
        "events": row.events,
        "has_secret": row.secret is not None,
        "has_routing_key": row.routing_key is not None,
        "enabled": row.enabled,
        "disabled_at": iso(row.disabled_at),
        "disabled_reason": row.disabled_reason,
        "created_at": iso(row.created_at),
    }


def delivery_public(d: DeliveryRow, attempts: list[DeliveryAttemptRow]) -> dict[str, Any]:
    return {
        "id": d.id,
        "webhook_id": d.webhook_id,
        "event_id": d.event_id,
        "event_type": d.event_type,
        "msg_id": d.msg_id,
        "status": d.status,
        "created_at": iso(d.created_at),
        "next_attempt_at": iso(d.next_attempt_at) if d.status == "pending" else None,
        "attempts": d.attempts,
        "delivered_at": iso(d.delivered_at),
        "last_status_code": d.last_status,
        "last_error": d.last_error,
        "attempt_log": [
            {"at": iso(a.at), "status_code": a.status_code, "error": a.error, "duration_ms": a.duration_ms}
            for a in attempts
        ],
    }


class WebhookStore:
    """Subscriptions and deliveries in the database."""

    def __init__(self, db: Database, allow: AllowList, *, base_url: str, resolver: Resolver = system_resolver) -> None:
        self.db = db
        self.allow = allow
        self.base_url = base_url
        self.resolver = resolver

    def create(self, body: WebhookCreate, now: float) -> dict[str, Any]:
        """Store a subscription; the result holds the generated secret, the only time it is shown.

        Raises:
            UnsafeURLError: the URL's host does not resolve, or resolves to an address the guard refuses.
        """
        assert body.url is not None and body.events is not None
        check_url(body.url, self.allow, self.resolver)
        generated = generate_secret() if body.kind == "generic" and body.secret is None else None
        secret = generated or (body.secret.get_secret_value() if body.secret else None)
        with self.db.sessions.begin() as s:
            row = WebhookRow(
                created_at=now,
                kind=body.kind,
                url=body.url,
                description=body.description,
                secret=secret,
                routing_key=body.routing_key.get_secret_value() if body.routing_key else None,
                job_id=body.job_id,
                kinds=list(body.kinds) if body.kinds else None,
                min_score=body.min_score,
                events=list(body.events),
                after_event_id=s.scalar(select(func.max(EventRow.id))) or 0,
                enabled=True,
            )
            s.add(row)
            s.flush()
            out = webhook_public(row)
        if generated is not None:
            out["secret"] = generated
        logger.info("webhook %d created: %s to %s", out["id"], body.kind, httpx.URL(body.url).host)
        return out

    def all(self) -> list[dict[str, Any]]:
        with self.db.sessions() as s:
            return [webhook_public(r) for r in s.scalars(select(WebhookRow).order_by(WebhookRow.id))]

    def get(self, webhook_id: int) -> dict[str, Any] | None:
        with self.db.sessions() as s:
            row = s.get(WebhookRow, webhook_id)
            return None if row is None else webhook_public(row)

    def delete(self, webhook_id: int) -> bool:
        with self.db.sessions.begin() as s:
            row = s.get(WebhookRow, webhook_id)
            if row is None:
                return False
            s.delete(row)
        logger.info("webhook %d deleted", webhook_id)
        return True

    def deliveries(
        self, webhook_id: int, *, status: str | None = None, limit: int = 100
    ) -> list[dict[str, Any]] | None:
        with self.db.sessions() as s:
            if s.get(WebhookRow, webhook_id) is None:
                return None
            q = select(DeliveryRow).where(DeliveryRow.webhook_id == webhook_id).order_by(DeliveryRow.id.desc())
            if status is not None:
                q = q.where(DeliveryRow.status == status)
            rows = list(s.scalars(q.limit(limit)))
            attempts: dict[int, list[DeliveryAttemptRow]] = {d.id: [] for d in rows}
            if rows:
                for a in s.scalars(
                    select(DeliveryAttemptRow)
                    .where(DeliveryAttemptRow.delivery_id.in_(list(attempts)))
                    .order_by(DeliveryAttemptRow.id)
                ):
                    attempts[a.delivery_id].append(a)
            return [delivery_public(d, attempts[d.id]) for d in rows]

    def retry(self, webhook_id: int, delivery_id: int, now: float) -> dict[str, Any] | None:
        """Send a delivered or dead delivery again, with the same ``webhook-id`` and a fresh set of attempts.

        Raises:
            DeliveryStateError: it is still pending, or its webhook is disabled.
        """
        with self.db.sessions.begin() as s:
            d = s.get(DeliveryRow, delivery_id)
            sub = s.get(WebhookRow, webhook_id)
            if d is None or sub is None or d.webhook_id != webhook_id:
                return None
            if not sub.enabled:
                raise DeliveryStateError(f"webhook {webhook_id} is disabled ({sub.disabled_reason}); create it again")
            if d.status == "pending":
                raise DeliveryStateError(f"delivery {delivery_id} is still pending")
            d.status = "pending"
            d.tries = 0
            d.next_attempt_at = now
            d.delivered_at = None
            out = delivery_public(d, [])
        logger.info("webhook %d delivery %d replayed", webhook_id, delivery_id)
        return out

    def test(self, webhook_id: int, now: float) -> list[dict[str, Any]] | None:
        """Queue a test message (for PagerDuty and Alertmanager: a trigger and its resolve).

        Raises:
            DeliveryStateError: the webhook is disabled.
        """
        with self.db.sessions.begin() as s:
            sub = s.get(WebhookRow, webhook_id)
            if sub is None:
                return None
            if not sub.enabled:
                raise DeliveryStateError(f"webhook {webhook_id} is disabled ({sub.disabled_reason}); create it again")
            bodies = payloads.render_test(
                sub.kind, base_url=self.base_url, webhook_id=sub.id, now=now, routing_key=sub.routing_key
            )
            key = f"test:{new_msg_id()}"
            rows = [
                DeliveryRow(
                    webhook_id=sub.id,
                    event_id=None,
                    event_type=event_type,
                    msg_id=new_msg_id(),
                    order_key=key,
                    body=json_body(body),
                    status="pending",
                    created_at=now,
                    next_attempt_at=now,
                    attempts=0,
                    tries=0,
                )
                for event_type, body in bodies
            ]
            s.add_all(rows)
            s.flush()
            return [delivery_public(d, []) for d in rows]


def _store(collector: Any, dispatcher: WebhookDispatcher | None) -> WebhookStore:
    return _ctx(collector, dispatcher)[0]


def _ctx(collector: Any, dispatcher: WebhookDispatcher | None) -> tuple[WebhookStore, WebhookDispatcher]:
    if dispatcher is None:
        raise HTTPException(503, "webhook delivery is not running in this process")
    store = WebhookStore(collector.db, dispatcher.allow, base_url=dispatcher.base_url, resolver=dispatcher.resolver)
    return store, dispatcher


router = APIRouter(prefix="/webhooks", tags=["webhooks"])


@router.post("", status_code=201)
def create_webhook(
    body: WebhookCreate, _: AdminDep, collector: CollectorDep, dispatcher: DispatcherDep
) -> dict[str, Any]:
    """Subscribe a receiver. For a generic webhook without a ``secret``, the answer holds the
    generated one — the only time it is shown. URLs whose host resolves to a loopback, link-local
    or private address are refused unless ``RANKWATCH_WEBHOOK_ALLOW`` permits them."""
    store, worker = _ctx(collector, dispatcher)
    return store.create(body, worker.clock())


@router.get("")
def read_webhooks(_: ReadDep, collector: CollectorDep, dispatcher: DispatcherDep) -> list[dict[str, Any]]:
    """Every subscription (secrets and routing keys never shown; URLs redacted)."""
    return _store(collector, dispatcher).all()


@router.get("/{webhook_id}")
def read_webhook(webhook_id: int, _: ReadDep, collector: CollectorDep, dispatcher: DispatcherDep) -> dict[str, Any]:
    """One subscription, and whether it is enabled (a 410 Gone from its receiver disables it)."""
    out = _store(collector, dispatcher).get(webhook_id)
    if out is None:
        raise HTTPException(404, f"no webhook {webhook_id}")
    return out


@router.delete("/{webhook_id}", status_code=204)
def delete_webhook(webhook_id: int, _: AdminDep, collector: CollectorDep, dispatcher: DispatcherDep) -> None:
    """Unsubscribe; its pending deliveries and delivery log go with it."""
    if not _store(collector, dispatcher).delete(webhook_id):
        raise HTTPException(404, f"no webhook {webhook_id}")


@router.get("/{webhook_id}/deliveries")
def read_deliveries(
    webhook_id: int,
    _: ReadDep,
    collector: CollectorDep,
    dispatcher: DispatcherDep,
    status: Literal["pending", "delivered", "dead"] | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[dict[str, Any]]:
    """Deliveries, newest first, each with every attempt: time, status code, error."""
    out = _store(collector, dispatcher).deliveries(webhook_id, status=status, limit=limit)
    if out is None:
        raise HTTPException(404, f"no webhook {webhook_id}")
    return out


@router.post("/{webhook_id}/deliveries/{delivery_id}/retry", status_code=202)
def retry_delivery(
    webhook_id: int, delivery_id: int, _: AdminDep, collector: CollectorDep, dispatcher: DispatcherDep
) -> dict[str, Any]:
    """Replay a dead (or delivered) delivery: same ``webhook-id``, a fresh set of attempts."""
    store, worker = _ctx(collector, dispatcher)
    try:
        out = store.retry(webhook_id, delivery_id, worker.clock())
    except DeliveryStateError as exc:
        raise HTTPException(409, str(exc)) from None
    if out is None:
        raise HTTPException(404, f"no delivery {delivery_id} of webhook {webhook_id}")
    worker.wake()
    return out


@router.post("/{webhook_id}/test", status_code=202)
def test_webhook(
    webhook_id: int, _: AdminDep, collector: CollectorDep, dispatcher: DispatcherDep
) -> list[dict[str, Any]]:
    """Send a test message now, whatever the filters say (PagerDuty, Alertmanager: trigger, then resolve)."""
    store, worker = _ctx(collector, dispatcher)
    try:
        out = store.test(webhook_id, worker.clock())
    except DeliveryStateError as exc:
        raise HTTPException(409, str(exc)) from None
    if out is None:
        raise HTTPException(404, f"no webhook {webhook_id}")
    worker.wake()
    return out
