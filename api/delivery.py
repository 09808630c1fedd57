"""The delivery worker: from the events outbox to every matching webhook, at least once.

One background thread runs an asyncio loop that, every ``poll_s`` (or when woken):

1. **fans out** new outbox events (``events`` rows past this reader's cursor) into one delivery row
   per matching subscription, rendered in the subscription's format, in one transaction with the
   cursor, so an event is fanned out once and a crash in between loses nothing;
2. **claims** due deliveries by pushing their ``next_attempt_at`` a lease ahead (an attempt whose
   process dies is retried when the lease runs out), at most ``per_webhook`` in flight per
   subscription and one at a time per suspect and subscription (a resolve never overtakes its
   trigger), so a slow or dead receiver holds only its own deliveries;
3. **attempts** each claimed delivery as its own task: resolve the host, check the addresses
   (``rankwatch.api.ssrf``), connect to the checked address, sign, POST, never follow a redirect,
   give up after ``webhook_timeout_s``; then records the attempt and decides: delivered (2xx),
   retry later (exponential backoff with jitter, or the receiver's ``Retry-After``), dead (after
   the last attempt, or at once on an answer that will not change), or — on 410 Gone — the
   subscription is disabled.

Everything lives in the database, so pending deliveries survive a restart.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any

import httpx
from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError

from rankwatch import __version__
from rankwatch.api import payloads
from rankwatch.api.payloads import Event
from rankwatch.api.signing import signature_headers
from rankwatch.api.ssrf import AllowList, Resolver, check_url, system_resolver
from rankwatch.collector.db import Database
from rankwatch.collector.models import DeliveryAttemptRow, DeliveryRow, EventRow, OutboxCursorRow, WebhookRow
from rankwatch.collector.settings import Settings

__all__ = ["Outcome", "WebhookDispatcher", "base_url", "json_body", "new_msg_id"]

logger = logging.getLogger(__name__)

CURSOR = "webhooks"
FAN_OUT_BATCH = 500
GAP_WAIT_S = 30.0  # an id missing this long below newer events was a rolled-back transaction
LEASE_MARGIN_S = 30.0
RETRY_AFTER_MAX_S = 86_400.0
THROTTLED_MIN_S = 60.0  # after a 429 that does not say how long to wait
ERROR_BODY_BYTES = 300
# answers that will not change by asking again (PagerDuty: "400: do not retry"; Slack: invalid_payload, ...)
PERMANENT = {"pagerduty": {400, 401, 403, 404, 413, 422}, "slack": {400, 401, 403, 404}}


def new_msg_id() -> str:
    """A ``webhook-id``: unique per message, the same on every retry and replay of it."""
    return "msg_" + uuid.uuid4().hex


def json_body(body: Any) -> str:
    import json

    return json.dumps(body, separators=(",", ":"), ensure_ascii=False, default=str)


def base_url(settings: Settings) -> str:
    """Where people reach this service, for links in pages."""
    if settings.public_url:
        return settings.public_url.rstrip("/")
    host = settings.host
    if host in ("0.0.0.0", "::", ""):
        import socket

        host = socket.getfqdn()
    if ":" in host:
        host = f"[{host}]"
    return f"{'https' if settings.certfile else 'http'}://{host}:{settings.port}"


@dataclass(frozen=True, slots=True)
class Claim:
    """What one attempt needs, read while claiming (so the attempt itself touches no database)."""

    delivery_id: int
    webhook_id: int
    kind: str
    url: str
    secret: str | None
    routing_key: str | None
    msg_id: str
    body: str
    tries: int
    order_key: str | None


@dataclass(frozen=True, slots=True)
class Outcome:
    """How one attempt went."""

    status_code: int | None
    error: str | None
    duration_ms: float
    retry_after: float | None = None

    @property
    def ok(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


class WebhookDispatcher:
    """Fans out outbox events and delivers them; one per service process.

    Args:
        settings: timeouts, attempts, backoff, the SSRF allow-list, the public URL.
        resolver: host, port -> addresses (tests pin names to loopback with it).
        poll_s: how often to look for new events and due deliveries when nobody wakes the worker.
        per_webhook: attempts in flight at once to one subscription.
        max_in_flight: attempts in flight at once in all.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        resolver: Resolver = system_resolver,
        poll_s: float = 0.25,
        per_webhook: int = 4,
        max_in_flight: int = 64,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.allow = AllowList.parse(settings.webhook_allow)
        self.resolver = resolver
        self.poll_s = poll_s
        self.per_webhook = per_webhook
        self.max_in_flight = max_in_flight
        self.clock = clock
        self.base_url = base_url(settings)
        self.db: Database | None = None
        _quiet_httpx_urls()
        self._rng = random.Random()
        self._fan_out_lock = threading.Lock()
        self._gaps: dict[int, float] = {}
        self._done: set[int] = set()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._stopping = False
        self._in_flight: dict[int, int] = defaultdict(int)
        self._claimed: set[int] = set()
        self._clients: dict[int, httpx.AsyncClient] = {}
        self._db_pool: ThreadPoolExecutor | None = None
        self._dns_pool: ThreadPoolExecutor | None = None

    # -- life -------------------------------------------------------------------------------------
    def start(self, db: Database) -> None:
        """Start delivering from ``db`` in a background thread."""
        self.db = db
        self._stopping = False
        self._db_pool = ThreadPoolExecutor(2, thread_name_prefix="rankwatch-webhooks-db")
        self._dns_pool = ThreadPoolExecutor(16, thread_name_prefix="rankwatch-webhooks-dns")
        ready = threading.Event()
        self._thread = threading.Thread(target=self._thread_main, args=(ready,), name="rankwatch-webhooks", daemon=True)
        self._thread.start()
        ready.wait(10)

    def stop(self) -> None:
        """Stop; attempts in flight are abandoned and retried by the next start (at least once)."""
        self._stopping = True
        self.wake()
        if self._thread is not None:
            self._thread.join(timeout=15)
        for pool in (self._db_pool, self._dns_pool):
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)

    def wake(self) -> None:
        """Look for work now rather than at the next poll (thread-safe)."""
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(wake.set)
            except RuntimeError:
                pass

    def _thread_main(self, ready: threading.Event) -> None:
        try:
            asyncio.run(self._main(ready))
        except Exception:
            logger.exception("webhook worker stopped by an error")

    async def _main(self, ready: threading.Event) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        ready.set()
        tasks: set[asyncio.Task[None]] = set()
        try:
            while not self._stopping:
                self._wake.clear()
                try:
                    await self._db(self.fan_out)
                    room = self.max_in_flight - sum(self._in_flight.values())
                    claims = await self._db(self.claim, room, dict(self._in_flight)) if room > 0 else []
                except Exception:
                    logger.exception("webhook worker: database pass failed")
                    claims = []
                for c in claims:
                    self._in_flight[c.webhook_id] += 1
                    self._claimed.add(c.delivery_id)
                    task = asyncio.create_task(self._deliver(c))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                try:
                    await asyncio.wait_for(self._wake.wait(), self.poll_s)
                except asyncio.TimeoutError:
                    pass
        finally:
            for t in list(tasks):
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for client in self._clients.values():
                await client.aclose()
            self._clients.clear()
            if self._claimed:  # handed back, so the next start retries them at once, not after the lease
                try:
                    self.release(list(self._claimed))
                except Exception:
                    logger.exception("webhook worker: could not release %d claimed deliveries", len(self._claimed))

    async def _db(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._db_pool, fn, *args)

    # -- fan-out ----------------------------------------------------------------------------------
    def fan_out(self) -> int:
        """Turn new outbox events into deliveries; returns how many deliveries it made."""
        assert self.db is not None
        with self._fan_out_lock:
            try:
                return self._fan_out()
            except IntegrityError:  # another process fanned out the same events first
                logger.info("webhook fan-out raced another worker; trying again")
                return 0

    def _fan_out(self) -> int:
        assert self.db is not None
        now = self.clock()
        made = 0
        with self.db.sessions.begin() as s:
            cursor = s.get(OutboxCursorRow, CURSOR)
            if cursor is None:
                cursor = OutboxCursorRow(name=CURSOR, event_id=0)
                s.add(cursor)
            rows = list(
                s.scalars(
                    select(EventRow).where(EventRow.id > cursor.event_id).order_by(EventRow.id).limit(FAN_OUT_BATCH)
                )
            )
            if not rows:
                return 0
            subs = list(s.scalars(select(WebhookRow).where(WebhookRow.enabled.is_(True))))
            opened: dict[int, int | None] = {}
            upto, contiguous = cursor.event_id, True
            for row in rows:
                if contiguous:
                    if row.id == upto + 1:
                        upto = row.id
                    else:  # an id below this one is missing: a transaction still in flight, or rolled back
                        first = self._gaps.setdefault(upto + 1, now)
                        if now - first >= GAP_WAIT_S:
                            self._gaps.pop(upto + 1, None)
                            upto = row.id
                        else:
                            contiguous = False
                if row.id in self._done:
                    continue
                event = Event(
                    type=row.type,
                    at=row.at,
                    job_id=row.job_id,
                    payload=dict(row.payload or {}),
                    id=row.id,
                    suspect_id=row.suspect_id,
                    action_id=row.action_id,
                )
                for sub in subs:
                    if self._matches(s, sub, event, opened):
                        made += self._add_delivery(s, sub, event, now)
                if not contiguous:
                    self._done.add(row.id)
            cursor.event_id = upto
            self._done = {i for i in self._done if i > upto}
        if made:
            logger.info("webhooks: %d deliveries queued", made)
        return made

    def _matches(self, s: Any, sub: WebhookRow, event: Event, opened: dict[int, int | None]) -> bool:
        if event.id is None or event.id <= sub.after_event_id or event.type not in (sub.events or []):
            return False
        if sub.job_id is not None and event.job_id != sub.job_id:
            return False
        if event.type != "suspect.opened" and event.suspect_id is not None:
            # a follow-up goes where its opening went (whatever the score is now), and nowhere else
            if event.suspect_id not in opened:
                opened[event.suspect_id] = s.scalar(
                    select(func.min(EventRow.id)).where(
                        EventRow.suspect_id == event.suspect_id, EventRow.type == "suspect.opened"
                    )
                )
            first = opened[event.suspect_id]
            if first is not None and first > sub.after_event_id:
                key = payloads.order_key(event)
                got = s.scalar(
                    select(DeliveryRow.id)
                    .where(DeliveryRow.webhook_id == sub.id, DeliveryRow.order_key == key)
                    .limit(1)
                )
                return got is not None
        suspect = event.suspect
        if suspect is None:
            return not sub.kinds and sub.min_score is None
        if sub.kinds and suspect.get("kind") not in sub.kinds:
            return False
        score = suspect.get("score")
        return sub.min_score is None or (isinstance(score, (int, float)) and score >= sub.min_score)

    def _add_delivery(self, s: Any, sub: WebhookRow, event: Event, now: float) -> int:
        exists = s.scalar(
            select(DeliveryRow.id).where(DeliveryRow.webhook_id == sub.id, DeliveryRow.event_id == event.id)
        )
        if exists is not None:
            return 0
        body = payloads.render(sub.kind, event, base_url=self.base_url, webhook_id=sub.id, routing_key=sub.routing_key)
        if body is None:
            return 0
        s.add(
            DeliveryRow(
                webhook_id=sub.id,
                event_id=event.id,
                event_type=event.type,
                msg_id=new_msg_id(),
                order_key=payloads.order_key(event),
                body=json_body(body),
                status="pending",
                created_at=now,
                next_attempt_at=now,
                attempts=0,
                tries=0,
            )
        )
        s.flush()
        return 1

    # -- claiming ---------------------------------------------------------------------------------
    def claim(self, room: int, in_flight: dict[int, int] | None = None) -> list[Claim]:
        """Claim up to ``room`` due deliveries, within the per-subscription and per-suspect limits."""
        assert self.db is not None
        busy = in_flight or {}
        now = self.clock()
        lease = self.settings.webhook_timeout_s + LEASE_MARGIN_S
        out: list[Claim] = []
        with self.db.sessions.begin() as s:
            due = s.execute(
                select(DeliveryRow, WebhookRow)
                .join(WebhookRow, WebhookRow.id == DeliveryRow.webhook_id)
                .where(
                    DeliveryRow.status == "pending",
                    DeliveryRow.next_attempt_at <= now,
                    WebhookRow.enabled.is_(True),
                )
                .order_by(DeliveryRow.next_attempt_at, DeliveryRow.id)
                .limit(max(room, 0) * 4 + 50)
            ).all()
            if not due:
                return []
            heads = {
                (w, k): first
                for w, k, first in s.execute(
                    select(DeliveryRow.webhook_id, DeliveryRow.order_key, func.min(DeliveryRow.id))
                    .where(DeliveryRow.status == "pending", DeliveryRow.order_key.is_not(None))
                    .group_by(DeliveryRow.webhook_id, DeliveryRow.order_key)
                )
            }
            taken: dict[int, int] = defaultdict(int)
            for d, sub in due:
                if len(out) >= room:
                    break
                if d.order_key is not None and heads.get((d.webhook_id, d.order_key)) != d.id:
                    continue  # an earlier message about the same suspect goes first
                if busy.get(d.webhook_id, 0) + taken[d.webhook_id] >= self.per_webhook:
                    continue
                got = s.execute(
                    update(DeliveryRow)
                    .where(
                        DeliveryRow.id == d.id,
                        DeliveryRow.status == "pending",
                        DeliveryRow.next_attempt_at == d.next_attempt_at,
                    )
                    .values(next_attempt_at=now + lease)
                    .execution_options(synchronize_session=False)
                )
                if got.rowcount != 1:  # type: ignore[attr-defined]
                    continue  # another worker took it
                taken[d.webhook_id] += 1
                out.append(
                    Claim(
                        delivery_id=d.id,
                        webhook_id=sub.id,
                        kind=sub.kind,
                        url=sub.url,
                        secret=sub.secret,
                        routing_key=sub.routing_key,
                        msg_id=d.msg_id,
                        body=d.body,
                        tries=d.tries,
                        order_key=d.order_key,
                    )
                )
        return out

    def release(self, delivery_ids: list[int]) -> None:
        """Hand claimed deliveries back (due now); used when stopping with attempts in flight."""
        assert self.db is not None
        with self.db.sessions.begin() as s:
            s.execute(
                update(DeliveryRow)
                .where(DeliveryRow.id.in_(delivery_ids), DeliveryRow.status == "pending")
                .values(next_attempt_at=self.clock())
                .execution_options(synchronize_session=False)
            )

    # -- one attempt ------------------------------------------------------------------------------
    async def _deliver(self, c: Claim) -> None:
        cancelled = False
        try:
            outcome = await self.attempt(c)
            await self._db(self.record, c, outcome)
        except asyncio.CancelledError:
            cancelled = True  # stopping: the claim stays listed and is handed back
            raise
        except Exception:
            logger.exception("webhook %d: delivery %d failed unexpectedly", c.webhook_id, c.delivery_id)
        finally:
            self._in_flight[c.webhook_id] -= 1
            if not cancelled:
                self._claimed.discard(c.delivery_id)
            if self._wake is not None:
                self._wake.set()

    async def attempt(self, c: Claim) -> Outcome:
        """POST one delivery to its receiver, within the timeout, to the address the SSRF guard checked."""
        start = time.monotonic()
        timeout = self.settings.webhook_timeout_s
        secrets = _secrets(c)
        try:
            return await asyncio.wait_for(self._post(c, start), timeout)
        except asyncio.TimeoutError:
            return Outcome(None, f"no answer within {timeout:g}s", _ms(start))
        except ValueError as exc:  # the SSRF guard (UnsafeURLError) or a malformed URL
            return Outcome(None, _scrub(str(exc), secrets), _ms(start))
        except httpx.HTTPError as exc:
            return Outcome(None, _scrub(f"{type(exc).__name__}: {exc}", secrets), _ms(start))
        except OSError as exc:
            return Outcome(None, _scrub(f"{type(exc).__name__}: {exc}", secrets), _ms(start))

    async def _post(self, c: Claim, start: float) -> Outcome:
        loop = asyncio.get_running_loop()
        target = await loop.run_in_executor(self._dns_pool, check_url, c.url, self.allow, self.resolver)
        body = c.body.encode()
        headers = {
            "content-type": "application/json",
            "user-agent": f"rankwatch/{__version__}",
            "host": target.host_header,
            **signature_headers(c.secret, c.msg_id, body, now=self.clock()),
        }
        extensions = {"sni_hostname": target.host} if target.url.scheme == "https" else {}
        client = self._client(c.webhook_id)
        request = client.build_request(
            "POST", target.pinned_url(), content=body, headers=headers, extensions=extensions
        )
        response = await client.send(request, stream=True)
        try:
            head = b""
            async for chunk in response.aiter_raw():
                head += chunk
                if len(head) >= ERROR_BODY_BYTES:
                    break
        finally:
            await response.aclose()
        code = response.status_code
        if 200 <= code < 300:
            return Outcome(code, None, _ms(start))
        text = head[:ERROR_BODY_BYTES].decode("utf-8", "replace").strip()
        secrets = _secrets(c)
        if 300 <= code < 400:
            error = f"HTTP {code}: redirects are not followed (Location: {response.headers.get('location', '-')})"
        else:
            error = f"HTTP {code}" + (f": {text}" if text else "")
        return Outcome(code, _scrub(error, secrets), _ms(start), _retry_after(response.headers.get("retry-after")))

    def _client(self, webhook_id: int) -> httpx.AsyncClient:
        client = self._clients.get(webhook_id)
        if client is None:  # one pool per subscription: a connection never carries another's messages
            client = self._clients[webhook_id] = httpx.AsyncClient(
                follow_redirects=False,
                trust_env=False,
                timeout=httpx.Timeout(self.settings.webhook_timeout_s),
                limits=httpx.Limits(max_connections=self.per_webhook, max_keepalive_connections=self.per_webhook),
            )
        return client

    # -- after the attempt ------------------------------------------------------------------------
    def record(self, c: Claim, outcome: Outcome) -> str | None:
        """Log the attempt and decide what becomes of the delivery; returns its new status."""
        assert self.db is not None
        now = self.clock()
        with self.db.sessions.begin() as s:
            d = s.get(DeliveryRow, c.delivery_id)
            if d is None:
                return None  # its subscription was deleted meanwhile
            s.add(
                DeliveryAttemptRow(
                    delivery_id=d.id,
                    at=now,
                    duration_ms=round(outcome.duration_ms, 1),
                    status_code=outcome.status_code,
                    error=outcome.error,
                )
            )
            d.attempts += 1
            d.tries += 1
            d.last_status = outcome.status_code
            d.last_error = outcome.error
            if outcome.ok:
                d.status = "delivered"
                d.delivered_at = now
            elif outcome.status_code == 410:
                d.status = "dead"
                sub = s.get(WebhookRow, d.webhook_id)
                if sub is not None and sub.enabled:
                    sub.enabled = False
                    sub.disabled_at = now
                    sub.disabled_reason = "the receiver answered 410 Gone"
                    s.execute(
                        update(DeliveryRow)
                        .where(DeliveryRow.webhook_id == sub.id, DeliveryRow.status == "pending")
                        .values(status="dead", last_error="webhook disabled: the receiver answered 410 Gone")
                        .execution_options(synchronize_session=False)
                    )
                    logger.warning("webhook %d disabled: its receiver answered 410 Gone", sub.id)
            elif outcome.status_code in PERMANENT.get(c.kind, ()) or d.tries >= self.settings.webhook_max_attempts:
                d.status = "dead"
            else:
                delay = self.delay(d.tries, outcome.retry_after)
                if outcome.status_code == 429 and outcome.retry_after is None:
                    delay = max(delay, THROTTLED_MIN_S)  # PagerDuty: back off "a few minutes"
                d.next_attempt_at = now + delay
            status = d.status
        level = logging.INFO if outcome.ok else logging.WARNING
        logger.log(
            level,
            "webhook %d delivery %d attempt %d: %s -> %s",
            c.webhook_id,
            c.delivery_id,
            c.tries + 1,
            outcome.status_code if outcome.status_code is not None else outcome.error,
            status,
        )
        return status

    def delay(self, tries: int, retry_after: float | None = None) -> float:
        """Seconds before the next attempt: the receiver's ``Retry-After`` if it gave one, else
        ``base * 2**(tries-1)`` capped, with "equal jitter" (half fixed, half random)."""
        if retry_after is not None:
            return min(max(retry_after, 0.0), RETRY_AFTER_MAX_S)
        full = min(self.settings.webhook_retry_cap_s, self.settings.webhook_retry_base_s * 2 ** max(tries - 1, 0))
        return full / 2 + self._rng.uniform(0, full / 2)


