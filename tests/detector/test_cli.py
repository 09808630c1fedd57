"""``rankwatch simulate`` and ``rankwatch evaluate`` as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from rankwatch.sim.record import read_recording

RW = [sys.executable, "-m", "rankwatch"]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*RW, *args], capture_output=True, text=True, timeout=300, cwd="/")


def test_simulate_names_an_injected_straggler() -> None:
    p = _run("simulate", "--duration", "40", "--fault", "kind=slow_compute,where=rank,ranks=5,factor=1.3,onset=15")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "injected noncomm_slow at rank (5,): found after" in p.stdout
    assert "reported [right] noncomm_slow rank ranks=[5]" in p.stdout
    assert "FALSE" not in p.stdout


def test_simulate_healthy_as_json_reports_nothing() -> None:
    p = _run("simulate", "--duration", "30", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["reported"] == []


def test_simulate_records(tmp_path: Path) -> None:
    out = tmp_path / "job.rwrec"
    p = _run("simulate", "--duration", "5", "--out", str(out))
    assert p.returncode == 0 and "wrote" in p.stdout, p.stderr
    frames = list(read_recording(out))
    assert len(frames) >= 16 and all(t >= 0 for t, _ in frames)


def test_simulate_explains_a_bad_fault() -> None:
    p = _run("simulate", "--fault", "kind=slow_compute,where=rank")
    assert p.returncode != 0 and "names its rank" in p.stderr
    p = _run("simulate", "--fault", "kind=slow_compute,where=rank,ranks=1,colour=red")
    assert p.returncode != 0 and "unknown key 'colour'" in p.stderr


def test_evaluate_smoke_prints_its_table() -> None:
    p = _run("evaluate", "--split", "smoke", "--only", "healthy")
    assert p.returncode == 0, p.stderr
    assert "precision" in p.stdout.lower()
