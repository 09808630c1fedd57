"""The NCCL path: ops timed from CUDA events by a poller thread, never by synchronising.

The end-to-end test needs a CUDA GPU and NCCL and is skipped without one (this project's CI has
none). The poller's stamping logic is tested here on any machine with stand-in works.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch
from support import SCRIPTS, Service, clean_env

from rankwatch.hooks.cuda import CudaPoller


class _Work:
    """A stand-in work the test completes by hand (no timing: a loaded machine cannot flake it)."""

    def __init__(self, done: bool, duration_ms: float | None) -> None:
        self.done = done
        self.ms = duration_ms

    def is_completed(self) -> bool:
        return self.done

    def _get_duration(self) -> float:
        if self.ms is None:
            raise RuntimeError("This Backend doesn't support getDuration.")
        return self.ms


class _State:
    def __init__(self) -> None:
        self.inflight: dict[int, list[Any]] = {}
        self.records: list[tuple[Any, ...]] = []
        self.append = self.records.append


def test_poller_stamps_completed_works_with_their_gpu_duration() -> None:
    st = _State()
    poller = CudaPoller(recorder=None)  # type: ignore[arg-type]
    now = time.perf_counter_ns() - 10_000_000  # entered 10 ms ago: a 2.5 ms GPU time fits after it
    works = [_Work(True, 2.5), _Work(False, None), _Work(False, 1.0)]
    for op, work in enumerate(works, start=1):
        st.inflight[op] = [now, None, 1, 1, -1, op, 64, op, 0]
        poller.add(st, op, work)
    assert poller.poll_once() == 2  # the first is done, two pending
    works[1].done = True
    assert poller.poll_once() == 1  # the third is still running on the "GPU"
    assert set(st.inflight) == {3}
    first, second = st.records
    t_enter, t_end, *_rest, t_start = first
    assert t_end - t_start == pytest.approx(2.5e6, abs=1)  # GPU duration from the events
    assert t_start >= t_enter
    assert len(second) == 8  # no duration: start = enter


@pytest.mark.cuda
@pytest.mark.torchrun
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU and NCCL")
def test_nccl_job_is_timed_from_cuda_events(service: Service, run_torchrun: Any, tmp_path: Path) -> None:
    nproc = min(torch.cuda.device_count(), 2)
    env = clean_env(RANKWATCH=service.url, RANKWATCH_JOB="nccl", RANKWATCH_FLUSH_S="0.25")
    env.pop("GLOO_SOCKET_IFNAME", None)
    run = run_torchrun(SCRIPTS / "nccl_job.py", "20", "out", nproc=nproc, env=env)
    assert run.returncode == 0, run.output[-3000:]
    job = service.wait_job(
        "nccl", lambda j: len(j["ranks"]) == nproc and all(r["state"] == "goodbye" for r in j["ranks"])
    )
    ops = service.ops("nccl", rank=0)
    big = [o for o in ops if o["kind"] == "all_reduce" and o["bytes"] == 4 << 20]
    assert len(big) == 20
    assert all(o["t_start_ns"] > o["t_enter_ns"] for o in big)  # GPU start from the events, after the enqueue
    assert all(o["t_end_ns"] > o["t_start_ns"] for o in big)
    assert job["groups"][0]["backend"] == "nccl"