class _RedactRequestURLs(logging.Filter):
    """httpx logs every request's full URL at INFO; a webhook URL's path and query can be its secret
    (Slack's is), so the service's copy of that line keeps only the origin."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and record.msg.startswith("HTTP Request:") and isinstance(record.args, tuple):
            args = list(record.args)
            if len(args) >= 2:
                try:
                    url = httpx.URL(str(args[1]))
                    args[1] = f"{url.scheme}://{url.netloc.decode()}/…"
                except Exception:
                    args[1] = "(url)"
                record.args = tuple(args)
        return True


def _quiet_httpx_urls() -> None:
    log = logging.getLogger("httpx")
    if not any(isinstance(f, _RedactRequestURLs) for f in log.filters):
        log.addFilter(_RedactRequestURLs())


def _ms(start: float) -> float:
    return (time.monotonic() - start) * 1000


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        return parsedate_to_datetime(value).timestamp() - time.time()
    except (TypeError, ValueError):
        return None


def _secrets(c: Claim) -> list[str]:
    """What must not appear in a stored error: the signing secret, and the URL's path and query (a
    Slack webhook URL is itself a secret)."""
    out = [x for x in (c.secret, c.routing_key, c.url) if x]
    try:
        url = httpx.URL(c.url)
        out += [url.path, url.query.decode(), *url.path.split("/"), *(v for _, v in url.params.multi_items())]
    except Exception:
        pass
    return sorted({x for x in out if x and len(x) >= 8}, key=len, reverse=True)


def _scrub(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        if secret and len(secret) >= 8:
            text = text.replace(secret, "[redacted]")
    return text[:1000]
