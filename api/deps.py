"""FastAPI dependencies every router shares: the caller's scope, the collector, the webhook worker.

``ReadDep``/``AdminDep``/``IngestDep`` make a route need a token of that scope (an admin token
also reads). ``tests/api/test_access.py`` walks every route of the app and fails if one is not
protected as the rule says: ``GET`` needs read, every change needs admin, ``/ingest`` needs ingest.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from fastapi import Depends, Request

from rankwatch.api.auth import Principal, TokenStore
from rankwatch.api.delivery import WebhookDispatcher
from rankwatch.collector.service import Collector

__all__ = [
    "AdminDep",
    "CollectorDep",
    "DispatcherDep",
    "IngestDep",
    "ReadDep",
    "get_collector",
    "get_dispatcher",
    "require",
]


def require(need: str) -> Callable[[Request], Principal]:
    """A dependency that lets a request through only with a token of scope ``need``."""

    def dependency(request: Request) -> Principal:
        tokens: TokenStore = request.app.state.tokens
        return tokens.authenticate(request.headers.get("authorization"), need)

    dependency.__name__ = f"require_{need}"
    return dependency


IngestDep = Annotated[Principal, Depends(require("ingest"))]
ReadDep = Annotated[Principal, Depends(require("read"))]
AdminDep = Annotated[Principal, Depends(require("admin"))]


def get_collector(request: Request) -> Collector:
    return request.app.state.collector  # type: ignore[no-any-return]


def get_dispatcher(request: Request) -> WebhookDispatcher | None:
    return getattr(request.app.state, "webhooks", None)


CollectorDep = Annotated[Collector, Depends(get_collector)]
DispatcherDep = Annotated[WebhookDispatcher | None, Depends(get_dispatcher)]
