"""``rankwatch demo``, the README's first command: a real service, a real torchrun job, one slow rank."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from support import clean_env


def test_demo_names_the_slow_rank(tmp_path: Path) -> None:
    p = subprocess.run(
        [sys.executable, "-m", "rankwatch", "demo", "--json", "--data-dir", str(tmp_path / "data")],
        capture_output=True,
        text=True,
        timeout=300,
        env=clean_env(),
        cwd=tmp_path,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "  >>> SUSPECT noncomm_slow at rank 2 on " in p.stdout, p.stdout[-3000:]
    lines = p.stdout.splitlines()
    start = lines.index("{")
    end = lines.index("}", start)
    report = json.loads("\n".join(lines[start : end + 1]))
    assert len(report["job"]["ranks"]) == 4 and {r["state"] for r in report["job"]["ranks"]} == {"goodbye"}
    blamed = [(s["kind"], s["level"], s["ranks"]) for s in report["suspects"]]
    assert blamed == [("noncomm_slow", "rank", [2])], blamed
    assert report["suspects"][0]["evidence"]["groups"][0]["rank"] == 2
