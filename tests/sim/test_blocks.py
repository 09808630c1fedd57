"""Block summaries: what they add up, and that parts merge."""

from __future__ import annotations

import numpy as np

from rankwatch.sim import Layout, Scenario, Workload, deliveries, from_batch, summarise
from rankwatch.sim.stream import stream_blocks
from rankwatch.wire import Records


def test_summarise_sums_counts_and_extremes() -> None:
    rows = [
        # group, kind, dtype, peer, seq, nbytes, t_enter, t_start, t_end
        (0, 1, 4, -1, 1, 100, 10, 10, 15),
        (0, 1, 4, -1, 2, 100, 20, 20, 40),
        (0, 1, 4, -1, 3, 100, 50, 50, 52),
        (0, 1, 4, -1, 4, 100, 60, 61, 70),
    ]
    b = summarise(Records.from_rows(rows), rank=7, block_seqs=np.array([2]))
    assert b["block"].tolist() == [0, 1]
    assert b["count"].tolist() == [2, 2]
    assert b["sum_ns"].tolist() == [5 + 20, 2 + 9]
    assert b["min_ns"].tolist() == [5, 2] and b["max_ns"].tolist() == [20, 9]
    assert b["first_enter_ns"].tolist() == [10, 50] and b["last_enter_ns"].tolist() == [20, 60]
    assert b["seq_hi"].tolist() == [2, 4] and (b["rank"] == 7).all()
    # two halves summarised apart add up to the whole
    a1 = summarise(Records.from_rows(rows[:1]), 7, np.array([2]))
    a2 = summarise(Records.from_rows(rows[1:2]), 7, np.array([2]))
    assert a1["sum_ns"][0] + a2["sum_ns"][0] == b["sum_ns"][0]


def test_from_batch_carries_progress_and_p2p() -> None:
    lay = Layout(tp=2, pp=2, dp=2)
    sc = Scenario("b", layout=lay, workload=Workload.for_rate(100, lay), duration=4.0)
    d = next(x for x in deliveries(sc) if len(x.batch.records))
    bb = from_batch(d.batch.header, d.batch.records)
    assert bb.ranks["rank"][0] == d.batch.header["rank"]
    assert bb.progress.shape[0] == len(d.batch.header["groups"])
    assert int(bb.blocks["count"].sum()) == len(d.batch.records)


def test_stream_blocks_cover_every_rank() -> None:
    lay = Layout(tp=8, pp=2, dp=4)
    sc = Scenario("s", layout=lay, workload=Workload.for_rate(100, lay), duration=5.0)
    seen: set[int] = set()
    for d in stream_blocks(sc, agent_ranks=16):
        seen.update(d.batch.ranks["rank"].tolist())
        g = d.batch.blocks["group"]
        assert g.shape[0] == 0 or int(g.max()) < len(d.batch.groups)
    assert seen == set(range(lay.world))
