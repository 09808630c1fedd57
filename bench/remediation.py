"""Time to recover, per remediation path: from the suspect appearing to the job stepping again.

Runs the three end-to-end remediation scenarios — real processes, a real Slurm, a real torchft
lighthouse — through pytest (they live in ``tests/e2e/test_remediation_*.py``), collects the
figures each one measures, and prints them:

    restart (torchrun elastic)  a slow node's agent is stopped, torchrun re-rendezvous without it,
                                the script resumes from its last DCP checkpoint
    restart (torchrun, on_restart save)
                                an admin's restart: every rank saves at the same op (on_restart)
                                and exits with a code, torchrun --max-restarts brings it back; the
                                time is from the request (no suspect), and steps lost are shown
                                with the save and without it (back to the periodic checkpoint)
    restart (slurm requeue)     the slow node is drained, the job requeued excluding it, resumed
    swap (torchft live)         the slow replica group is killed through the lighthouse; survivors
                                keep training, the replacement heals from a peer

"stepping again" is the first step the restarted job finishes (restart), or the first step the
replacement commits with its peers (swap; the survivors never stop, their longest pause is shown).
"steps lost" is work done before the fault and done again after it: the steps between the last
checkpoint and the restart (0 for a swap: nothing is recomputed).

    python bench/remediation.py [--repeat 1] [--only torchrun,restart,slurm,torchft]

Needs the dev venv (``scripts/setup.sh dev``) and root for Slurm. Targets on a 2-core machine:
restart <= 60 s, swap <= 20 s with the survivors never stopping.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = {
    "torchrun": "tests/e2e/test_remediation_torchrun.py",
    "restart": "tests/e2e/test_remediation_restart.py",
    "slurm": "tests/e2e/test_remediation_slurm.py",
    "torchft": "tests/e2e/test_remediation_torchft.py",
}
TARGET_S = {
    "restart (torchrun elastic)": 60,
    "restart (torchrun, on_restart save)": 60,
    "restart (slurm requeue)": 60,
    "swap (torchft live)": 20,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=1, help="runs of each scenario")
    ap.add_argument("--only", default=",".join(TESTS), help="comma-separated: " + ", ".join(TESTS))
    args = ap.parse_args()
    pytest = Path(sys.executable).parent / "pytest"
    with tempfile.TemporaryDirectory() as tmp:
        figures = Path(tmp) / "figures.jsonl"
        env = {**os.environ, "RANKWATCH_BENCH_FIGURES": str(figures)}
        for name in args.only.split(","):
            for _ in range(args.repeat):
                p = subprocess.run([str(pytest), "-q", "-p", "no:cacheprovider", TESTS[name]], cwd=ROOT, env=env)
                if p.returncode != 0:
                    print(f"remediation bench: the {name} scenario failed (exit {p.returncode})", file=sys.stderr)
        rows = [json.loads(line) for line in figures.read_text().splitlines()] if figures.exists() else []
    print()
    print("rankwatch remediation: time from the suspect to the job stepping again, and steps of work lost")
    print(f"{'path':36} {'suspect->stepping':>18} {'target':>7} {'steps lost':>11}  notes")
    for r in rows:
        path = r.pop("path")
        took, lost = r.pop("suspect_to_stepping_s"), r.pop("steps_lost")
        target = TARGET_S.get(path)
        flag = "" if target is None or took <= target else "  OVER TARGET"
        notes = ", ".join(f"{k}={v}" for k, v in r.items())
        print(f"{path:36} {took:>16.1f} s {target or '-':>5} s {lost:>11}  {notes}{flag}")


if __name__ == "__main__":
    main()
