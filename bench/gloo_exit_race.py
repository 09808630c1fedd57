"""How often a 2-rank gloo job aborts at exit, with and without waiting for gloo to let go.

torch 2.13's gloo worker thread drops a finished op's tensors a moment after the op completes,
and that takes the GIL; a process whose main thread is already finalizing the interpreter then
dies with "terminate called without an active exception" (SIGABRT) though its script finished
(docs/decisions.md, *Gloo jobs can abort at exit*). This runs the same short job under a real
torchrun, alternating ``nowait`` (exit at once) and ``wait`` (``let_go`` first, as the test
scripts do), and prints how many runs of each aborted. ``--load`` runs that many busy loops
beside it: the race is likelier when the cores are shared, as in CI.

python bench/gloo_exit_race.py --runs 40 --load 1
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from multiprocessing.synchronize import Event

SCRIPT = Path(__file__).resolve().parent / "scripts" / "exit_race.py"


def _spin(stop: Event) -> None:
    while not stop.is_set():
        sum(range(10_000))


def run_once(mode: str, steps: int) -> tuple[bool, float]:
    """One job; (aborted, seconds)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANKWATCH", "TORCHELASTIC"))}
    env.update(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", PYTHONWARNINGS="ignore")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(SCRIPT)]
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        p = subprocess.run([*cmd, str(steps), mode], cwd=tmp, env=env, capture_output=True, text=True, timeout=240)
    out = p.stdout + p.stderr
    aborted = "terminate called without an active exception" in out or "exitcode: -6" in out
    if p.returncode != 0 and not aborted:
        raise RuntimeError(f"the job failed otherwise (rc {p.returncode}):\n{out[-2000:]}")
    return aborted, time.monotonic() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=40, help="runs of each mode")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--load", type=int, default=0, help="busy processes beside the job")
    args = ap.parse_args(argv)
    stop = multiprocessing.Event()
    spinners = [multiprocessing.Process(target=_spin, args=(stop,), daemon=True) for _ in range(args.load)]
    for sp in spinners:
        sp.start()
    aborted = {"nowait": 0, "wait": 0}
    secs: dict[str, list[float]] = {"nowait": [], "wait": []}
    try:
        for i in range(args.runs):
            for mode in ("nowait", "wait") if i % 2 == 0 else ("wait", "nowait"):
                died, took = run_once(mode, args.steps)
                aborted[mode] += died
                secs[mode].append(took)
            print(f"run {i + 1}/{args.runs}: aborted nowait {aborted['nowait']}, wait {aborted['wait']}", flush=True)
    finally:
        stop.set()
        for sp in spinners:
            sp.join(5)
    for mode in ("nowait", "wait"):
        n = len(secs[mode])
        print(f"{mode:<7} aborted {aborted[mode]} of {n} runs ({aborted[mode] / max(1, n):.1%}); "
              f"median run {sorted(secs[mode])[n // 2]:.1f} s")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
