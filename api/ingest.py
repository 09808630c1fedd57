"""The fast path of ``POST /ingest``: batches taken without FastAPI's per-request machinery.

Ingest is the one route hit thousands of times a second (every rank, every second). FastAPI's
routing, dependency solving and response handling cost about as much CPU per request as decoding
and folding a 100-op batch, so this ASGI middleware serves the successful case itself: token
check, content type and size, body, ``IngestRouter``, JSON reply. Anything else — no or a wrong
token, a bad content type, an oversized or malformed batch, a database error — is handed, body
and all, to the regular FastAPI route, which gives the same answer it always gave, with errors
mapped in the app's one place. A batch is never taken twice by that hand-over: every failure
that hands over happens before anything of the batch was taken (and a retried batch would be
recognised as a duplicate anyway).
"""

from __future__ import annotations

import logging
from typing import Any

import orjson
from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rankwatch.api.auth import TokenStore
from rankwatch.blockwire import BLOCK_CONTENT_TYPE
from rankwatch.collector.routing import FORWARDED_HEADER, IngestRouter
from rankwatch.errors import AuthError
from rankwatch.multibatch import MULTI_CONTENT_TYPE
from rankwatch.wire import CONTENT_TYPE

__all__ = ["INGEST_CONTENT_TYPES", "FastIngestAPI", "IngestFastPath"]

logger = logging.getLogger(__name__)

INGEST_CONTENT_TYPES = (CONTENT_TYPE, BLOCK_CONTENT_TYPE, MULTI_CONTENT_TYPE, "application/octet-stream")
_FORWARDED = FORWARDED_HEADER.lower().encode()


class FastIngestAPI(FastAPI):
    """The service's FastAPI app with ``IngestFastPath`` in front of its whole middleware stack
    (error, telemetry and body-limit middleware cost a sixth of a batch's CPU on their own)."""

    def build_middleware_stack(self) -> ASGIApp:
        return IngestFastPath(super().build_middleware_stack())


class IngestFastPath:
    """ASGI middleware: serves ``POST /ingest`` when all goes well, else defers to the app."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != "/ingest":
            await self.app(scope, receive, send)
            return
        state = scope["app"].state
        collector = getattr(state, "collector", None)
        headers = dict(scope["headers"])
        ctype = headers.get(b"content-type", b"").decode("latin-1").split(";")[0].strip()
        limit = int(state.settings.max_body_mb * 1024 * 1024)
        length = headers.get(b"content-length", b"")
        if collector is None or ctype not in INGEST_CONTENT_TYPES or (length.isdigit() and int(length) > limit):
            await self.app(scope, receive, send)
            return
        auth = headers.get(b"authorization")
        authorization = auth.decode("latin-1") if auth is not None else None
        tokens: TokenStore = state.tokens
        try:
            principal = tokens.authenticate(authorization, "ingest")
        except AuthError:
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            chunk = message.get("body", b"")
            chunks.append(chunk)
            size += len(chunk)
            more = message.get("more_body", False)
            if size > limit:
                await self.app(scope, _replay(chunks, more, receive), send)
                return
        body = b"".join(chunks)
        router: IngestRouter = state.router
        how: dict[str, Any] = {
            "bound_job": principal.job,
            "authorization": authorization,
            "forwarded": _FORWARDED in headers,
        }
        try:
            if ctype == MULTI_CONTENT_TYPE:
                status, reply = 200, await router.ingest_multi(collector, body, **how)
            else:
                status, reply = await router.ingest(collector, body, **how)
        except Exception:
            await self.app(scope, _replay([body], False, receive), send)
            return
        data = orjson.dumps(reply, option=orjson.OPT_NON_STR_KEYS)
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(data))],
            }
        )
        await send({"type": "http.response.body", "body": data})


def _replay(chunks: list[bytes], more: bool, receive: Receive) -> Receive:
    """A ``receive`` that yields the body already read, then carries on with the real one."""
    pending = list(chunks)

    async def replay() -> Message:
        if pending:
            chunk = pending.pop(0)
            return {"type": "http.request", "body": chunk, "more_body": bool(pending) or more}
        return await receive()

    return replay
