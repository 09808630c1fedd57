"""Shared pieces of the remediation end-to-end tests: waiting on the action log, reading a training
script's progress file, and recording the figures ``bench/remediation.py`` prints."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
from support import Service

FIGURES_ENV = "RANKWATCH_BENCH_FIGURES"  # bench/remediation.py: a JSON-lines file the tests append figures to


def when(stamp: str) -> float:
    """An ISO time from the API as epoch seconds."""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def actions(service: Service, job: str) -> list[dict[str, Any]]:
    return sorted(service.get("/actions", job_id=job), key=lambda a: a["id"])


def wait_for(what: str, fn: Callable[[], Any], timeout: float, every: float = 0.25) -> Any:
    """``fn()`` once it is truthy; AssertionError naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"{what}: not within {timeout}s (last: {last})")


def post(service: Service, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(service.url + path, json=body, headers=service.headers, timeout=30)
    assert r.status_code in (200, 201), r.text
    return r.json()  # type: ignore[no-any-return]


def progress(path: Path) -> list[tuple[int, float, int, int]]:
    """(step, wall time, restart, world) per step rank 0 finished, in order."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 4:
            out.append((int(parts[0]), float(parts[1]), int(parts[2]), int(parts[3])))
    return out


def recovery_figures(
    rows: list[tuple[int, float, int, int]], suspect_at: float, resumed_from: int
) -> tuple[float, int, int]:
    """(seconds from the suspect to the first step after the restart, steps lost, last step before)."""
    before = [r for r in rows if r[2] == rows[0][2]]
    after = [r for r in rows if r[2] != rows[0][2]]
    assert after, "the job never stepped after a restart"
    last_before = before[-1][0]
    return after[0][1] - suspect_at, last_before - resumed_from, last_before


def record(path: str, **figures: Any) -> None:
    """Print the measured figures and, for the benchmark, append them to ``$RANKWATCH_BENCH_FIGURES``."""
    print("figures:", json.dumps(figures))
    out = os.environ.get(FIGURES_ENV)
    if out:
        with open(out, "a") as f:
            f.write(json.dumps({"path": path, **figures}) + "\n")
