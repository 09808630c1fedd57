"""The first casualty of a crash wave, from endings alone (``detector.liveness``)."""

from __future__ import annotations

import numpy as np

from rankwatch.detector import DetectorConfig
from rankwatch.detector.liveness import Liveness, peer_failure
from rankwatch.sim.blocks import STATE_CODES

ROWS = np.dtype([("rank", "u4"), ("flush_s", "f4"), ("state", "u1"), ("mono_ns", "i8"), ("restart", "i4")])
GLOO_VICTIM = (
    "RuntimeError: [../gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:17288. "
    "This is typically caused by a remote worker crashing."
)


def _end(live: Liveness, rank: int, at: float, state: str, reason: str | None = None) -> None:
    rows = np.zeros(1, ROWS)
    rows["rank"], rows["flush_s"], rows["state"], rows["mono_ns"] = rank, 0.5, STATE_CODES[state], int(at * 1e9)
    live.update(rows, at, {rank: {"end_reason": reason}} if reason else {})


def _wave(events: list[tuple[int, float, str, str | None]], now: float) -> list[tuple[int, str]]:
    live = Liveness(DetectorConfig())
    live.ensure(4)
    for r in range(4):
        _end(live, r, 0.0, "running")
    for rank, at, state, reason in events:
        _end(live, rank, at, state, reason)
    for r in range(4):  # everyone else keeps sending
        if r not in {e[0] for e in events}:
            _end(live, r, now, "running")
    suspects, _ = live.first_casualties(now)
    return [(c.rank, c.how) for c in suspects]


def test_peer_failures_are_recognised() -> None:
    assert peer_failure(GLOO_VICTIM)
    assert peer_failure("DistBackendError: NCCL error: remote process exited or there was a network error")
    assert not peer_failure("RuntimeError: CUDA error: an illegal memory access was encountered")
    assert not peer_failure(None)


def test_gloo_victims_crashing_right_after_the_culprit_are_not_suspects() -> None:
    # what a real 4-rank gloo job did: rank 2 raised, ranks 1 and 3 raised "connection closed" 0.7 s later
    events = [
        (2, 10.0, "crashed", "RuntimeError: rankwatch injected crash before op 80"),
        (1, 10.69, "crashed", GLOO_VICTIM),
        (3, 10.70, "crashed", GLOO_VICTIM),
        (0, 11.6, "crashed", GLOO_VICTIM),
    ]
    assert _wave(events, 12.0) == [(2, "crashed")]


def test_when_only_victims_spoke_the_cause_gets_time_to_go_silent() -> None:
    events = [(1, 10.0, "crashed", GLOO_VICTIM), (3, 10.2, "crashed", GLOO_VICTIM)]
    # rank 0 and 2 keep sending: nobody is silent, so the first victim is named, but not at once
    assert _wave(events, 11.0) == []
    assert _wave(events, 10.0 + DetectorConfig().dead_after_s + 1) == [(1, "peer")]
