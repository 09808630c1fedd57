"""``GET /metrics``: Prometheus text a scraper can read, counting what the service really did."""

from __future__ import annotations

import re
from typing import Any

from paging_support import Finding


def _samples(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_metrics_count_suspects_and_deliveries(harness: Any, receiver: Any) -> None:
    h = harness()
    rx = receiver()
    sub = h.subscribe(url=rx.url)
    h.open(Finding(key="straggler:3"))
    h.wait_deliveries(sub["id"], lambda ds: len(ds) == 1 and ds[0]["status"] == "delivered")
    r = h.client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4")
    # every sample line is `name{labels} value`, every metric has HELP and TYPE
    for line in r.text.splitlines():
        assert re.fullmatch(r"# (HELP|TYPE) rankwatch_\w+ .+|rankwatch_\w+(\{[^}]*\})? [0-9.e+-]+", line), line
    got = _samples(r.text)
    assert got['rankwatch_suspects{kind="noncomm_slow",status="active"}'] == 1
    assert got['rankwatch_webhook_deliveries{status="delivered"}'] == 1
    assert got["rankwatch_ingest_batches_total"] == 0
