"""``rankwatch agent``: one process per node (or per rack) that merges its ranks' batches into one
connection.

Ranks on the host point ``RANKWATCH`` at the agent (``http://127.0.0.1:7434``, with their token as
usual) instead of at the collector. The agent gathers what its ranks send into one window per token
and posts the window to the collector in one request. A window closes as soon as every rank the
agent expects has a batch in it, or after ``linger_s`` (1 s) at most. The agent learns who it
serves from the ranks' own batches (job and rank, read from the body's JSON header): a rank is
expected once it has sent, and stops being expected when a window closes on the linger without
it (it is waited for again once it sends again), when it has not sent for ``_STALE_PERIODS`` of
its own send periods, or when its batch says it ended. So a node's ranks, answered together, send
together and are merged whole with a few ms of waiting, while a rank that died or finished makes
the others wait the full linger once. A window opened when no rank is expected (the agent's first,
or after every rank went quiet) waits the full linger: it is what brings ranks flushing on phases
of their own into step.

Raw batches go in a multi-batch (``rankwatch.multibatch``), byte for byte what the rank sent.
Block bodies of one job are merged into one many-rank block body (``rankwatch.blockmerge``), which the collector
decodes, folds and hands to the detector once, since a rank's own block body costs the collector
far more per body than per op; each rank object in it keeps the rank's identity and batch number.
Either way the collector validates and de-duplicates per rank and answers per rank, and the agent
hands each rank its own answer, commands included, as if the rank had talked to the collector
itself. A block body the collector's checks would refuse is not merged: it goes as it came, and
the collector's answer (its 400 and reason) reaches that rank alone. A collector that refuses a
merged body (one older than block wire version 2) gets the ranks' own bodies instead, unmerged.

The agent keeps nothing: a batch is answered only after the collector answered it, so a rank's
retry logic, and its fail-open promise, are unchanged. If the collector cannot be reached, every
waiting rank gets a 503 and retries later. Batches are grouped by the ``Authorization`` they came
with, and only bodies of one job and one token are merged, so each one reaches the collector under
its own rank's token (job-bound tokens still bind). Ranks with a token each are never merged with
each other: each token's batches go upstream on their own.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from rankwatch import __version__
from rankwatch.blockmerge import Item, pack
from rankwatch.blockwire import BLOCK_CONTENT_TYPE, is_block_body
from rankwatch.blockwire import peek_header as block_header
from rankwatch.env import CollectorURL
from rankwatch.errors import WireError
from rankwatch.multibatch import MULTI_CONTENT_TYPE, encode_multi
from rankwatch.wire import CONTENT_TYPE, MAX_BODY_BYTES
from rankwatch.wire import peek_header as batch_header

__all__ = ["DEFAULT_AGENT_PORT", "UPSTREAM_ENV", "Agent", "agent_app"]

logger = logging.getLogger(__name__)

UPSTREAM_ENV = "RANKWATCH_AGENT_UPSTREAM"
DEFAULT_AGENT_PORT = 7434


_Sender = tuple[str, int]
"""Who sent a batch: its job and rank."""


@dataclass
class _Seen:
    """What the agent knows of one sender under one token."""

    at: float
    """When its last batch arrived (the event loop's clock)."""
    period: float | None = None
    """Between its last two batches: its send period, as the agent sees it."""
    missed: bool = False
    """A window closed on the linger without it: not waited for until it sends again."""


@dataclass
class _Pending:
    opened: float
    learning: bool
    """No sender was expected when it opened: it waits the full linger."""
    batches: list[bytes] = field(default_factory=list)
    waiters: list[asyncio.Future[tuple[int, bytes]]] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)
    senders: set[_Sender] = field(default_factory=set)
    size: int = 0
    timer: asyncio.TimerHandle | None = None


