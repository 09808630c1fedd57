"""``bench/detector_scale.py``: the layouts it measures, and a small run end to end."""

from __future__ import annotations

import pytest
from support import load_bench

from rankwatch.sim import Layout


def test_the_default_layouts_are_pipelines_and_pp_1_is_tensor_by_data_parallel() -> None:
    mod = load_bench("detector_scale")
    assert mod.layout_for(98304) == Layout(tp=8, pp=8, dp=1536)
    assert mod.layout_for(256) == Layout(tp=8, pp=2, dp=16)
    # where a node is one tensor-parallel group and each of its ranks sits alone of its node in a
    # data-parallel group: the node test that such layouts have runs there, a pipeline's is skipped
    assert mod.layout_for(98304, 1) == Layout(tp=8, pp=1, dp=12288)


def test_a_small_healthy_job_is_measured_with_no_suspect(capsys: pytest.CaptureFixture[str]) -> None:
    mod = load_bench("detector_scale")
    assert mod.main(["--ranks", "64", "--pp", "1", "--seconds", "2", "--warmup", "3"]) == 0
    out = capsys.readouterr().out
    assert "layout: tp=8 per node, 1 pipeline stage(s)" in out
    row = out.strip().splitlines()[-1].split()
    assert row[0] == "64" and row[-1] == "(0)"


def test_no_stages_is_refused() -> None:
    mod = load_bench("detector_scale")
    with pytest.raises(SystemExit):
        mod.main(["--pp", "0"])
