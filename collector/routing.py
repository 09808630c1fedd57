"""Ingest routing: every batch goes to the process that holds its job's lease.

With one service process that is always this one. With several sharing a database, a batch that
reaches a process not holding its job's lease is forwarded over HTTP to the holder's advertised
URL, with the rank's own ``Authorization`` header, and the holder's reply (and the commands in
it) is relayed to the rank. A forwarded batch is never forwarded again: if the lease moved
meanwhile, the rank gets a 503 and retries. A holder that does not answer also gets the rank a
503; its lease runs out, and the next batch (or the lease sweep) moves the job here.

A process finds out that a batch is not its own after decoding it (``Collector.ingest`` raises
``NotHolder``): a batch costs the forwarding process a decode, and nothing on the common path of
one process holding its own jobs. Multi-batch bodies (``rankwatch agent``) are split per batch,
routed per job, and answered per batch in one reply; a batch's status there follows the mapping
the service uses for a single batch (malformed 400, token bound to another job 403).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import httpx

from rankwatch.blockwire import BLOCK_CONTENT_TYPE, is_block_body
from rankwatch.collector.leases import NotHolder
from rankwatch.collector.service import Collector
from rankwatch.errors import WireError
from rankwatch.multibatch import MULTI_CONTENT_TYPE, decode_multi, encode_multi
from rankwatch.wire import CONTENT_TYPE

__all__ = ["FORWARDED_HEADER", "IngestRouter"]

logger = logging.getLogger(__name__)

FORWARDED_HEADER = "X-Rankwatch-Forwarded-By"


class IngestRouter:
    """Routes ingest requests to this process's collector or to the lease holder's process."""

    def __init__(self, *, timeout_s: float = 10.0, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.timeout_s = timeout_s
        self._transport = transport
        self._client: httpx.AsyncClient | None = None
        self.forwarded = 0
        self.forward_failures = 0

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(
                timeout=self.timeout_s, transport=self._transport, limits=httpx.Limits(max_keepalive_connections=32)
            )
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def ingest(
        self,
        collector: Collector,
        body: bytes,
        *,
        bound_job: str | None,
        authorization: str | None,
        forwarded: bool,
    ) -> tuple[int, dict[str, Any]]:
        """One batch: ingest it here, or forward it to its job's holder.

        Returns:
            The HTTP status and JSON reply for the rank.

        Raises:
            WireError, PermissionError: as ``Collector.ingest`` (mapped to HTTP by the app).
        """
        try:
            return 200, collector.ingest(body, bound_job=bound_job)
        except NotHolder as exc:
            holder, job_id = exc.url, exc.job_id
        if forwarded:
            return 503, {"detail": "this batch's job moved to another rankwatch process; retry"}
        (result,) = await self._forward(collector, holder, [(job_id, body)], authorization)
        status = int(result.pop("status"))
        return status, result

    async def ingest_multi(
        self,
        collector: Collector,
        body: bytes,
        *,
        bound_job: str | None,
        authorization: str | None,
        forwarded: bool,
    ) -> dict[str, Any]:
        """A multi-batch: each batch routed and answered on its own, in order.

        Raises:
            WireError: the multi-batch framing itself is malformed.
        """
        items = decode_multi(body)
        results: list[dict[str, Any] | None] = [None] * len(items)
        remote: dict[str, list[tuple[int, str]]] = {}
        for i, item in enumerate(items):
            try:
                results[i] = {"status": 200, **collector.ingest(item, bound_job=bound_job)}
            except WireError as exc:
                results[i] = {"status": 400, "detail": f"malformed batch: {exc}"}
            except PermissionError as exc:
                results[i] = {"status": 403, "detail": str(exc)}
            except NotHolder as exc:
                if forwarded:
                    results[i] = {"status": 503, "detail": "this batch's job moved to another rankwatch process; retry"}
                else:
                    remote.setdefault(exc.url, []).append((i, exc.job_id))
        if remote:
            replies = await asyncio.gather(
                *(
                    self._forward(collector, url, [(job, items[i]) for i, job in idx], authorization)
                    for url, idx in remote.items()
                )
            )
            for idx, got in zip(remote.values(), replies, strict=True):
                for (i, _), r in zip(idx, got, strict=True):
                    results[i] = r
        return {"results": results}

    async def _forward(
        self, collector: Collector, url: str, jobs_items: list[tuple[str, bytes]], authorization: str | None
    ) -> list[dict[str, Any]]:
        """Send (job, batch) pairs to the process at ``url``; one result (with ``status``) per batch."""
        items = [b for _, b in jobs_items]
        multi = len(items) > 1
        headers = {
            "Content-Type": MULTI_CONTENT_TYPE if multi else _ctype(items[0]),
            FORWARDED_HEADER: collector.instance,
        }
        if authorization:
            headers["Authorization"] = authorization
        body = encode_multi(items) if multi else items[0]
        self.forwarded += len(items)
        try:
            resp = await self._http().post(url.rstrip("/") + "/ingest", content=body, headers=headers)
            reply = json.loads(resp.content) if resp.content else {}
        except (httpx.HTTPError, ValueError) as exc:
            self.forward_failures += 1
            for job_id, _ in jobs_items:
                collector.leases.forget_foreign(job_id)
            logger.warning("forwarding %d batches to %s failed: %s", len(items), url, type(exc).__name__)
            detail = "the rankwatch process analysing this job did not answer; retry"
            return [{"status": 503, "detail": detail} for _ in items]
        if not isinstance(reply, dict):
            reply = {}
        if multi and resp.status_code == 200 and isinstance(reply.get("results"), list):
            results = [r if isinstance(r, dict) else {"status": 502} for r in reply["results"]]
            if len(results) == len(items):
                return results
        if multi or resp.status_code != 200:
            # one answer for the whole request (a 401, a 413...): every batch in it gets it
            return [{"status": resp.status_code, **reply} for _ in items]
        return [{"status": 200, **reply}]


def _ctype(body: bytes) -> str:
    """The content type of one batch, raw or block summaries."""
    return BLOCK_CONTENT_TYPE if is_block_body(body) else CONTENT_TYPE
