"""Block mode with long blocks: 64 ops at 100 ops per second span 0.64 s, longer than a lateness bucket."""

from __future__ import annotations

import pytest

from rankwatch.detector import JobDetector
from rankwatch.sim import PROFILES, Layout, Scenario, Workload
from rankwatch.sim.faults import Fault
from rankwatch.sim.stream import stream_blocks


def _first_reports(block_s: float, culprit: int | None) -> dict[str, float]:
    lay = Layout(tp=8, pp=2, dp=8)  # 128 ranks, 16 nodes
    faults = () if culprit is None else (Fault("slow_compute", "rank", ranks=(culprit,), factor=2.0, onset=25.0),)
    sc = Scenario(
        "long-blocks",
        layout=lay,
        workload=Workload.for_rate(100.0, lay),
        profile=PROFILES["cpu_noise"],
        duration=40.0,
        seed=3,
        faults=faults,
    )
    det = JobDetector()
    first: dict[str, float] = {}
    t_next = 1.0
    for d in stream_blocks(sc, agent_ranks=64, block_s=block_s):
        while d.received_at > t_next:
            for f in det.evaluate(t_next):
                first.setdefault(f.key, t_next)
            t_next += 1.0
        det.observe_blocks(d.batch, d.received_at)
    return first


@pytest.mark.parametrize("block_s", [0.2, 0.64])
def test_a_straggler_is_named_whatever_the_block_length(block_s: float) -> None:
    first = _first_reports(block_s, culprit=45)
    assert set(first) == {"noncomm_slow:rank:45"}
    assert first["noncomm_slow:rank:45"] - 25.0 <= 8.0


def test_long_blocks_of_a_healthy_job_name_nobody() -> None:
    assert _first_reports(0.64, culprit=None) == {}
