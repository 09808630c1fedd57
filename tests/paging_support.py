"""Test support for paging: a real HTTP receiver on loopback that records every request and answers
from a script, and the service in-process with its webhook worker, suspects written through
``SuspectStore`` (the transaction that writes the outbox events)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from rankwatch.api.app import create_app
from rankwatch.api.delivery import WebhookDispatcher
from rankwatch.api.ssrf import Resolver, system_resolver
from rankwatch.collector.db import open_database
from rankwatch.collector.models import JobRow
from rankwatch.collector.service import Collector
from rankwatch.collector.settings import Settings


@dataclass
class Reply:
    """What the receiver answers to one request; ``hang`` never answers (until the receiver closes)."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    hang: bool = False


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float  # time.monotonic() when it arrived
    answered: int | None = None

    def json(self) -> Any:
        import json

        return json.loads(self.body)


class Receiver:
    """``Receiver(script=[Reply(500), Reply(200)])``: answers the first requests from ``script``,
    later ones with ``default``. ``requests`` holds every request in arrival order."""

    def __init__(self, script: list[Reply] | None = None, default: Reply | None = None) -> None:
        self.script = list(script or [])
        self.default = default or Reply(200)
        self.requests: list[Received] = []
        self.closing = threading.Event()
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                n = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(n)
                got = Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body, time.monotonic())
                with receiver._lock:
                    receiver.requests.append(got)
                    reply = receiver.script.pop(0) if receiver.script else receiver.default
                if reply.hang:
                    receiver.closing.wait(120)
                    return
                got.answered = reply.status
                self.send_response(reply.status)
                for k, v in reply.headers.items():
                    self.send_header(k, v)
                self.send_header("content-length", str(len(reply.body)))
                self.end_headers()
                self.wfile.write(reply.body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def wait_for(self, n: int, timeout: float = 10.0) -> list[Received]:
        """At least ``n`` requests, or AssertionError after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if len(self.requests) >= n:
                    return list(self.requests)
            time.sleep(0.02)
        raise AssertionError(f"receiver got {len(self.requests)} requests in {timeout}s, expected {n}")

    def close(self) -> None:
        self.closing.set()
        self.server.shutdown()
        self.server.server_close()


FAST = {
    "webhook_allow": ["127.0.0.1"],
    "webhook_retry_base_s": 0.05,
    "webhook_retry_cap_s": 0.2,
    "webhook_timeout_s": 5.0,
    "webhook_max_attempts": 3,
    "public_url": "https://rankwatch.example",
}


@dataclass
class Finding:
    """What the detector reports (the fields ``SuspectStore.reconcile`` reads)."""

    key: str
    kind: str = "noncomm_slow"
    level: str = "rank"
    ranks: list[int] = field(default_factory=lambda: [3])
    nodes: list[str] = field(default_factory=lambda: ["gpu017"])
    link: tuple[str, str] | None = None
    score: float = 0.9
    slowdown: float | None = 1.5
    first_seen: float = 0.0
    evidence: dict[str, Any] = field(default_factory=lambda: {"lateness_ms": {"3": 48.0}, "groups": ["0"]})


class Harness:
    """The service in-process (``TestClient``), with its collector and webhook worker running."""

    def __init__(self, tmp: Path, resolver: Resolver = system_resolver, **settings: Any) -> None:
        self.settings = Settings(data_dir=tmp, **{**FAST, **settings})
        self.collector = Collector(self.settings, open_database(self.settings.database_url))
        self.dispatcher = WebhookDispatcher(self.settings, resolver=resolver, poll_s=0.05)
        self.app = create_app(self.settings, collector=self.collector, webhooks=self.dispatcher)
        self.client = TestClient(self.app)
        self.client.__enter__()
        self.findings: dict[str, list[Finding]] = {}

    def close(self) -> None:
        self.client.__exit__(None, None, None)
        self.collector.db.close()

    def subscribe(self, **body: Any) -> dict[str, Any]:
        r = self.client.post("/webhooks", json=body)
        assert r.status_code == 201, r.text
        return r.json()  # type: ignore[no-any-return]

    def open(self, finding: Finding, job: str = "job-a") -> dict[str, Any]:
        """Open a suspect (writes ``suspect.opened`` to the outbox, as the analysis loop does)."""
        with self.collector.db.sessions.begin() as s:
            now = time.time()
            if s.get(JobRow, job) is None:
                s.add(JobRow(id=job, first_seen=now, last_seen=now, world=8, state="running"))
        if not finding.first_seen:
            finding.first_seen = time.time() - 5
        self.findings.setdefault(job, []).append(finding)
        (event,) = self.collector.suspects.reconcile(job, self.findings[job], True, time.time())
        return event["suspect"]  # type: ignore[no-any-return]

    def resolve(self, key: str, job: str = "job-a") -> None:
        """The detector stops reporting ``key``: the suspect resolves (``suspect.resolved``)."""
        self.findings[job] = [f for f in self.findings[job] if f.key != key]
        self.collector.suspects.reconcile(job, self.findings[job], True, time.time())

    def deliveries(self, webhook_id: int, **params: Any) -> list[dict[str, Any]]:
        r = self.client.get(f"/webhooks/{webhook_id}/deliveries", params=params)
        assert r.status_code == 200, r.text
        return r.json()  # type: ignore[no-any-return]

    def wait_deliveries(
        self, webhook_id: int, pred: Callable[[list[dict[str, Any]]], bool], timeout: float = 10.0
    ) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        got: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            got = self.deliveries(webhook_id)
            if pred(got):
                return got
            time.sleep(0.05)
        raise AssertionError(f"deliveries of webhook {webhook_id} did not get there in {timeout}s: {got}")
