"""The NCCL path: ops timed from CUDA events by a poller thread, never by synchronising.

The end-to-end test needs a CUDA GPU and NCCL and is skipped without one (this project's CI has
none). The poller's stamping logic is tested here on any machine with stand-in works.
"""

from __future__ import annotations

import json
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
    done = json.loads((run.outdir / "done_rank0.json").read_text())
    seen = [(o["seq"], o["bytes"], o["t_start_ns"] - o["t_enter_ns"]) for o in ops if o["kind"] == "all_reduce"]
    assert len(big) == 20, (done, seen, service.log.read_text()[-2000:])
    assert all(o["t_start_ns"] > o["t_enter_ns"] for o in big)  # GPU start from the events, after the enqueue
    assert all(o["t_end_ns"] > o["t_start_ns"] for o in big)
    assert job["groups"][0]["backend"] == "nccl"
    assert done["value"] == nproc  # the all_reduce summed ones across the ranks
    # NCCL's Flight Recorder, dumped the way a hung rank is asked to: the job's all_reduces are in it
    assert done["fr_error"] is None and done["fr_entries"] > 0, done
    assert any("all_reduce" in name for name in done["fr_names"]), done["fr_names"]


class _Span:
    """A stand-in for the events around a synchronous NCCL call (no GPU on this machine)."""

    def __init__(self, ms: float) -> None:
        self.ms, self.closed, self.done = ms, False, False

    def close(self) -> _Span:
        self.closed = True
        return self

    def is_completed(self) -> bool:
        return self.done

    def _get_duration(self) -> float:
        return self.ms


def test_a_synchronous_cuda_op_without_work_is_timed_from_its_stream_span() -> None:
    """torch >= 2.7 returns no work for ``async_op=False`` on NCCL: the span stands in for it, and
    the op stays in flight until the span's end event has fired (it was stamped at enqueue before)."""
    from types import SimpleNamespace

    from rankwatch.hooks.process_group import GroupState

    st = _State()
    poller = CudaPoller(recorder=None)  # type: ignore[arg-type]
    fake = SimpleNamespace(coalescing=None, poller=poller, inflight=st.inflight, append=st.append)
    fake._to_poller = lambda op, work: GroupState._to_poller(fake, op, work)  # type: ignore[arg-type]
    now = time.perf_counter_ns() - 10_000_000
    entry = st.inflight[1] = [now, None, 1, 1, -1, 1, 64, 1, 0]
    span = _Span(4.0)
    assert GroupState.track(fake, entry, True, None, span) is None  # type: ignore[arg-type]
    assert span.closed and st.inflight and not st.records  # enqueued, not complete
    assert poller.poll_once() == 1
    span.done = True
    assert poller.poll_once() == 0
    (rec,) = st.records
    assert rec[1] - rec[-1] == pytest.approx(4e6, abs=1)  # end - start: the span's GPU time


def test_stamp_completed_stamps_what_the_sleeping_poller_has_not_seen() -> None:
    """A final batch (or a retired group) first stamps completed CUDA ops: the last steps of a real
    NCCL job were lost when ``destroy_process_group`` came before the poller's next look."""
    import contextlib
    from types import SimpleNamespace

    from rankwatch.hooks.recorder import Recorder

    st = _State()
    poller = CudaPoller(recorder=None)  # type: ignore[arg-type]
    st.inflight[1] = [time.perf_counter_ns() - 5_000_000, None, 1, 1, -1, 1, 64, 1, 0]
    poller.add(st, 1, _Work(True, 1.0))
    fake = SimpleNamespace(_poller=poller, torch_section=lambda: contextlib.nullcontext(True))
    Recorder.stamp_completed(fake)  # type: ignore[arg-type]
    assert len(st.records) == 1 and not st.inflight


def test_flight_recorder_dump_merges_the_nccl_and_generic_recorders(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch._C._distributed_c10d as c

    from rankwatch.hooks.shipper import _dump_flight_recorder

    def entry(pg: str, seq: int, name: str) -> dict[str, Any]:
        return {"process_group": [pg, ""], "collective_seq_id": seq, "profiling_name": name, "time_created_ns": seq}

    nccl = {"version": "2.10", "pg_config": {"0": {}}, "entries": [entry("0", 1, "nccl:all_reduce")]}
    generic = {"version": "2.10", "entries": [entry("1", 1, "gloo:broadcast"), entry("0", 1, "nccl:all_reduce")]}
    monkeypatch.setattr(c, "_dump_nccl_trace_json", lambda *a: json.dumps(nccl).encode(), raising=False)
    monkeypatch.setattr(c, "_dump_fr_trace_json", lambda *a: json.dumps(generic).encode(), raising=False)
    merged = json.loads(_dump_flight_recorder() or "{}")
    assert [e["profiling_name"] for e in merged["entries"]] == ["nccl:all_reduce", "gloo:broadcast"]
    assert merged["pg_config"] == {"0": {}}
