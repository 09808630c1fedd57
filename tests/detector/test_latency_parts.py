"""The evaluation's ``watch`` hook and ``bench/latency_parts.py``, which reads a detection's stages
through it."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from rankwatch.detector.evaluate import EVAL_EVERY_S, run_scenario
from rankwatch.detector.job import JobDetector
from rankwatch.sim import PROFILES, Fault, Layout, Scenario, Workload

BENCH = Path(__file__).resolve().parents[2] / "bench" / "latency_parts.py"


def _straggler(seed: int = 3) -> Scenario:
    lay = Layout(tp=2, pp=1, dp=8)
    return Scenario(
        name="straggler",
        layout=lay,
        workload=Workload.for_rate(100.0, lay),
        profile=PROFILES["quiet"],
        faults=(Fault("slow_compute", "rank", ranks=(5,), factor=1.5, onset=20.0),),
        duration=30.0,
        seed=seed,
    )


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("latency_parts", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_watch_sees_every_analysis_and_the_straggler_among_the_roots_before_it_is_named() -> None:
    sc = _straggler()
    seen: list[tuple[float, set[int]]] = []

    def watch(now: float, det: JobDetector) -> None:
        seen.append((now, set(det.roots)))

    res = run_scenario(sc, watch=watch)
    assert len(seen) == round(sc.duration / EVAL_EVERY_S)
    assert res.latency[0] is not None
    assert not any(roots for t, roots in seen if t < 20.0)  # a quiet healthy job has no root
    first = min(t for t, roots in seen if 5 in roots)
    assert 20.0 < first <= 20.0 + res.latency[0]
    assert all(roots <= {5} for _, roots in seen)


def test_latency_parts_orders_a_stragglers_stages() -> None:
    (row,) = _bench().one(_straggler())
    assert row["level"] == "rank" and row["named"] is not None
    # the evidence comes first, then enough of it, then the rank is a root, then it is named
    assert 0.0 < row["ev"] <= row["hot"] <= row["root"] <= row["named"] < 5.0
    assert row["bar"] >= 3.0 and row["slowdown"] > 1.1
