"""Helpers: run a small simulated job through a fresh detector."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from rankwatch.detector import DetectorConfig
from rankwatch.detector.evaluate import EVAL_EVERY_S, ScenarioResult, run_scenario
from rankwatch.detector.job import JobDetector
from rankwatch.sim import PROFILES, Fault, Layout, Profile, Scenario, Workload

Run = Callable[..., ScenarioResult]


@pytest.fixture
def run() -> Run:
    def _run(
        layout: Layout,
        *faults: Fault,
        rate: float = 100.0,
        profile: str | Profile = "quiet",
        duration: float = 45.0,
        seed: int = 1,
        config: DetectorConfig | None = None,
        eval_every: float = EVAL_EVERY_S,
        step_s: float | None = None,
        watch: Callable[[float, JobDetector], None] | None = None,
        **kw: Any,
    ) -> ScenarioResult:
        # ``step_s``: steps of that length instead of the workload ``rate`` makes; ``watch``: reads
        # the detector after each analysis (``run_scenario``'s)
        sc = Scenario(
            name="test",
            layout=layout,
            workload=Workload.for_rate(rate, layout) if step_s is None else Workload(step_s=step_s),
            profile=PROFILES[profile] if isinstance(profile, str) else profile,
            faults=faults,
            duration=duration,
            seed=seed,
            **kw,
        )
        return run_scenario(sc, config, eval_every=eval_every, keep_findings=True, watch=watch)

    return _run


def keys(res: ScenarioResult) -> set[str]:
    return {r.key for r in res.reported}
