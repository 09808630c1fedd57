"""A group's op rate as the detection reads it, across the pauses of a job that saves."""

from __future__ import annotations

import numpy as np
import pytest

from rankwatch.detector import DetectorConfig
from rankwatch.detector.cells import CellStats
from rankwatch.detector.lateness import LatenessTracker

_LAG = 1.0  # a block is analysed about a second after its ops ran


def _cells(times: list[float], ops: float) -> CellStats:
    """One block of ``ops`` ops per time, of one channel's two members (slots 0 and 1)."""
    n = len(times)
    t = np.repeat(np.asarray(times, float), 2)
    cnt = np.full(2 * n, ops)
    z = np.zeros(2 * n)
    zc = np.zeros(n)
    return CellStats(
        slot=np.tile([0, 1], n),
        cell=np.repeat(np.arange(n), 2),
        cnt=cnt,
        mean=z,
        late=z,
        wait=z,
        dur=z + 0.001 * ops,
        lateflag=np.zeros(2 * n, bool),
        t=t,
        t0=t - 0.19,
        c_ch=np.zeros(n, np.int64),
        c_cls=np.zeros(n, np.int64),
        c_cnt=np.full(n, ops),
        c_transfer=zc,
        c_max=zc,
        c_t=np.asarray(times, float),
        c_n=np.full(n, 2),
    )


def _run(block_times: np.ndarray, ops: float, reads: list[float]) -> tuple[dict[float, float], dict[float, float]]:
    """Feeds the blocks at a 0.5 s cadence, each ``_LAG`` after it ran; at each of ``reads`` the
    rate the detection reads and the plain decayed count's."""
    cfg = DetectorConfig()
    tr = LatenessTracker(cfg)
    got, plain = {}, {}
    sent = 0
    for now in np.arange(0.5, max(reads) + 0.01, 0.5):
        due = block_times[block_times <= now - _LAG + 1e-9]
        new = due[sent:]
        sent = due.shape[0]
        st = _cells(list(new), ops)
        tr.update(float(now), st, np.zeros(len(st.slot), np.int64), 2, 1, np.zeros(len(st.slot), np.int64), None)
        t = round(float(now), 1)
        if t in reads:
            got[t] = float(tr.run_rate_now(1)[0])
            plain[t] = float(tr.ch_ops[0] / cfg.ops_tau_s)
    return got, plain


@pytest.mark.parametrize(
    "every, ops",
    [
        (0.2, 10.0),  # a steady 50 ops a second, in blocks of 0.2 s
        (0.6, 30.0),  # a burst of 30 ops every 0.6 s step (a pipeline's data-parallel group)
    ],
)
def test_a_run_after_a_save_is_read_at_the_rate_it_runs(every: float, ops: float) -> None:
    # 20 s of steps, then saves of 5 s between runs of 1.2 s: at the end of the fourth run the
    # count the detection used to read held 0.6-0.7 of what the run runs at (decayed over
    # ``stale_s`` after each run and building up from there in the next); a 1.1x straggler of a
    # job that saved so (unseen-straggler_mild-003, dp32 ``checkpoint~``) read a third of its
    # excess and was never named. Read now: what the long run read
    blocks = [20.0 - every * np.arange(int(19.0 / every))[::-1]]
    for end in (27.0, 34.0, 41.0, 48.0):
        blocks.append(end - every * np.arange(round(1.2 / every) + 1)[::-1])
    got, plain = _run(np.concatenate(blocks), ops, [21.0, 49.0])  # each read 1 s after its last block
    steady, late = got[21.0], got[49.0]
    assert steady == pytest.approx(plain[21.0])  # a group running all along: the count as it was
    assert plain[49.0] < 0.75 * steady  # what the count alone reads
    assert late == pytest.approx(steady, rel=0.1)


@pytest.mark.parametrize(
    "ran",
    [
        # a group that had run under ``baseline_warm_s`` before its pause (a slow first step): its
        # ranks still settle in the run after it, and read at that run's rate the settling named
        # healthy ranks of tp4pp4dp2 `first_step~` (unseen-slow_link-002's rank 11, 13 s in)
        3.0,
        # one whose run before the pause was long (a save every 50 steps of half a second): its
        # count had settled, and the first seconds after a save, the ranks back from it at different
        # times, read at the run's rate named healthy ranks and nodes (`bench/probe_classes.py`,
        # seeds 61206-61208: 4 -> 11 false suspects)
        13.0,
    ],
)
def test_a_run_is_read_as_the_count_reads_it_after_start_up_or_after_a_long_run(ran: float) -> None:
    # ``ran`` seconds of steps, a 6 s save, 2 s of steps, read 1 s after them
    blocks = np.concatenate([np.arange(0.2, ran + 1e-9, 0.2), np.arange(ran + 6.0, ran + 8.0 + 1e-9, 0.2)])
    got, plain = _run(blocks, 10.0, [ran + 9.0])
    assert got[ran + 9.0] == pytest.approx(plain[ran + 9.0])
