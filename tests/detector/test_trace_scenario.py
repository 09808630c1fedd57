"""``bench/trace_scenario.py``: one scenario of the suite, read analysis by analysis through the
evaluation's ``watch`` hook."""

from __future__ import annotations

import io
import re

import pytest
from support import load_bench

from rankwatch.detector.evaluate import EVAL_EVERY_S, run_scenario


def test_a_stragglers_trace_shows_it_a_root_and_hot_before_the_latency_the_evaluation_gives() -> None:
    tool = load_bench("trace_scenario")
    sc = tool.find("smoke-straggler-000")  # tp8pp2dp2, rank 29 1.x slower from its onset
    (fault,) = sc.faults
    (rank,) = fault.ranks
    out = io.StringIO()
    tool.trace(sc, fault.onset, fault.onset + 10.0, roots=True, rank=rank, stages=True, out=out)
    text = out.getvalue()
    want = run_scenario(sc).latency[0]
    assert want is not None
    assert text.splitlines()[-1] == f"result: latency {want:.1f} s; false suspects none"
    blocks = re.split(r"^ *(\d+\.\d) s$", text, flags=re.M)[1:]
    times = [float(t) for t in blocks[0::2]]
    assert len(times) == round(10.0 / EVAL_EVERY_S)
    assert all(fault.onset <= t <= fault.onset + 10.0 for t in times)
    body = dict(zip(times, blocks[1::2], strict=True))
    # every block: its roots, each of the rank's slots, and a line per node for the stage test
    for b in body.values():
        assert "roots [" in b
        assert b.count(f"rank {rank} ") >= 3
        assert len(re.findall(r"^  node\d+: share ", b, flags=re.M)) == sc.layout.world // 8
    root_at = min(t for t, b in body.items() if re.search(rf"roots \[[^]]*\b{rank}\b", b))
    hot_at = min(t for t, b in body.items() if re.search(rf"rank {rank} .* hot", b))
    assert root_at <= fault.onset + want and hot_at <= fault.onset + want


def test_a_setting_tried_is_said_first() -> None:
    tool = load_bench("trace_scenario")
    out = io.StringIO()
    tool.trace(tool.find("smoke-crash-000"), 1e9, 1e9, roots=True, config_overrides=["hold_s=0.5"], out=out)
    assert out.getvalue().splitlines()[0] == "settings changed from the code's: hold_s=0.5"


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("bogus-straggler-000", "a scenario is named <split>-<class>-<nnn>"),
        ("heldout-nope-000", "no such scenario in split 'heldout'"),
        ("sealed-straggler-000", "sealed's scenarios are not traced"),
    ],
)
def test_a_scenario_that_is_not_there_or_is_sealed_is_refused(name: str, says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        load_bench("trace_scenario").find(name)
