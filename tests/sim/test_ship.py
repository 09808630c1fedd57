"""Simulated batches are the hooks' batches: wire-encodable, consistent, deterministic."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from rankwatch.sim import Fault, Layout, Scenario, Workload, deliveries
from rankwatch.sim.scenario import PROFILES
from rankwatch.wire import OpKind, decode_batch, encode_batch

LAY = Layout(tp=2, pp=2, dp=2)


def _sc(**kw: object) -> Scenario:
    base = {"name": "t", "layout": LAY, "workload": Workload.for_rate(100, LAY), "duration": 8.0, "seed": 3}
    base.update(kw)
    return Scenario(**base)  # type: ignore[arg-type]


def test_batches_round_trip_through_the_wire() -> None:
    n = 0
    for d in deliveries(_sc()):
        body = encode_batch(d.batch.header, d.batch.records)
        back = decode_batch(body)  # validates the header and the records against it
        assert back.header == d.batch.header
        for col in ("group", "kind", "peer", "seq", "nbytes", "t_enter", "t_start", "t_end"):
            np.testing.assert_array_equal(getattr(back.records, col), getattr(d.batch.records, col))
        n += 1
    assert n >= 8 * 7  # every rank, about once per second


def test_deterministic_from_seed() -> None:
    a = [encode_batch(d.batch.header, d.batch.records) for d in deliveries(_sc())]
    b = [encode_batch(d.batch.header, d.batch.records) for d in deliveries(_sc())]
    c = [encode_batch(d.batch.header, d.batch.records) for d in deliveries(_sc(seed=4))]
    assert a == b
    assert a != c


def test_p2p_sends_match_receives_and_progress_matches_records() -> None:
    sends: dict[tuple[int, int], list[int]] = {}
    recvs: dict[tuple[int, int], list[int]] = {}
    last_seq: dict[tuple[int, str], int] = {}
    for d in deliveries(_sc()):
        h, r = d.batch.header, d.batch.records
        for g, k, peer, seq in zip(r.group.tolist(), r.kind.tolist(), r.peer.tolist(), r.seq.tolist(), strict=True):
            gid = h["groups"][g]["id"]
            if k == int(OpKind.SEND):
                sends.setdefault((h["rank"], peer), []).append(seq)
            elif k == int(OpKind.RECV):
                recvs.setdefault((h["rank"], peer), []).append(seq)
            else:
                last_seq[(h["rank"], gid)] = max(last_seq.get((h["rank"], gid), 0), seq)
        for e in h["groups"]:
            assert e["completed"] <= e["entered"]
            if (h["rank"], e["id"]) in last_seq:
                assert e["entered"] >= last_seq[(h["rank"], e["id"])]
    # stage 0 sends to stage 1 (peer 1) as often as stage 1 receives from stage 0 (peer 0)
    n_send = sum(len(v) for (rk, peer), v in sends.items() if peer == 1)
    n_recv = sum(len(v) for (rk, peer), v in recvs.items() if peer == 0)
    assert n_send and abs(n_send - n_recv) <= 0.1 * n_send  # ranks' last batches leave at different times
    for v in [*sends.values(), *recvs.values()]:
        assert v == list(range(1, len(v) + 1))  # the k-th send meets the k-th receive


def test_stopped_rank_goes_silent_and_crash_cascade_says_so() -> None:
    sc = _sc(duration=12.0, faults=(Fault("stop", "rank", ranks=(3,), onset=5.0),))
    last = max(d.received_at for d in deliveries(sc) if d.batch.header["rank"] == 3)
    assert last < 5.1
    sc = _sc(duration=12.0, faults=(Fault("crash", "rank", ranks=(3,), onset=5.0, kill_after=2.0),))
    finals = {d.batch.header["rank"]: d.batch.header for d in deliveries(sc) if d.batch.header["state"] != "running"}
    assert finals[3]["state"] == "crashed" and "end_reason" in finals[3]
    assert all(h["state"] == "terminating" for r, h in finals.items() if r != 3)
    assert len(finals) == LAY.world


def test_a_rank_s_batches_arrive_in_the_order_it_sent_them() -> None:
    # a slow network (0.3 s median to the collector) and a launcher that kills every rank 0.5 s
    # after a crash: many ranks send their last batch (``terminating``) well within the latency of
    # the regular batch before it. The hooks send one batch at a time, so it must still come last
    prof = dataclasses.replace(PROFILES["quiet"], net_latency_s=0.3)
    faults = (Fault("crash", "rank", ranks=(3,), onset=5.0, kill_after=0.5),)
    for seed in range(4):
        sc = _sc(duration=9.0, profile=prof, faults=faults, seed=seed)
        seen: dict[int, list[int]] = {}
        last: dict[int, str] = {}
        for d in deliveries(sc):
            h = d.batch.header
            seen.setdefault(h["rank"], []).append(h["batch"])
            last[h["rank"]] = h["state"]
        for rank, nums in seen.items():
            assert nums == sorted(nums), f"seed {seed}, rank {rank}: batches arrived as {nums}"
        assert last[3] == "crashed" and all(st == "terminating" for r, st in last.items() if r != 3)


def test_hung_rank_keeps_beating_and_says_where() -> None:
    sc = _sc(duration=12.0, faults=(Fault("hang_compute", "rank", ranks=(2,), onset=5.0),))
    late = [d.batch.header for d in deliveries(sc) if d.received_at > 9.0]
    mine = [h for h in late if h["rank"] == 2]
    assert mine and all("next(loader_iter)" in h.get("stack", "") for h in mine)
    waiting = [h for h in late if h["rank"] != 2 and any(e.get("inflight_since_ns") for e in h["groups"])]
    assert waiting  # its group mates are inside a collective, waiting


@pytest.mark.parametrize("where", ["link", "nic", "rnic"])
def test_slow_comm_raises_the_shortest_time_inside(where: str) -> None:
    lay = Layout(tp=8, pp=2, dp=2)
    kw = {"ranks": (3,)} if where == "rnic" else {"nodes": (0, 2) if where == "link" else (0,)}
    sc = Scenario(
        "c",
        layout=lay,
        workload=Workload.for_rate(100, lay),
        duration=16.0,
        faults=(Fault("slow_comm", where, factor=4.0, onset=8.0, **kw),),
    )  # type: ignore[arg-type]
    before, after = [], []
    for d in deliveries(sc):
        if d.batch.header["rank"] != 3:
            continue
        r = d.batch.records
        p2p = r.kind == int(OpKind.SEND)
        dur = (r.t_end - r.t_start)[p2p]
        (after if d.received_at > 10 else before).extend(dur.tolist())
    assert np.median(after) > 2.0 * np.median(before)
