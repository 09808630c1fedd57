"""``rankwatch demo``'s closing report: what it prints of a suspect (the real demo: tests/test_demo.py)."""

from __future__ import annotations

from typing import Any

import pytest

from rankwatch.cli import _demo_report

JOB = {"id": "demo", "world": 8, "nodes": 1, "ops": 1000, "state": "running", "ranks": [], "groups": []}


def _suspect(evidence: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": 1,
        "status": "active",
        "kind": "noncomm_hang",
        "level": "rank",
        "ranks": [3],
        "nodes": ["gpu017"],
        "score": 0.9,
        "slowdown": None,
        "evidence": evidence,
    }


def test_a_suspects_next_step_is_printed_whole(capsys: pytest.CaptureFixture[str]) -> None:
    # the evidence line is cut at 800 characters; what to check next must not be cut with it
    step = "every other rank of gpu017 waits on rank 3 inside group 2 (tp): check gpu017 (nvidia-smi, dmesg)"
    _demo_report(JOB, [_suspect({"stack": "x" * 2000, "next_step": step})], as_json=False)
    out = capsys.readouterr().out
    assert f"  next step: {step}\n" in out
    assert out.index("next step:") < out.index("evidence:")


def test_no_next_step_line_without_one(capsys: pytest.CaptureFixture[str]) -> None:
    _demo_report(JOB, [_suspect({"stack": "train.py:42"})], as_json=False)
    out = capsys.readouterr().out
    assert "next step" not in out and '  evidence: {"stack": "train.py:42"}' in out