class Agent:
    """Gathers batches per token and sends them upstream together (block bodies merged)."""

    def __init__(
        self,
        upstream: CollectorURL,
        *,
        linger_s: float = 1.0,
        max_batches: int = 256,
        max_bytes: int = 32 * 1024 * 1024,
        timeout_s: float = 10.0,
        merge: bool = True,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.upstream = upstream
        self.linger_s = linger_s
        self.max_batches = max_batches
        self.max_bytes = max_bytes
        self.merge = merge
        self._merge_off_until = 0.0
        self._client = httpx.AsyncClient(timeout=timeout_s, transport=transport)
        self._pending: dict[str | None, _Pending] = {}
        self._seen: dict[str | None, dict[_Sender, _Seen]] = {}
        self.stats = {
            "batches": 0,
            "requests": 0,
            "failures": 0,
            "merged": 0,
            "merge_refused": 0,
            "windows": 0,
            "closed_early": 0,
            "held_ms": 0,
        }

    async def aclose(self) -> None:
        for key in list(self._pending):
            await self._flush(key)
        await self._client.aclose()

    async def submit(self, batch: bytes, authorization: str | None) -> tuple[int, bytes]:
        """Queue one rank's batch; returns the collector's answer to it (status, JSON body)."""
        if authorization is None and self.upstream.token:
            authorization = f"Bearer {self.upstream.token}"
        loop = asyncio.get_running_loop()
        now = loop.time()
        seen = self._seen.setdefault(authorization, {})
        pending = self._pending.get(authorization)
        if pending is None:
            _forget(seen, now, self.linger_s)
            learning = not any(self._expected(s, now) for s in seen.values())
            pending = self._pending[authorization] = _Pending(opened=now, learning=learning)
            pending.timer = loop.call_later(
                self.linger_s, lambda: asyncio.ensure_future(self._flush(authorization, lingered=True))
            )
            self.stats["windows"] += 1
        waiter: asyncio.Future[tuple[int, bytes]] = loop.create_future()
        pending.batches.append(batch)
        pending.waiters.append(waiter)
        pending.arrivals.append(now)
        pending.size += len(batch)
        self.stats["batches"] += 1
        senders, ended = _senders(batch)
        for sender in senders:
            last = seen.get(sender)
            if last is None:
                seen[sender] = _Seen(at=now)
            else:
                last.period, last.at, last.missed = now - last.at, now, False
        for sender in ended:  # its last batch: nobody waits for it again
            seen.pop(sender, None)
        pending.senders.update(senders)
        if len(pending.batches) >= self.max_batches or pending.size >= self.max_bytes:
            await self._flush(authorization)
        elif not pending.learning and all(
            sender in pending.senders for sender, s in seen.items() if self._expected(s, now)
        ):
            self.stats["closed_early"] += 1
            await self._flush(authorization)
        return await waiter

    def _expected(self, seen: _Seen, now: float) -> bool:
        """Whether a window waits for this sender: it sent lately and did not miss the last window."""
        if seen.missed:
            return False
        return seen.period is None or now - seen.at <= _STALE_PERIODS * max(seen.period, self.linger_s)

    async def _flush(self, key: str | None, *, lingered: bool = False) -> None:
        pending = self._pending.pop(key, None)
        if pending is None:
            return
        if pending.timer is not None:
            pending.timer.cancel()
        now = asyncio.get_running_loop().time()
        if lingered:  # whoever the window waited for in vain is not waited for again until it sends
            for sender, s in self._seen.get(key, {}).items():
                if sender not in pending.senders and self._expected(s, now):
                    s.missed = True
                    logger.info("job %s rank %d sent nothing within the linger; not waiting for it", *sender)
        self.stats["held_ms"] += round(1000 * sum(now - t for t in pending.arrivals))
        answers = await self._send(pending.batches, key)
        for waiter, answer in zip(pending.waiters, answers, strict=True):
            if not waiter.done():
                waiter.set_result(answer)

    async def _send(self, batches: list[bytes], authorization: str | None) -> list[tuple[int, bytes]]:
        """Send what was gathered under one token; one (status, JSON body) per batch, in order."""
        if len(batches) > 1 and self.merge and time.monotonic() >= self._merge_off_until:
            items = await asyncio.to_thread(pack, batches, max_ranks=self.max_batches)
        else:
            items = [Item(b, [i]) for i, b in enumerate(batches)]
        answers: list[tuple[int, bytes]] = [(502, _NO_ANSWER)] * len(batches)
        again: list[int] = []
        for item, (status, reply) in zip(items, await self._post(items, authorization), strict=True):
            if not item.merged:
                answers[item.members[0]] = (status, reply if isinstance(reply, bytes) else _dump(reply))
                continue
            results = reply.get("results") if isinstance(reply, dict) else None
            if status == 200 and isinstance(results, list) and len(results) == len(item.members):
                self.stats["merged"] += len(item.members)
                for i, r in zip(item.members, results, strict=True):
                    answers[i] = _unwrap(r)
            elif status == 400:
                # a collector that does not read merged bodies (older than block wire version 2):
                # the ranks' own bodies go as they came, and are answered one by one
                self.stats["merge_refused"] += 1
                self._merge_off_until = time.monotonic() + _MERGE_OFF_S
                detail = reply.get("detail") if isinstance(reply, dict) else reply
                logger.warning("the collector refused a merged block body (%s); sending bodies unmerged", detail)
                again.extend(item.members)
            else:  # the request's own answer (a 401, 403, 503...): every rank in it gets it
                body = reply if isinstance(reply, bytes) else _dump(reply)
                for i in item.members:
                    answers[i] = (status, body)
        if again:
            retry = [Item(batches[i], [i]) for i in again]
            for item, (status, reply) in zip(retry, await self._post(retry, authorization), strict=True):
                answers[item.members[0]] = (status, reply if isinstance(reply, bytes) else _dump(reply))
        return answers

    async def _post(self, items: list[Item], authorization: str | None) -> list[tuple[int, bytes | dict[str, Any]]]:
        """One request upstream (a multi-batch when there are several items): each item's status
        and reply, parsed where the agent must look inside (multi-batch results, merged bodies)."""
        multi = len(items) > 1
        headers = {
            "Content-Type": MULTI_CONTENT_TYPE if multi else _ctype(items[0].body),
            "User-Agent": f"rankwatch-agent/{__version__}",
        }
        if authorization:
            headers["Authorization"] = authorization
        self.stats["requests"] += 1
        content = encode_multi([it.body for it in items]) if multi else items[0].body
        try:
            resp = await self._client.post(self.upstream.base + "/ingest", content=content, headers=headers)
        except httpx.HTTPError as exc:
            self.stats["failures"] += 1
            logger.warning("collector %s unreachable: %s", self.upstream.base, type(exc).__name__)
            return [(503, {"detail": "the collector cannot be reached from the agent; retry"})] * len(items)
        if not multi:
            if not items[0].merged:
                return [(resp.status_code, resp.content)]
            try:
                reply = json.loads(resp.content)
            except ValueError:
                reply = resp.content
            return [(resp.status_code, reply)]
        if resp.status_code == 200:
            try:
                results = json.loads(resp.content)["results"]
            except (ValueError, KeyError, TypeError):
                results = None
            if isinstance(results, list) and len(results) == len(items):
                out: list[tuple[int, bytes | dict[str, Any]]] = []
                for r in results:
                    if not isinstance(r, dict):
                        out.append((502, _NO_ANSWER))
                        continue
                    status = r.pop("status", 502)
                    out.append((int(status) if isinstance(status, int) else 502, r))
                return out
            return [(502, b'{"detail":"the collector answered the agent with something unreadable"}')] * len(items)
        return [(resp.status_code, resp.content)] * len(items)


_STALE_PERIODS = 3
"""A sender not heard from for this many of its send periods (or linger times, if longer) is not
waited for: a rank flushing each period after its answer is seen about once per period plus the
window's wait, so three periods are two missed sends, not jitter."""
_FORGET_S = 600.0


def _senders(body: bytes) -> tuple[list[_Sender], list[_Sender]]:
    """Who a batch speaks for (job, rank), from its JSON header, and which of them it says ended.

    A body the agent cannot read speaks for nobody: the collector answers it, and no window waits.
    """
    try:
        block = is_block_body(body)
        header = block_header(body) if block else batch_header(body)
        job = header["job"]
        ranks = header["ranks"] if block else [header]
        senders = [(job, r["rank"]) for r in ranks]
        ended = [(job, r["rank"]) for r in ranks if r.get("end_reason") or r.get("state", "running") != "running"]
    except (WireError, KeyError, TypeError, AttributeError):
        return [], []
    if not isinstance(job, str) or not all(type(rank) is int for _, rank in senders):
        return [], []
    return senders, ended


def _forget(seen: dict[_Sender, _Seen], now: float, linger_s: float) -> None:
    """Drop senders long gone, so jobs that ended leave nothing behind."""
    for sender in [k for k, s in seen.items() if now - s.at > max(_FORGET_S, 10 * (s.period or linger_s))]:
        del seen[sender]


_NO_ANSWER = b'{"detail":"the collector gave no answer for this batch"}'
_MERGE_OFF_S = 60.0


def _dump(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode()


def _unwrap(result: Any) -> tuple[int, bytes]:
    """A rank's entry in the results of a merged body: its status and its own reply."""
    if not isinstance(result, dict):
        return 502, _NO_ANSWER
    result = dict(result)
    status = result.pop("status", 502)
    return (int(status) if isinstance(status, int) else 502), _dump(result)


def agent_app(agent: Agent, *, max_body: int = MAX_BODY_BYTES) -> Any:
    """The agent's ASGI app: ``POST /ingest`` (what ranks send) and ``GET /healthz``."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await agent.aclose()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        if scope["method"] == "GET" and scope["path"] == "/healthz":
            await _reply(
                send, 200, {"ok": True, "version": __version__, "upstream": agent.upstream.base, **agent.stats}
            )
            return
        if scope["path"] != "/ingest":
            await _reply(send, 404, {"detail": "the agent serves POST /ingest and GET /healthz"})
            return
        if scope["method"] != "POST":
            await _reply(send, 405, {"detail": "POST batches to /ingest"})
            return
        headers = dict(scope["headers"])
        ctype = headers.get(b"content-type", b"").decode("latin-1").split(";")[0].strip()
        if ctype not in (CONTENT_TYPE, BLOCK_CONTENT_TYPE, "application/octet-stream"):
            await _reply(send, 415, {"detail": f"batches must be sent as {CONTENT_TYPE} or {BLOCK_CONTENT_TYPE}"})
            return
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
            if size > max_body:
                await _reply(send, 413, {"detail": f"batch is larger than the limit of {max_body} bytes"})
                return
        auth = headers.get(b"authorization")
        status, body = await agent.submit(b"".join(chunks), auth.decode("latin-1") if auth else None)
        await _send_raw(send, status, body)

    return app


async def _reply(send: Any, status: int, payload: dict[str, Any]) -> None:
    await _send_raw(send, status, json.dumps(payload).encode())


async def _send_raw(send: Any, status: int, body: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _ctype(body: bytes) -> str:
    """The content type of one batch, raw or block summaries."""
    return BLOCK_CONTENT_TYPE if is_block_body(body) else CONTENT_TYPE
