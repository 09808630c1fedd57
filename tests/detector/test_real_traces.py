"""The detector on batches captured from real torchrun jobs on this machine (``tests/data``).

Simulated traces prove the detector's reach; these keep it honest about real ones: real gloo
timings, DDP's bucketed all-reduces, real shipper batching and clocks. Each capture is the list of
batch bodies the hooks sent, with the time each reached the collector; replaying them through
``JobDetector`` and evaluating every 0.5 s is exactly what the service does.

    demo_healthy     rankwatch demo's job, 4 ranks, DDP, nothing injected
    demo_straggler   the same with RANKWATCH_INJECT=slow:rank=2,delay=0.05,after=3
    loop_slow_rank   tests/hooks/scripts/loop.py, 4 ranks, slow:rank=3,delay=0.03,after=8
    loop_stall       loop.py, 4 ranks, stall:rank=2,seq=200 (rank 2 never enters op 200)
"""

from __future__ import annotations

import base64
import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from rankwatch.detector import DetectorConfig, JobDetector
from rankwatch.wire import decode_batch

DATA = Path(__file__).resolve().parents[1] / "data"


def replay(name: str, tail_s: float = 10.0) -> list[tuple[float, Any]]:
    """(time since the first batch, finding) for every suspect key, when it first appeared."""
    with gzip.open(DATA / f"{name}.rwcap.json.gz", "rt") as f:
        batches = json.load(f)["batches"]
    det = JobDetector(DetectorConfig())
    base = 1_800_000_000.0
    t_eval, seen, out = base, set(), []

    def evaluate(until: float) -> None:
        nonlocal t_eval
        while t_eval + 0.5 <= until:
            t_eval += 0.5
            for finding in det.evaluate(t_eval):
                if finding.key not in seen:
                    seen.add(finding.key)
                    out.append((t_eval - base, finding))

    for t, body in batches:
        evaluate(base + t)
        det.observe(decode_batch(base64.b64decode(body)), base + t)
    evaluate(base + batches[-1][0] + tail_s)
    return out


def _summary(found: list[tuple[float, Any]]) -> list[tuple[float, str, str, list[int]]]:
    return [(round(t, 1), f.kind, f.level, list(f.ranks)) for t, f in found]


def test_healthy_demo_job_has_no_suspect() -> None:
    assert _summary(replay("demo_healthy")) == []


@pytest.mark.parametrize(("name", "rank"), [("demo_straggler", 2), ("loop_slow_rank", 3)])
def test_a_real_straggler_is_found(name: str, rank: int) -> None:
    found = replay(name)
    kinds = [(f.kind, f.level, list(f.ranks)) for _, f in found]
    assert ("noncomm_slow", "rank", [rank]) in kinds, _summary(found)
    assert all(list(f.ranks) == [rank] for _, f in found), _summary(found)  # and nobody else


def test_a_real_stall_is_a_noncomm_hang() -> None:
    found = replay("loop_stall")
    assert [(f.kind, list(f.ranks)) for _, f in found] == [("noncomm_hang", [2])], _summary(found)
