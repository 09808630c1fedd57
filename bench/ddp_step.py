"""Step time of a small DDP job with RANKWATCH set vs unset, beside PyTorch's Flight Recorder.

Three configurations, run as separate real torchrun jobs (2 ranks, gloo), interleaved over
repetitions so that drift on a noisy machine hits them all alike:

    unset   RANKWATCH unset, Flight Recorder at torch's default (2000 entries)
    set     RANKWATCH pointing at a real `rankwatch serve` on loopback (FR default too)
    fr0     RANKWATCH unset, TORCH_FR_BUFFER_SIZE=0 (FR off): the cost of FR itself, for scale

Prints, per configuration, the median step time over repetitions and the ratio to `unset`
with its spread (min..max of the per-repetition ratios), the wire bytes per recorded op and the
resident memory added per rank.

    python bench/ddp_step.py [--reps 6] [--steps 400]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

HERE = Path(__file__).parent


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--steps", type=int, default=400)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="rw-bench-"))
    port = _free_port()
    rw = Path(sys.executable).parent / "rankwatch"
    base_env = {k: v for k, v in os.environ.items() if not k.startswith(("RANKWATCH", "TORCH_FR", "TORCHELASTIC"))}
    base_env.update(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    service = subprocess.Popen(
        [str(rw), "serve", "--port", str(port), "--data-dir", str(tmp / "data")],
        cwd=tmp,
        env=base_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            httpx.get(url + "/healthz", timeout=1)
            break
        except httpx.HTTPError:
            time.sleep(0.2)
    configs = {
        "unset": {},
        "set": {"RANKWATCH": url},
        "fr0": {"TORCH_FR_BUFFER_SIZE": "0"},
    }
    results: dict[str, list[dict[str, float]]] = {k: [] for k in configs}
    wire: list[tuple[int, int]] = []
    try:
        for rep in range(args.reps):
            names = list(configs)
            names = names[rep % 3 :] + names[: rep % 3]
            for name in names:
                env = dict(base_env, **configs[name])
                job = f"bench-{rep}"
                if name == "set":
                    env["RANKWATCH_JOB"] = job
                out = tmp / f"{name}-{rep}.json"
                cmd = [
                    sys.executable,
                    "-m",
                    "torch.distributed.run",
                    "--standalone",
                    "--nproc-per-node=2",
                    str(HERE / "scripts" / "ddp_job.py"),
                    str(args.steps),
                    str(out),
                ]
                subprocess.run(cmd, cwd=tmp, env=env, check=True, capture_output=True)
                results[name].append(json.loads(out.read_text()))
                if name == "set":
                    time.sleep(1.5)
                    j = httpx.get(f"{url}/jobs/{job}", timeout=10).json()
                    wire.append((j["wire_bytes"], j["ops"]))
    finally:
        service.terminate()
        service.wait()
    base = [r["step_ms"] for r in results["unset"]]
    print(f"small DDP job, 2 ranks over gloo, {args.steps} steps, {args.reps} interleaved repetitions")
    for name in configs:
        ms = [r["step_ms"] for r in results[name]]
        ratios = [m / b for m, b in zip(ms, base, strict=True)]
        rss = statistics.median(r["rss_mb"] for r in results[name])
        print(
            f"  {name:6s} step {statistics.median(ms):7.3f} ms   ratio to unset {statistics.median(ratios):.4f} "
            f"(min {min(ratios):.4f}, max {max(ratios):.4f})   peak RSS {rss:.0f} MB"
        )
    rss_added = statistics.median(r["rss_mb"] for r in results["set"]) - statistics.median(
        r["rss_mb"] for r in results["unset"]
    )
    total_bytes = sum(b for b, _ in wire)
    total_ops = sum(o for _, o in wire)
    per_op = total_bytes / max(total_ops, 1)
    print(f"  wire: {per_op:.1f} bytes per recorded op ({total_ops:,} ops, headers and heartbeats included)")
    print(f"  memory added per rank (peak RSS, set - unset): {rss_added:+.0f} MB")


if __name__ == "__main__":
    main()
