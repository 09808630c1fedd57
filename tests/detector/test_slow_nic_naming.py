"""A slow NIC is named as its node from the start, not first as one of its links."""

from __future__ import annotations

import pytest

from rankwatch.detector.config import DetectorConfig
from rankwatch.detector.evaluate import run_scenario
from rankwatch.sim.suite import build_suite


@pytest.mark.parametrize("name", ["tune-slow_nic-000", "tune-slow_nic-007"])
def test_a_slow_nic_is_named_as_its_node_only(name: str) -> None:
    sc = next(s for s in build_suite("tune") if s.name == name)
    res = run_scenario(sc)
    comm = [r for r in res.reported if r.kind == "comm_slow"]
    assert comm, "the slow NIC was not reported"
    assert all(r.level == "node" for r in comm), [r.key for r in comm]
    assert res.latency[0] is not None and res.latency[0] <= 6.0


def test_a_link_named_first_gives_way_to_the_nic_that_explains_more() -> None:
    # without the hold a slow NIC's busiest link is named first; the name must then widen to the node
    sc = next(s for s in build_suite("tune") if s.name == "tune-slow_nic-000")
    res = run_scenario(sc, DetectorConfig(link_hold_s=0.0))
    assert next(r.level for r in res.reported if r.kind == "comm_slow") == "link"
    assert res.latency[0] is not None, [r.key for r in res.reported]
