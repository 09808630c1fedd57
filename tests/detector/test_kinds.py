"""Each fault kind, at each level, named right; nothing else named."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from rankwatch.detector import DetectorConfig
from rankwatch.detector.evaluate import EVAL_EVERY_S, ScenarioResult, run_scenario
from rankwatch.detector.job import JobDetector
from rankwatch.sim import PROFILES, Fault, Layout, Profile, Scenario, Workload
from rankwatch.sim.ship import deliveries
from rankwatch.sim.suite import HELDOUT_PROFILES, UNSEEN_PROFILES, build_suite

TP4DP4 = Layout(tp=4, pp=1, dp=4)  # 16 ranks on 2 nodes: every data-parallel group is half on each
TP8PP2DP2 = Layout(tp=8, pp=2, dp=2)  # 32 ranks on 4 nodes: pipeline links between node pairs
TP2PP4DP4 = Layout(tp=2, pp=4, dp=4)  # 32 ranks on 4 nodes: a node is a stage of a 4-stage pipeline


def _only(res, key: str) -> None:  # type: ignore[no-untyped-def]
    got = {r.key for r in res.reported}
    assert got == {key}, got
    assert all(lat is not None for lat in res.latency)


def test_straggler_rank(run) -> None:  # type: ignore[no-untyped-def]
    res = run(TP4DP4, Fault("slow_compute", "rank", ranks=(6,), factor=1.5, onset=20.0))
    _only(res, "noncomm_slow:rank:6")
    assert res.latency[0] < 6.0
    f = res.findings_sample[0]
    assert f["slowdown"] > 1.05 and 0 < f["score"] <= 1
    assert f["evidence"]["groups"] and f["evidence"]["groups"][0]["late_s_per_s"] > 0


def test_slow_node_when_half_of_every_group_is_slow(run) -> None:  # type: ignore[no-untyped-def]
    # node 1 holds half of each data-parallel group: a median-based lateness would halve it
    res = run(TP4DP4, Fault("slow_compute", "node", nodes=(1,), factor=1.3, onset=20.0))
    _only(res, "noncomm_slow:node:node00001")


def test_one_slow_gpu_on_a_node_is_the_gpu(run) -> None:  # type: ignore[no-untyped-def]
    res = run(TP8PP2DP2, Fault("slow_compute", "rank", ranks=(21,), factor=1.5, onset=20.0))
    _only(res, "noncomm_slow:rank:21")


def test_straggler_in_a_deep_pipeline(run) -> None:  # type: ignore[no-untyped-def]
    # every stage waits in its receives for the schedule's bubbles: that waiting is usual, not a
    # sign that the straggler (stage 1 of replica 1) waited on somebody else
    res = run(TP2PP4DP4, Fault("slow_compute", "rank", ranks=(11,), factor=1.5, onset=20.0), rate=30.0)
    _only(res, "noncomm_slow:rank:11")


@pytest.mark.parametrize(
    ("node", "factor", "profile", "rate", "every"),
    [
        (0, 1.5, "cpu_noise", 100.0, EVAL_EVERY_S),
        (2, 1.3, "quiet", 30.0, EVAL_EVERY_S),  # a strict xfail until its groups' pauses were kept (2026-12-01)
        (2, 1.3, "quiet", 30.0, 1.0),
    ],
)
def test_slow_node_that_is_a_pipeline_stage(  # type: ignore[no-untyped-def]
    run, node: int, factor: float, profile: str, rate: float, every: float
) -> None:
    # the node's ranks are slow together: no group they share has a late member, only the stages
    # next to it wait at their sends and receives, and the node's own share of time inside ops drops
    res = run(
        TP2PP4DP4,
        Fault("slow_compute", "node", nodes=(node,), factor=factor, onset=20.0),
        rate=rate,
        profile=profile,
        eval_every=every,
    )
    _only(res, f"noncomm_slow:node:node0000{node}")
    assert res.latency[0] < 20.0


def test_slow_link(run) -> None:  # type: ignore[no-untyped-def]
    res = run(TP8PP2DP2, Fault("slow_comm", "link", nodes=(1, 3), factor=4.0, onset=20.0))
    _only(res, "comm_slow:link:node00001|node00003")
    ev = res.findings_sample[0]["evidence"]
    assert ev["p2p_cells"] and ev["slow_groups"][0]["ratio"] > 1.1


def test_slow_nic_is_the_node(run) -> None:  # type: ignore[no-untyped-def]
    res = run(TP8PP2DP2, Fault("slow_comm", "nic", nodes=(2,), factor=3.0, onset=20.0))
    _only(res, "comm_slow:node:node00002")


def test_slow_nic_on_one_data_parallel_ring_names_the_ring_and_says_how_to_bisect(run) -> None:  # type: ignore[no-untyped-def]
    # every NIC and link on the one ring slows the same transfers: nothing in the timings splits them
    res = run(Layout(tp=1, pp=1, dp=32), Fault("slow_comm", "nic", nodes=(2,), factor=3.0, onset=20.0), rate=50.0)
    _only(res, "comm_slow:node:node00000+node00001+node00002+node00003")
    ev = res.findings_sample[0]["evidence"]
    assert ev["ambiguous"] is True
    assert "node00002" in ev["next_step"] and "sendrecv_perf" in ev["next_step"]


@pytest.mark.parametrize(("profile", "seed"), [("quiet", 1), ("quiet", 2), ("cpu_noise", 1)])
def test_a_slow_nic_is_named_within_three_seconds(run, profile: str, seed: int) -> None:  # type: ignore[no-untyped-def]
    # a 3x NIC on the one ring of a dp32 job at 50 ops/s costs it 1.3x: within the 3 s.
    # The share of slow blocks, averaged as long as the ratio, crossed one half a second later
    # than needed: 3.5 s on every seed here before it was averaged over half as long (2026-12-03)
    lay = Layout(tp=1, pp=1, dp=32)
    fault = Fault("slow_comm", "nic", nodes=(2,), factor=3.0, onset=20.0)
    res = run(lay, fault, rate=50.0, profile=profile, duration=40.0, seed=seed)
    _only(res, "comm_slow:node:node00000+node00001+node00002+node00003")
    assert res.latency[0] <= 3.0, res.latency


def test_slow_gpu_nic_is_the_rank(run) -> None:  # type: ignore[no-untyped-def]
    res = run(TP8PP2DP2, Fault("slow_comm", "rnic", ranks=(5,), factor=3.0, onset=20.0))
    _only(res, "comm_slow:rank:5")


def test_noncomm_hang_names_the_rank_that_never_entered(run) -> None:  # type: ignore[no-untyped-def]
    res = run(TP4DP4, Fault("hang_compute", "rank", ranks=(9,), onset=20.0), duration=40.0)
    _only(res, "noncomm_hang:rank:9")
    assert res.latency[0] < 15.0
    f = res.findings_sample[0]
    assert f["slowdown"] is None and "next(loader_iter)" in f["evidence"]["stack"]["9"]
    assert 9 in f["flight_recorder_ranks"] and len(f["flight_recorder_ranks"]) >= 4
    # its tensor-parallel group is half its node: the other half waits elsewhere, and a hang of the
    # node would have stopped ranks of both halves outside their ops
    assert "node_alike" not in f["evidence"]


def test_a_rank_hang_a_node_hang_would_look_like_says_so(run) -> None:  # type: ignore[no-untyped-def]
    # tp8dp8: a node is one tensor-parallel group. One rank hung leaves the other seven of its node
    # inside a tensor-parallel op waiting on it; so does a hang of the whole node that caught those
    # seven inside the op and that rank outside it, and nothing in the timings tells the two apart
    tp8dp8 = Layout(tp=8, pp=1, dp=8)
    res = run(tp8dp8, Fault("hang_compute", "rank", ranks=(10,), onset=20.0), rate=30.0, duration=35.0)
    _only(res, "noncomm_hang:rank:10")
    ev = res.findings_sample[0]["evidence"]
    assert ev["node_alike"] is True and "node00001" in ev["next_step"] and "rank 10" in ev["next_step"]
    # node 1 hung (`bench/probe_healthy.py --first-seed 3001 --healthy 0`, seed 3022): named as
    # the node, or as a rank whose evidence says the node looks the same
    res = run(
        tp8dp8,
        Fault("hang_compute", "node", nodes=(1,), onset=21.0),
        rate=30.0,
        profile=HELDOUT_PROFILES["gc+"],
        duration=35.0,
        seed=3022,
    )
    (f,) = [f for f in res.findings_sample if f["kind"] == "noncomm_hang"]
    assert f["level"] == "node" or (f["nodes"] == ["node00001"] and f["evidence"]["node_alike"] is True), f


def test_comm_hang_on_a_link(run) -> None:  # type: ignore[no-untyped-def]
    res = run(TP8PP2DP2, Fault("hang_comm", "link", nodes=(0, 2), onset=20.0), duration=40.0)
    _only(res, "comm_hang:link:node00000|node00002")
    assert res.latency[0] < 15.0
    assert res.findings_sample[0]["flight_recorder_ranks"]


def test_comm_hang_on_nvlink_is_the_node(run) -> None:  # type: ignore[no-untyped-def]
    res = run(TP8PP2DP2, Fault("hang_comm", "nvl", nodes=(3,), onset=20.0), duration=40.0)
    _only(res, "comm_hang:node:node00003")


def test_sigstopped_rank_is_dead(run) -> None:  # type: ignore[no-untyped-def]
    res = run(TP4DP4, Fault("stop", "rank", ranks=(4,), onset=20.0), duration=40.0)
    _only(res, "rank_dead:rank:4")


def test_whole_node_stopped_is_the_node(run) -> None:  # type: ignore[no-untyped-def]
    res = run(TP8PP2DP2, Fault("stop", "node", nodes=(1,), onset=20.0), duration=40.0)
    _only(res, "rank_dead:node:node00001")


def test_crash_cascade_names_the_first_casualty(run) -> None:  # type: ignore[no-untyped-def]
    res = run(TP4DP4, Fault("crash", "rank", ranks=(11,), onset=20.0, kill_after=1.0), duration=40.0)
    _only(res, "rank_dead:rank:11")
    ev = res.findings_sample[0]["evidence"]
    assert ev["how"] == {"11": "crashed"} and "illegal memory access" in ev["end_reason"]["11"]
    assert res.latency[0] < 3.0  # the crash says so itself


def test_silent_crash_before_the_launcher_kills_the_rest(run) -> None:  # type: ignore[no-untyped-def]
    res = run(TP4DP4, Fault("crash", "rank", ranks=(2,), onset=20.0, silent=True, kill_after=2.0), duration=40.0)
    _only(res, "rank_dead:rank:2")


def test_two_faults_at_once(run) -> None:  # type: ignore[no-untyped-def]
    res = run(
        TP8PP2DP2,
        Fault("slow_comm", "link", nodes=(1, 3), factor=4.0, onset=20.0),
        Fault("slow_compute", "rank", ranks=(4,), factor=1.5, onset=22.0),
    )
    assert {r.key for r in res.reported} == {"comm_slow:link:node00001|node00003", "noncomm_slow:rank:4"}


DP16 = Layout(tp=1, pp=1, dp=16)  # 16 ranks on 2 nodes, one data-parallel group


@pytest.mark.parametrize("layout", [TP4DP4, DP16, Layout(tp=8, pp=1, dp=2)], ids=["tp4dp4", "dp16", "tp8dp2"])
@pytest.mark.parametrize("level", ["rank", "node"])
def test_reported_slowdown_is_the_jobs(run, layout, level) -> None:  # type: ignore[no-untyped-def]
    # a 1.3x straggler (a GPU, or a whole node) against what the job really lost: its step rate
    # with and without the fault. Read low by a quarter when op rates were counted up to now
    # rather than up to the newest analysed op (a second behind), and read twice over when a
    # rank's lateness was summed over the groups its delay passes through
    fault = (
        Fault("slow_compute", "rank", ranks=(6,), factor=1.3, onset=20.0)
        if level == "rank"
        else Fault("slow_compute", "node", nodes=(1,), factor=1.3, onset=20.0)
    )
    res = run(layout, fault, duration=40.0)
    assert len(res.reported) == 1 and res.reported[0].match == 0, [r.key for r in res.reported]
    assert res.true_slowdown is not None and res.true_slowdown > 1.15  # 1.19-1.23 (same steps timed)
    got = res.reported[0].slowdown
    assert got is not None and abs(got - res.true_slowdown) <= 0.07, (got, res.true_slowdown)
    # named fast too: 2.5 s (a rank) to 3.5 s (the tp8dp2 node, whose ranks join the roots in turn);
    # the bar for 1.2x and worse is 3 s median
    assert res.latency[0] is not None and res.latency[0] <= 3.5


def test_the_evaluation_compares_each_suspects_slowdown_with_the_jobs(run) -> None:  # type: ignore[no-untyped-def]
    # the suite's table prints, per slow kind, what suspects reported against what the job lost;
    # a suspect that reads its job twice as slow as it runs is listed among the misses
    from rankwatch.detector.evaluate import SuiteReport

    res = run(TP4DP4, Fault("slow_compute", "rank", ranks=(6,), factor=1.3, onset=20.0), duration=40.0)
    assert res.true_slowdown is not None and res.reported[0].match == 0
    rep = SuiteReport("test", [res], 0.0)
    (acc,) = rep.slowdown_accuracy()
    assert acc["kind"] == "noncomm_slow" and acc["n"] == 1
    assert abs(acc["median"] - 1.0) <= 0.07, acc
    assert "slowdown reported / true, noncomm_slow (one steady fault, n=1)" in rep.table()
    assert "slowdown reported / true" not in rep.misses()
    res.reported[0].slowdowns = [2 * x for x in res.reported[0].slowdowns]
    (acc,) = rep.slowdown_accuracy()
    assert acc["median"] > 1.8
    assert f"{res.name} slowdown reported / true {acc['median']:.2f} (noncomm_slow)" in rep.misses()


def test_a_mildly_slow_node_is_named_once_its_ranks_are_late_together(run) -> None:  # type: ignore[no-untyped-def]
    # each rank of a 1.15x node costs the job under 1.2x, so alone each would hold 4 s (a rank
    # late by chance in uneven steps); half of a node's ranks late at once for 1 s is the node
    res = run(TP4DP4, Fault("slow_compute", "node", nodes=(1,), factor=1.15, onset=20.0), duration=40.0)
    _only(res, "noncomm_slow:node:node00001")
    assert res.latency[0] is not None and res.latency[0] <= 4.0, res.latency


@pytest.mark.parametrize("faulty", [True, False], ids=["straggler", "healthy"])
@pytest.mark.parametrize("seed", [1, 2])
def test_a_straggler_in_a_job_that_mostly_checkpoints(faulty, seed) -> None:  # type: ignore[no-untyped-def]
    # 30 steps (about 1.5 s) between 5 s checkpoint saves: the data-parallel group's bursts are
    # shorter than the five buckets its median spans, and each pause used to decay its op rate
    # and reset the evidence, so the straggler was never named (it was on every seed tried)
    lay = DP16
    prof = dataclasses.replace(PROFILES["checkpoint"], ckpt_every=30, ckpt_s=5.0, ckpt_skew_s=2.0)
    faults = (Fault("slow_compute", "rank", ranks=(5,), factor=1.5, onset=20.0),) if faulty else ()
    work = Workload.for_rate(50.0, lay)
    sc = Scenario(name="ckpt", layout=lay, workload=work, profile=prof, faults=faults, duration=45.0, seed=seed)
    res = run_scenario(sc)
    assert {r.key for r in res.reported} == ({"noncomm_slow:rank:5"} if faulty else set())
    if faulty:
        assert res.latency[0] is not None and res.latency[0] < 12.0


@pytest.mark.parametrize("faulty", [True, False], ids=["straggler", "healthy"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_straggler_in_a_job_whose_runs_between_saves_are_too_short_to_judge(faulty, seed) -> None:  # type: ignore[no-untyped-def]
    # the same saves at 100 ops a second: 30 steps are about half a second, two or three buckets
    # with ops between 5 s pauses, never the five a slot's median is taken over, so the group was
    # never judged (seed 2: never named) or only once a slow save left a longer run (17-24 s)
    lay = DP16
    prof = dataclasses.replace(PROFILES["checkpoint"], ckpt_every=30, ckpt_s=5.0, ckpt_skew_s=2.0)
    faults = (Fault("slow_compute", "rank", ranks=(5,), factor=1.5, onset=20.0),) if faulty else ()
    work = Workload.for_rate(100.0, lay)
    sc = Scenario(name="ckpt", layout=lay, workload=work, profile=prof, faults=faults, duration=50.0, seed=seed)
    res = run_scenario(sc)
    assert {r.key for r in res.reported} == ({"noncomm_slow:rank:5"} if faulty else set())
    if faulty:
        assert res.latency[0] is not None and res.latency[0] < 12.0, res.latency


def test_a_straggler_in_a_job_whose_runs_between_saves_are_four_or_five_buckets_is_judged_at_every_run(run) -> None:  # type: ignore[no-untyped-def]
    # dp16 at 100/s with GC pauses and 3 s saves every 50 steps: runs of four and five buckets. One of
    # five judged the group, whose next runs were then left unjudged for ``pause_s`` (only groups
    # never judged within it were bridged): the 1.5x rank, late in every run, was a root 4.6 s
    # after its onset and never named in the 15 s it lasted (``bench/probe_short_runs.py``)
    fault = Fault("slow_compute", "rank", ranks=(3,), factor=1.5, onset=22.91, duration=15.0)
    res = run(DP16, fault, rate=100.0, profile="everything", duration=60.0, seed=91403)
    assert {r.key for r in res.reported} == {"noncomm_slow:rank:3"}
    assert res.latency[0] is not None and res.latency[0] < 12.0, res.latency


@pytest.mark.parametrize("faulty", [True, False])
def test_a_mild_straggler_in_a_job_that_saves_after_every_second_of_steps(run, faulty) -> None:  # type: ignore[no-untyped-def]
    # dp32 at 50/s in unseen's `checkpoint~` (5 s saves after every 30 steps of 40 ms): each run
    # of steps began from the op count the run before left, decayed over ``stale_s`` at its end,
    # and read half its rate; a 1.1x rank (1.05x of the job) showed a third of its excess and was
    # never named (unseen-straggler_mild-003; this seed is our own). Read at the run's own rate
    fault = (Fault("slow_compute", "rank", ranks=(13,), factor=1.1, onset=30.0),) if faulty else ()
    res = run(
        Layout(tp=1, pp=1, dp=32), *fault, rate=50.0, profile=UNSEEN_PROFILES["checkpoint~"], duration=60.0, seed=7105
    )
    assert {r.key for r in res.reported} == ({"noncomm_slow:rank:13"} if faulty else set())
    # its cost read where it is late: a rank 1.1x slower slows the job by 1.1x at most (read over
    # all of its groups, the whole job's group around the saves' barriers showed it 1.33x slower)
    assert all(f["slowdown"] <= 1.1 for f in res.findings_sample), [f["slowdown"] for f in res.findings_sample]


def test_one_straggler_far_over_its_threshold_does_not_make_its_node_slow() -> None:
    # dp16 at 10/s with GC pauses and saves: a 1.5x rank four times over its threshold, its seven
    # node-mates at -0.2 to 0.5 of theirs (three over a quarter, by chance): the node's mean of
    # 0.6 met the slow-node test's 0.5 and node 0 was named, the rank never
    # (``bench/probe_short_runs.py``)
    lay = DP16
    fault = Fault("slow_compute", "rank", ranks=(1,), factor=1.5, onset=27.13, duration=15.0)
    work = Workload.for_rate(10.0, lay)
    sc = Scenario(
        name="one",
        layout=lay,
        workload=work,
        profile=PROFILES["everything"],
        faults=(fault,),
        duration=60.0,
        seed=91405,
    )
    res = run_scenario(sc)
    assert {r.key for r in res.reported} == {"noncomm_slow:rank:1"}


def _reported(
    layout: Layout, workload: Workload, profile: str, fault: Fault | None, duration: float, seed: int
) -> list[str]:
    """Suspects named in one run (a ``fresh`` suite's, rebuilt from its parameters, or our own)."""
    sc = Scenario(
        name="fresh-run",
        layout=layout,
        workload=workload,
        profile={**PROFILES, **HELDOUT_PROFILES}[profile],
        faults=(fault,) if fault else (),
        duration=duration,
        seed=seed,
    )
    return [r.key for r in run_scenario(sc).reported]


@pytest.mark.parametrize(
    ("fault", "seed", "key"),
    [
        (Fault("hang_compute", "node", nodes=(4,), onset=19.16), 2021129, "noncomm_hang:node:node00004"),
        (Fault("crash", "rank", ranks=(1,), onset=19.86, silent=True, kill_after=1.0), 2021733, "rank_dead:rank:1"),
    ],
    ids=["hang", "crash"],
)
def test_what_a_stop_leaves_in_the_ring_names_no_straggler(fault: Fault, seed: int, key: str) -> None:
    # tp8dp8 with uneven batches: a rank late in the job's last step before a node hangs (or a
    # rank crashes and the launcher kills the rest) keeps that lateness in its ring until the ring
    # runs out; with no op after it, its hold ran out too and it was named a straggler a second
    # before the hang (or the dead rank) was (ranks 8 and 5 on these seeds)
    assert _reported(Layout(tp=8, pp=1, dp=8), Workload(step_s=0.6), "data+", fault, 40.0, seed) == [key]


@pytest.mark.parametrize(
    ("profile", "fault", "seed", "duration", "keys"),
    [
        ("gc", Fault("hang_compute", "node", nodes=(4,), onset=21.0), 8, 30.0, ["noncomm_hang:node:node00004"]),
        ("gc+", None, 14, 40.0, []),
    ],
    ids=["before-a-hang", "healthy"],
)
def test_one_ranks_gc_pause_is_not_its_tensor_parallel_node(
    profile: str, fault: Fault | None, seed: int, duration: float, keys: list[str]
) -> None:
    # tp8dp8: a node is one tensor-parallel group, so one rank's long GC pause holds up all eight
    # ranks, and they arrive late together at every data-parallel reduce for a second or two. Held
    # for ``hold_s`` (1 s), that named node 3 of a healthy job at 31.5 s, and node 1 at 22.5 s,
    # a second after node 4 hung (the hang froze the pause's lateness in the ring)
    lay = Layout(tp=8, pp=1, dp=8)
    assert _reported(lay, Workload.for_rate(30.0, lay), profile, fault, duration, seed) == keys


def test_a_node_that_hangs_while_it_saves_is_the_node() -> None:
    # tp2pp4dp4 saving a checkpoint: five of node 3's ranks had written their shard and entered
    # the save's barrier when the node hung, so only three never arrive; three ranks of one host
    # stopping at once are the host's doing (they were named as three ranks)
    hang = Fault("hang_compute", "node", nodes=(3,), onset=27.16)
    assert _reported(Layout(tp=2, pp=4, dp=4), Workload(step_s=0.3467), "checkpoint+", hang, 60.0, 2021133) == [
        "noncomm_hang:node:node00003"
    ]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_second_straggler_behind_a_worse_one_in_its_group(run, seed) -> None:  # type: ignore[no-untyped-def]
    # one data-parallel group, a 1.5x straggler and, 5 s later, a 1.3x one: the second waits in the
    # group for the first, so its time inside ops grew, and the victim test read that as a victim's
    # waiting; the old code never named it on seeds 1 and 3 (8.5 s on seed 2)
    res = run(
        DP16,
        Fault("slow_compute", "rank", ranks=(13,), factor=1.5, onset=20.0),
        Fault("slow_compute", "rank", ranks=(2,), factor=1.3, onset=25.0),
        duration=40.0,
        seed=seed,
    )
    assert {r.key for r in res.reported} == {"noncomm_slow:rank:13", "noncomm_slow:rank:2"}
    assert res.latency[1] is not None and res.latency[1] <= 8.0, res.latency


@pytest.mark.parametrize("seed", [1, 2])
def test_a_mild_straggler_that_flickers_in_the_evidence(run, seed) -> None:  # type: ignore[no-untyped-def]
    # a 1.1x rank in a pipeline: late in most of its steps, not all, so it drops out of the roots
    # for an evaluation now and then; its 4 s hold started afresh at every drop and never ran out
    # (the old code never named it on any seed)
    res = run(
        Layout(tp=2, pp=2, dp=4),
        Fault("slow_compute", "rank", ranks=(5,), factor=1.1, onset=20.0),
        duration=50.0,
        seed=seed,
    )
    _only(res, "noncomm_slow:rank:5")


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_second_straggler_that_waits_elsewhere_on_the_first(run, seed) -> None:  # type: ignore[no-untyped-def]
    # a 1.5x and, 5 s later, a 1.3x straggler at the same place of two tensor-parallel groups
    # (nodes): the second is last in its own group and waits, in the data-parallel group they
    # share, for the first. Its mates wait as long in theirs (for the first one's mates), so that
    # wait is no excuse; the old code took it for one and never named the second in 45 s
    res = run(
        TP8PP2DP2,
        Fault("slow_compute", "rank", ranks=(11,), factor=1.5, onset=20.0),
        Fault("slow_compute", "rank", ranks=(3,), factor=1.3, onset=25.0),
        seed=seed,
    )
    assert {r.key for r in res.reported} == {"noncomm_slow:rank:11", "noncomm_slow:rank:3"}
    assert res.latency[1] is not None and res.latency[1] <= 8.0, res.latency


@pytest.mark.parametrize("seed", [1, 5])
def test_the_first_channel_of_a_slow_link_does_not_name_a_gpu(seed: int) -> None:
    # a 5x slow link between two pipeline stages in a noisy job: its channels are judged slow one
    # after another, and the first alone looked like the NIC of one GPU, named (with another, on
    # seed 1) three seconds before the link. A place seen between two nodes only is held as a
    # link one of its nodes' NICs explains is (``link_hold_s``)
    lay = Layout(tp=2, pp=4, dp=4)
    sc = Scenario(
        name="link",
        layout=lay,
        workload=Workload.for_rate(30.0, lay),
        profile=HELDOUT_PROFILES["cpu_noise+"],
        faults=(Fault("slow_comm", "link", nodes=(0, 1), factor=5.0, onset=25.0),),
        duration=45.0,
        seed=seed,
    )
    res = run_scenario(sc)
    _only(res, "comm_slow:link:node00000|node00001")
    assert res.latency[0] <= 6.0, res.latency


@pytest.mark.parametrize("seed", [24, 26])
def test_the_tensor_parallel_mates_of_a_straggler_are_its_victims(run, seed) -> None:  # type: ignore[no-untyped-def]
    # a 1.15x rank in a node-wide tensor-parallel group, GC pauses everywhere: its seven mates wait
    # for it there and so reach their data-parallel reduces late together. Excused at first for
    # that wait, they were judged again once the straggler was a root (as a second straggler that
    # waits on the first is), and in evaluations where their data-parallel mates' own waiting
    # happened to be as large, named: the node at 48 s on seed 24, the node instead of the rank on
    # seed 26. A wait on a late member that their mates did not share is passed on
    res = run(
        Layout(tp=8, pp=1, dp=4),
        Fault("slow_compute", "rank", ranks=(20,), factor=1.15, onset=20.0),
        profile="gc",
        duration=50.0,
        seed=seed,
    )
    _only(res, "noncomm_slow:rank:20")


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_a_slow_stage_that_swings_across_the_line_is_named(run, seed) -> None:  # type: ignore[no-untyped-def]
    # a 1.2x node that is a pipeline stage, in a job with every kind of jitter: its two signs
    # swing across their lines for an evaluation now and then, and the 6 s hold started afresh
    # each time, while the usual it then learned took the fault in (the old code missed seed 2)
    res = run(
        Layout(tp=2, pp=2, dp=4),
        Fault("slow_compute", "node", nodes=(0,), factor=1.2, onset=25.0),
        profile="everything",
        duration=60.0,
        seed=seed,
    )
    _only(res, "noncomm_slow:node:node00000")


def _stage_in_cpu_noise(node: int, seed: int, slow: bool) -> ScenarioResult:
    # tp2pp4dp4 at 30/s under heldout's strong CPU noise, one stage (node) 1.2x slow from 24 s
    # (the job about 1.05x slower), or the same job healthy
    faults = (Fault("slow_compute", "node", nodes=(node,), factor=1.2, onset=24.0),) if slow else ()
    sc = Scenario(
        name="stage",
        layout=TP2PP4DP4,
        workload=Workload.for_rate(30.0, TP2PP4DP4),
        profile=HELDOUT_PROFILES["cpu_noise+"],
        faults=faults,
        duration=60.0,
        seed=seed,
    )
    return run_scenario(sc)


@pytest.mark.parametrize(("seed", "slow"), [(3, True), (5, True), (3, False), (5, False)])
def test_a_slow_stage_is_not_learned_as_usual_before_both_signs_cross(seed: int, slow: bool) -> None:
    # a 1.2x node that is a stage of a 4-stage pipeline under strong CPU noise (the job 1.05x
    # slower): its point-to-point lateness rises at once, its share's drop crosses its line
    # seconds later, and meanwhile the lateness was learned as the node's usual and never counted
    # again (the code before missed both seeds; the healthy runs of the same seeds name nobody)
    res = _stage_in_cpu_noise(0, seed, slow)
    if slow:
        _only(res, "noncomm_slow:node:node00000")
        assert res.latency[0] is not None and res.latency[0] < 30.0
    else:
        assert not res.reported, [r.key for r in res.reported]


@pytest.mark.parametrize(("seed", "slow"), [(203, True), (204, True), (205, False)])
def test_a_slow_stage_whose_share_drops_clearly_needs_less_of_the_late_sign(seed: int, slow: bool) -> None:
    # the last stage of tp2pp4dp4 1.2x slow under strong CPU noise (bench/probe_stages.py's seeds;
    # the job 1.05x slower): its share inside ops drops twice past its line, but its sends are late
    # by a little under the late sign's line, and the two never held together (the code before
    # missed both seeds). A share clearly past its line needs half the late sign; the healthy run
    # of the same profile names nobody
    res = _stage_in_cpu_noise(3, seed, slow)
    if slow:
        _only(res, "noncomm_slow:node:node00003")
    else:
        assert not res.reported, [r.key for r in res.reported]


@pytest.mark.parametrize(("seed", "slow"), [(2, True), (3, True), (2, False)])
def test_a_mild_straggler_that_hovers_at_its_threshold_is_named(run, seed, slow) -> None:  # type: ignore[no-untyped-def]
    # a 1.1x rank of tp8pp2dp2 that saves every 40 steps (the job 1.01-1.03x slower): its evidence
    # added up to three times ``cusum_h`` and stayed there, late in four of five buckets, but its
    # excess swung between 0.8 and 1.1 of its threshold, out of the roots for seconds at a time, and
    # its 4 s hold never ran out (tune-straggler_mild-002; the code before missed these seeds, and
    # four of eight like them). Nothing else reported in the job, such a rank is a root at 0.75
    # of its threshold; the healthy run of the same seed names nobody
    res = run(
        Layout(tp=8, pp=2, dp=2),
        *((Fault("slow_compute", "rank", ranks=(16,), factor=1.1, onset=28.6),) if slow else ()),
        step_s=0.14666666666666667,
        profile="checkpoint",
        duration=60.0,
        seed=seed,
    )
    if slow:
        _only(res, "noncomm_slow:rank:16")
    else:
        assert not res.reported, [r.key for r in res.reported]


@pytest.mark.parametrize(("seed", "rank"), [(1, 50), (3, 12)])
@pytest.mark.parametrize("slow", [True, False], ids=["slow", "healthy"])
def test_a_straggler_whose_groups_run_one_burst_a_step_of_under_a_second_is_named(run, seed, rank, slow) -> None:  # type: ignore[no-untyped-def]
    # tp8pp4dp2 at 10 collectives a second: steps of 0.9 s, one burst of tensor-parallel ops in
    # each, so four or five bursts in the 4 s window and a median at one analysis in four; the
    # evidence started from nothing at every four, reached a third of ``cusum_h`` and a 1.3x rank
    # was never named (tune-two_stragglers-007's second straggler neither, in tp8pp4dp4). A group
    # a bucket short while it runs keeps its judgement until its next burst; the healthy run of
    # the same seed names nobody
    res = run(
        Layout(tp=8, pp=4, dp=2),
        *((Fault("slow_compute", "rank", ranks=(rank,), factor=1.3, onset=20.0),) if slow else ()),
        rate=10.0,
        profile="checkpoint",
        duration=45.0,
        seed=seed,
    )
    if slow:
        _only(res, f"noncomm_slow:rank:{rank}")
    else:
        assert not res.reported, [r.key for r in res.reported]


def test_a_stragglers_pipeline_neighbour_kept_between_bursts_is_not_named(run) -> None:  # type: ignore[no-untyped-def]
    # tune-straggler-008 rebuilt (tp8pp2dp2, CPU noise, 10/s: steps of 0.8 s): rank 15 waits on its
    # pipeline neighbour, whose stage holds the 1.5x rank 25, and arrives late at its data-parallel
    # reduce; its pipeline's sends are between bursts too, not judged, so the victim tests lack
    # whom it waited on. Its lateness kept between bursts, it was named at 42 s by the short hold;
    # such a rank holds only the mild hold
    res = run(
        Layout(tp=8, pp=2, dp=2),
        Fault("slow_compute", "rank", ranks=(25,), factor=1.5, onset=26.814),
        rate=10.0,
        profile="cpu_noise",
        duration=60.0,
        seed=20008,
    )
    _only(res, "noncomm_slow:rank:25")


def test_a_gc_pause_that_thins_a_group_to_a_bucket_short_is_not_kept(run) -> None:  # type: ignore[no-untyped-def]
    # tp8dp8 with GC pauses (``bench/probe_healthy.py --wide``, seed 5051): one rank's pause thinned
    # its data-parallel group from six bursts in the window to four; kept as a group between its
    # bursts, its lateness of 6.6 times its threshold named rank 42 a second later. Only a group
    # judged with just five is kept, and only a slot late in four of them (either gate stops this)
    res = run(Layout(tp=8, pp=1, dp=8), rate=30.0, profile=HELDOUT_PROFILES["gc+"], duration=60.0, seed=5051)
    assert not res.reported, [r.key for r in res.reported]


def test_a_second_straggler_beside_members_between_their_bursts_is_named_soon(run) -> None:  # type: ignore[no-untyped-def]
    # tune-two_stragglers-004 rebuilt (tp2pp2dp8, all jitter at once, 0.8 s steps): healthy members
    # a bucket short, their evidence kept open, froze their ranks' baselines and the 1.3x second
    # straggler was taken for a victim for 18 s (22.8 s after its onset, 4.8 s before). Only a slot
    # late in four of its five buckets when judged is kept
    res = run(
        Layout(tp=2, pp=2, dp=8),
        Fault("slow_compute", "rank", ranks=(22,), factor=1.5, onset=25.199),
        Fault("slow_compute", "rank", ranks=(6,), factor=1.3, onset=30.199),
        rate=10.0,
        profile="everything",
        duration=60.0,
        seed=20504,
    )
    assert not res.false_suspects, [r.key for r in res.false_suspects]
    assert res.latency[1] is not None and res.latency[1] < 10.0, res.latency


def test_a_slow_nodes_rank_at_its_cap_is_not_named_alone_while_its_node_mates_are_as_late(run) -> None:  # type: ignore[no-untyped-def]
    # a 1.2x node of tp8dp8 (one tensor-parallel group), `everything`: its eight ranks are about
    # their thresholds together, and only rank 22's evidence reached the cap; at three quarters of
    # its threshold it held on alone and was named as a rank (``bench/probe_nodes.py`` seed 410).
    # The node tests miss this node; what matters here is that no single rank stands for it
    res = run(
        Layout(tp=8, pp=1, dp=8),
        Fault("slow_compute", "node", nodes=(2,), factor=1.2, onset=20.0),
        rate=30.0,
        profile="everything",
        duration=40.0,
        seed=410,
    )
    assert not [r.key for r in res.reported if r.key.startswith("noncomm_slow:rank:")]


TP4PP2DP4 = Layout(tp=4, pp=2, dp=4)  # 32 ranks on 4 nodes: a node is half a pipeline stage


def _two_stragglers(
    lay: Layout, workload: Workload, profile: Profile, first: int, second: int, onset: float, duration: float, seed: int
) -> Scenario:
    """The suite's ``two_stragglers``: ``first`` slows to 1.5x at ``onset``, ``second`` to 1.3x 5 s later."""
    return Scenario(
        name="two-stragglers",
        layout=lay,
        workload=workload,
        profile=profile,
        faults=(
            Fault("slow_compute", "rank", ranks=(first,), factor=1.5, onset=onset),
            Fault("slow_compute", "rank", ranks=(second,), factor=1.3, onset=onset + 5.0),
        ),
        duration=duration,
        seed=seed,
    )


def _slow_node(node: int, factor: float, onset: float) -> Fault:
    return Fault("slow_compute", "node", nodes=(node,), factor=factor, onset=onset)


@pytest.mark.parametrize(
    ("profile", "node", "factor", "seed"), [("gc", 0, 1.5, 716), ("everything", 3, 1.2, 703)], ids=["gc", "everything"]
)
def test_a_slow_node_whose_ranks_turn_roots_a_few_at_a_time_is_the_node(run, profile, node, factor, seed) -> None:  # type: ignore[no-untyped-def]
    # tp4pp2dp4: a node is half a stage, and half of every data-parallel group of that stage; its
    # ranks become roots a few at a time, and the code before named three of them (gc) or one
    # (everything) as ranks of their own before half the node had been roots together
    res = run(TP4PP2DP4, _slow_node(node, factor, 25.0), profile=profile, duration=60.0, seed=seed)
    assert res.latency[0] is not None and res.latency[0] < 10.0
    on_node = {f"noncomm_slow:rank:{r}" for r in TP4PP2DP4.ranks_on_node(node)}
    assert not on_node & {r.key for r in res.reported}, [r.key for r in res.reported]


def test_a_slow_node_whose_ranks_flicker_is_named_once_half_of_it_is_late_again(run) -> None:  # type: ignore[no-untyped-def]
    # tp4pp2dp4 at 10 collectives a second with uneven steps (bench/probe_classes.py, seed 6302):
    # a 1.5x node, half of the second stage; rank 28 held first and was named alone 4.6 s after
    # the onset, and the node's ranks were roots together for one or two analyses at a time, never
    # for the 1 s the node needs, so the node was named only 22.6 s after the onset. Half its ranks
    # late at once twice within ``mild_hold_s``, with one of them a straggler already, is the node.
    # Rank 28 is no longer named at all (late in three of five recent buckets, not four), and its
    # confirmation is remembered for the node's rule
    res = run(TP4PP2DP4, _slow_node(3, 1.5, 28.873), rate=10.0, profile="data", duration=60.0, seed=6302204)
    assert res.latency[0] is not None and res.latency[0] < 12.0, res.latency
    assert not res.false_suspects, [r.key for r in res.false_suspects]


def test_a_slow_node_whose_ranks_are_roots_every_other_analysis_is_named_within_the_hold(run) -> None:  # type: ignore[no-untyped-def]
    # tp4pp2dp4, quiet, 100/s (bench/probe_classes.py, seed 6303): the ranks of a 1.2x node were
    # all roots at every other analysis and none at the ones between, so their time together never
    # reached ``hold_s``; two of them held 4 s (the mild hold bridges such drops) and were named
    # alone 10 s after the onset, the node half a second later. The node's hold bridges them too
    res = run(TP4PP2DP4, _slow_node(1, 1.2, 25.056), profile="quiet", duration=60.0, seed=6303203)
    assert not res.false_suspects, [r.key for r in res.false_suspects]
    assert res.latency[0] is not None and res.latency[0] < 6.0, res.latency


def test_a_stragglers_tensor_parallel_mates_flickering_with_it_are_not_its_node() -> None:
    # heldout-two_stragglers-000 rebuilt (tp8dp8, GC pauses, 30/s: a node is one tensor-parallel
    # group): the mates of the 1.3x rank 49 wait for it and were half the node's roots twice within
    # a few seconds; counted as a node whose ranks flicker, node00006 was named beside the rank
    lay = Layout(tp=8, pp=1, dp=8)
    sc = _two_stragglers(lay, Workload.for_rate(30.0, lay), HELDOUT_PROFILES["gc+"], 17, 49, 18.288, 40.0, 1020503)
    res = run_scenario(sc)
    assert not res.false_suspects, [r.key for r in res.false_suspects]
    assert all(x is not None for x in res.latency), res.latency


DP24 = Layout(tp=1, pp=1, dp=24)  # 24 ranks on 3 nodes, one data-parallel group


@pytest.mark.parametrize(
    ("profile", "fault", "key", "seeds"),
    [
        ("everything", Fault("slow_compute", "node", nodes=(2,), factor=1.2, onset=20.0), "node:node00002", (13, 15)),
        ("everything", None, None, (13, 15)),
        ("checkpoint", Fault("slow_compute", "rank", ranks=(5,), factor=1.5, onset=20.0), "rank:5", (1, 3)),
        ("checkpoint", None, None, (1, 3)),
    ],
    ids=["slow-node", "healthy", "slow-rank", "healthy-40-steps"],
)
def test_a_straggler_in_a_job_that_mostly_saves_holds_up_its_barriers(profile, fault, key, seeds) -> None:  # type: ignore[no-untyped-def]
    # 50 (40) steps of 20 ms between 3 s (4 s) saves: the job trains about 1 s in every 4 or 5,
    # and a node a fifth slower, or a rank half slower, loses most of what it costs at the barrier
    # after each save, where it arrives last (it writes slower too). The bursts of steps were too
    # short for the bucketed lateness: the node was missed in 6 of 6 seeds and the rank in 6 of 6
    # (a job 1.25-1.39x slower) until the barriers were judged on their own (2026-12-01), which
    # named them 12.5-18 s after the onset. Since the data-parallel group is judged across the
    # saves (*Runs too short to judge*, 2026-12-05) its lateness names them first (5-12 s); the
    # evidence is that group's or the barriers'
    for seed in seeds:
        sc = Scenario(
            name="saves",
            layout=DP24,
            workload=Workload.for_rate(100.0, DP24),
            profile=PROFILES[profile],
            faults=(fault,) if fault else (),
            duration=50.0,
            seed=seed,
        )
        res = run_scenario(sc, keep_findings=True)
        assert {r.key for r in res.reported} == ({f"noncomm_slow:{key}"} if key else set()), seed
        if fault:
            assert res.latency[0] is not None and res.latency[0] < 20.0, (seed, res.latency)
            ev = res.findings_sample[0]["evidence"]
            assert "barriers" in ev or any(g["desc"] == "dp" for g in ev.get("groups", [])), ev


@pytest.mark.parametrize(("profile", "bound"), [("quiet", 2.5), ("gc", 3.0)])
def test_a_straggler_whose_noise_is_learned_is_named_within_the_bar(run, profile, bound) -> None:  # type: ignore[no-untyped-def]
    # a 1.5x rank 25 s in (its usual fluctuation learned): delivery (a send a second), three late
    # buckets of five and the hold. With a 1 s hold it took 3.0 s on each seed (quiet) and 3.5,
    # 5.5, 3.0 s (GC pauses); with the short hold 2.5 s, and 3.0, 2.5, 2.5 s (the bar:
    # 3 s median for 1.2x and worse)
    for seed in (1, 2, 3):
        res = run(
            DP16,
            Fault("slow_compute", "rank", ranks=(6,), factor=1.5, onset=25.0),
            profile=profile,
            duration=35.0,
            seed=seed,
        )
        _only(res, "noncomm_slow:rank:6")
        assert res.latency[0] <= bound, (seed, res.latency)


@pytest.mark.parametrize(
    ("layout", "rate", "profile", "seed"),
    [
        (Layout(tp=2, pp=2, dp=16), 50.0, UNSEEN_PROFILES["gc~"], 3021421),
        (Layout(tp=8, pp=2, dp=4), 50.0, UNSEEN_PROFILES["gc~"], 3021320),
        (Layout(tp=8, pp=1, dp=8), 30.0, HELDOUT_PROFILES["gc+"], 2020033),
    ],
    ids=["tp2pp2dp16", "tp8pp2dp4", "tp8dp8"],
)
def test_a_cluster_of_gc_pauses_before_a_rank_is_learned_names_nobody(layout, rate, profile, seed) -> None:  # type: ignore[no-untyped-def]
    # healthy runs of three evaluation jobs (unseen-stop_rank-004, unseen-hang_nvl-003,
    # fresh-straggler-004 before their faults): a rank's cluster of GC pauses, 12-17 s in, lifts its
    # lateness over the floor that stands for its threshold until its fluctuation is learned, for a
    # second or so. The short hold, given to every straggler of 1.2x, named ranks 62 and 63, 29,
    # and 1 and 7 with their node here; it waits for the rank's own threshold
    sc = Scenario(
        name="gc",
        layout=layout,
        workload=Workload.for_rate(rate, layout),
        profile=profile,
        faults=(),
        duration=20.0,
        seed=seed,
    )
    assert run_scenario(sc).reported == []


def test_a_cluster_of_gc_pauses_at_three_steps_of_five_names_nobody() -> None:
    # heldout-healthy-002 (tp8dp8, 30/s, GC pauses of 0.3 s at 0.08 a second): three of rank 36's
    # pauses, 31-33 s in, landed before three of five consecutive data-parallel reduces, and
    # its lateness there, the median of its five recent buckets, read 1.4x for two seconds, its
    # fluctuation long learned: held 1 s, it was named. A straggler is late in (nearly) every
    # bucket; named alone on the short hold, a rank must be late in four of five
    sc = Scenario(
        name="gc-cluster",
        layout=Layout(tp=8, pp=1, dp=8),
        workload=Workload(step_s=0.6),
        profile=HELDOUT_PROFILES["gc+"],
        faults=(),
        duration=38.0,
        seed=1010005,
    )
    assert run_scenario(sc).reported == []


def test_a_rank_late_by_chance_in_uneven_steps_waits_for_the_full_hold() -> None:
    # tp8dp8 with data-dependent steps (heldout-straggler_flap-004): rank 21, 33 s in, its
    # fluctuation long learned, is late by twice its threshold for a second by chance. Held half a
    # second it was named beside the real (flapping) straggler, rank 52; the short hold also asks
    # for twice the evidence that made it a root, which a chance lateness has not gathered by then
    fault = Fault("slow_compute", "rank", ranks=(52,), factor=1.5, onset=18.4639, flap=(6.0, 6.0))
    assert _reported(Layout(tp=8, pp=1, dp=8), Workload(step_s=0.6), "data+", fault, 40.0, 1020307) == [
        "noncomm_slow:rank:52"
    ]


def test_a_second_straggler_is_named_though_the_first_slowed_everybody() -> None:
    # fresh-two_stragglers-004 (tp8dp8, data-dependent steps): rank 34 slows to 1.5x, rank 10 (same
    # data-parallel groups) to 1.3x five seconds later. Rank 10's lateness in its groups rose from
    # 0.03 to 0.15-0.2 s a second; before its evidence added up, those first seconds were learned as
    # its fluctuation, its threshold doubled in eight seconds and it dropped out of the roots for
    # good. The samples of a slot whose evidence is open are held back now
    sc = Scenario(
        name="two-stragglers",
        layout=Layout(tp=8, pp=1, dp=8),
        workload=Workload(step_s=0.6),
        profile=HELDOUT_PROFILES["data+"],
        faults=(
            Fault("slow_compute", "rank", ranks=(34,), factor=1.5, onset=19.2981),
            Fault("slow_compute", "rank", ranks=(10,), factor=1.3, onset=24.2981),
        ),
        duration=40.0,
        seed=2020533,
    )
    res = run_scenario(sc)
    assert {r.key for r in res.reported} == {"noncomm_slow:rank:34", "noncomm_slow:rank:10"}
    assert res.latency[1] is not None and res.latency[1] <= 10.0, res.latency


def test_what_a_slow_nic_does_to_others_lateness_names_no_straggler() -> None:
    # tune-slow_nic-007: node 2's NIC at a third of its speed shifts node 0's ranks' lateness by
    # 0.04 s a second, over their floor of 0.03; held back like a straggler's first seconds, that
    # shift stayed unlearned and node 0 was named a slow node ten seconds in. While transfers are
    # slow anywhere in the job, lateness is learned as it comes
    sc = Scenario(
        name="slow-nic",
        layout=Layout(tp=2, pp=2, dp=8),
        workload=Workload.for_rate(100.0, Layout(tp=2, pp=2, dp=8)),
        profile=PROFILES["everything"],
        faults=(Fault("slow_comm", "nic", nodes=(2,), factor=3.0, onset=25.5901),),
        duration=60.0,
        seed=20707,
    )
    assert [r.key for r in run_scenario(sc).reported] == ["comm_slow:node:node00002"]


def test_a_rank_slightly_slow_for_good_keeps_learning_its_fluctuation() -> None:
    # rank 6 of dp16 1.04x slower from 20 s: over half its threshold and under three quarters of
    # it, so its evidence never closes and it is not named. Its fluctuation samples are held back
    # at most ``noise_hold_s`` at a time, then learned: never learned again, its threshold could not
    # follow a noisier phase of a job that runs for hours. (At 1.05x, as this test had it until the
    # thirty-seventh session, the rank is now named 18 s after its onset: its evidence at the cap
    # makes it a root at three quarters of its threshold, and a named rank's held samples are
    # dropped, 12 s in)
    lay = Layout(tp=1, pp=1, dp=16)
    sc = Scenario(
        name="slightly-slow",
        layout=lay,
        workload=Workload.for_rate(100.0, lay),
        profile=PROFILES["quiet"],
        faults=(Fault("slow_compute", "rank", ranks=(6,), factor=1.04, onset=20.0),),
        duration=60.0,
        seed=1,
    )
    cfg = DetectorConfig()
    det = JobDetector(cfg)
    held, t_next = [], EVAL_EVERY_S
    for d in deliveries(sc, []):
        while d.received_at > t_next:
            det.evaluate(t_next)
            ptr, slots = det.topo.rank_slots()
            mine = slots[ptr[6] : ptr[7]]
            held.append(float(det.late.pend[mine[mine < det.late.pend.shape[0]], 3].max(initial=0.0)))
            t_next += EVAL_EVERY_S
        det.observe(d.batch, d.received_at)
    assert max(held) >= cfg.noise_hold_s - 1.0  # its evidence stayed open that long
    assert max(held) <= cfg.noise_hold_s


def test_a_hang_inside_a_whole_job_barrier_says_what_to_do_next() -> None:
    # tune-hang_nvl-001: node 2's NVLink stops while every rank is in the barrier after a
    # checkpoint's save, and nothing else is in flight. Collective timings cannot tell which node
    # stopped it: the suspect is every node, marked ambiguous, and tells on-call how to split it
    sc = Scenario(
        name="hang-in-barrier",
        layout=TP8PP2DP2,
        workload=Workload.for_rate(100.0, TP8PP2DP2),
        profile=PROFILES["checkpoint"],
        faults=(Fault("hang_comm", "nvl", nodes=(2,), onset=26.2235),),
        duration=40.0,
        seed=21301,
    )
    res = run_scenario(sc, keep_findings=True)
    (f,) = [f for f in res.findings_sample if f["kind"] == "comm_hang"]
    ev = f["evidence"]
    assert ev["ambiguous"] is True and f["score"] == 0.5
    assert "stuck op" in ev["next_step"] and "Flight Recorder" in ev["next_step"] and "node00002" in ev["next_step"]
    # and the evaluation expects just that (every node: the barrier is all the evidence there is)
    assert res.expected[0].nodes == tuple(f"node{i:05d}" for i in range(4))
    assert res.latency[0] is not None and res.latency[0] <= 15.0 and not res.false_suspects


def test_a_second_straggler_in_a_job_the_first_already_slowed_holds_the_short_hold() -> None:
    # tp4dp4 at 100/s with every kind of jitter: rank 5 slows to 1.5x, rank 13 (its data-parallel
    # group) to 1.3x five seconds later. On its own rank 13 costs the job under 1.2x, so it waited
    # the mild hold (4 s, named 5.2 s after its onset) though the job was by then 1.2x slower. A
    # job a named straggler has already slowed that much is not barely slowed: a further root
    # adding at least half that cost holds the short hold
    lay = Layout(tp=4, pp=1, dp=4)
    sc = _two_stragglers(lay, Workload.for_rate(100.0, lay), PROFILES["everything"], 5, 13, 20.3, 40.0, 7101)
    res = run_scenario(sc)
    assert sorted(r.key for r in res.reported) == ["noncomm_slow:rank:13", "noncomm_slow:rank:5"]
    assert res.true_slowdown >= 1.2
    assert res.latency[1] is not None and res.latency[1] <= 3.0


def test_a_straggler_that_drops_out_of_the_roots_for_one_analysis_keeps_its_short_hold() -> None:
    # tune-straggler-002 (tp8pp2dp2, 10/s, a checkpoint every 40 steps): rank 4 slows to 1.5x;
    # a root 2.3 s after the onset, it is out of the roots at the next analysis (its time inside
    # ops not yet down in the common window) and back at the one after. The short hold started
    # afresh there and it was named 4.3 s after the onset; a drop of one analysis is bridged now
    lay = Layout(tp=8, pp=2, dp=2)
    sc = Scenario(
        name="drop-one-analysis",
        layout=lay,
        workload=Workload.for_rate(10.0, lay),
        profile=PROFILES["checkpoint"],
        faults=(Fault("slow_compute", "rank", ranks=(4,), factor=1.5, onset=22.206570753586853),),
        duration=32.0,
        seed=20002,
    )
    res = run_scenario(sc)
    assert [r.key for r in res.reported] == ["noncomm_slow:rank:4"]
    assert res.latency[0] is not None and res.latency[0] <= 3.5


def test_a_second_straggler_in_a_deep_pipeline_is_named_alone_before_its_noise_is_learned_in_full() -> None:
    # fresh-two_stragglers-000 (tp2pp4dp4, 300/s, checkpoint every 25 steps): rank 21 slows to
    # 1.5x, rank 13 to 1.3x five seconds later. Rank 13 is taken for a victim of the pipeline's
    # waiting for most of the run and a root for a second at a time (41 s in), while its
    # fluctuation had been learned for 10-15 s: it needed the 1 s hold and was never named. Named
    # alone, a rank late in four of five buckets may hold the short hold once its fluctuation has
    # been learned for half of ``noise_warm_s``
    lay = Layout(tp=2, pp=4, dp=4)
    sc = _two_stragglers(
        lay, Workload.for_rate(300.0, lay), HELDOUT_PROFILES["checkpoint+"], 21, 13, 22.130530484095402, 45.0, 2020529
    )
    assert sorted(r.key for r in run_scenario(sc).reported) == ["noncomm_slow:rank:13", "noncomm_slow:rank:21"]


def test_a_slow_link_keeps_explaining_its_far_node_s_lateness_through_a_save(run) -> None:  # type: ignore[no-untyped-def]
    # tp4pp2dp4 at 100/s with every kind of jitter (a probe of our own seeds, 6403): the link
    # between nodes 1 and 3 slows 4x, a 1.5x straggler (rank 17) follows three seconds later. Node
    # 3's ranks reach their data-parallel reduces late, which the slow link explains; then the job
    # saves a checkpoint, the link's channels bring no block for 3.6 s, and their excess, an average
    # decayed with time, fell under what it had to explain while the lateness it caused was kept
    # through the save: node 3 was named a slow node for 9 s. The excuse now keeps the channel's
    # excess as of its last blocks while it is quiet
    res = run(
        TP4PP2DP4,
        Fault("slow_comm", "link", nodes=(1, 3), factor=4.0, onset=29.7734),
        Fault("slow_compute", "rank", ranks=(17,), factor=1.5, onset=32.7734),
        profile="everything",
        duration=60.0,
        seed=6403900,
    )
    assert [r.key for r in res.false_suspects] == []
    assert res.latency[0] is not None and res.latency[1] is not None


def test_a_stage_held_up_by_a_straggler_s_pipeline_neighbour_is_not_named(run) -> None:  # type: ignore[no-untyped-def]
    # tp4pp2dp4 at 10/s with strong GC pauses (a probe of our own seeds, 6404, heldout's jitter):
    # rank 23, stage 1 of replica 1, is 1.5x slow for 15 s. Stage 0 of that replica waits in its
    # receives for stage 1's sends and reaches its data-parallel reduces late; rank 5 waited 0.2 s
    # a window there on rank 21 (23's tensor-parallel mate), whose sends were late by 0.8-0.95 of
    # the bar that names a rank by its pipeline lateness: not "late" for the victim test, and rank
    # 5 was named for 6 s. A neighbour late by a collective's bar is late enough to have been waited on
    res = run(
        TP4PP2DP4,
        Fault("slow_compute", "rank", ranks=(23,), factor=1.5, onset=30.1604, duration=15.0),
        rate=10.0,
        profile=HELDOUT_PROFILES["gc+"],
        duration=60.0,
        seed=6404403,
    )
    assert [r.key for r in res.false_suspects] == []
    assert res.latency[0] is not None


def test_a_slow_last_stage_with_uneven_steps_is_named(run) -> None:  # type: ignore[no-untyped-def]
    # tp2pp4dp4 at 30/s with uneven steps (bench/probe_stages.py, seed 218): the last stage 1.2x
    # slow, a job 1.045x slower. With its share inside ops read over the 4 s window at op rates
    # decayed to now it was never named in the 60 s run; read over 8 s with tapered ends, at the
    # op rates as of each group's newest op, it is named 10 s after its onset
    res = run(
        TP2PP4DP4,
        Fault("slow_compute", "node", nodes=(3,), factor=1.2, onset=24.0),
        rate=30.0,
        profile="data",
        duration=60.0,
        seed=218,
    )
    assert [r.key for r in res.false_suspects] == []
    assert res.latency[0] is not None


def test_a_straggler_s_node_is_not_named_a_slow_stage_beside_it(run) -> None:  # type: ignore[no-untyped-def]
    # tp2pp4dp4 at 200/s with CPU noise: rank 21, on node 2 (the third stage), is 1.5x slow and
    # named; its own share of time inside ops drops, its node's mean with it, and its sends are
    # late, so the slow-stage test named node 2 at 39 s as well. A node some of whose ranks are
    # reported, not all, is left to them
    res = run(
        TP2PP4DP4,
        Fault("slow_compute", "rank", ranks=(21,), factor=1.5, onset=15.0),
        rate=200.0,
        profile="cpu_noise",
        duration=40.0,
        seed=3,
    )
    assert [r.key for r in res.false_suspects] == []
    assert res.latency[0] is not None


def test_a_slow_node_of_a_data_parallel_job_late_below_every_rank_s_threshold_is_the_node(run) -> None:  # type: ignore[no-untyped-def]
    # dp24 at 100/s with unseen's every-kind jitter (a probe of our own seeds, 6405): node 1 turns
    # 1.2x slow. Its eight ranks are late at every reduce by 0.45-0.75 of their thresholds, the
    # other sixteen by nothing; one of them crossed its threshold now and then and was named alone
    # (rank 14), the node never. Eight ranks late together is the node
    res = run(
        DP24,
        Fault("slow_compute", "node", nodes=(1,), factor=1.2, onset=24.4574),
        profile=UNSEEN_PROFILES["everything~"],
        duration=60.0,
        seed=6405205,
    )
    assert [r.key for r in res.reported] == ["noncomm_slow:node:node00001"]
    assert res.latency[0] is not None and res.latency[0] < 15.0


def test_a_slow_node_whose_ranks_sit_one_to_a_group_is_the_node(run) -> None:  # type: ignore[no-untyped-def]
    # tp8dp4 at 10/s with unseen's GC pauses (a probe of our own seeds, 61209): node 3 turns 1.2x
    # slow. It is one tensor-parallel group, and each of its eight ranks is the one rank of node 3
    # in a data-parallel group of four: late there by 0.4-0.8 of its threshold for 24 s, the
    # other members not late, no group holding half the node's ranks. Never named before
    res = run(
        Layout(tp=8, pp=1, dp=4),
        Fault("slow_compute", "node", nodes=(3,), factor=1.2, onset=23.11444591434313),
        rate=10.0,
        profile=UNSEEN_PROFILES["gc~"],
        duration=60.0,
        seed=61209200,
    )
    assert [r.key for r in res.reported] == ["noncomm_slow:node:node00003"]
    assert res.latency[0] is not None and res.latency[0] < 10.0


def test_a_mild_straggler_of_a_node_that_is_one_group_is_not_its_node(run) -> None:  # type: ignore[no-untyped-def]
    # tp8dp4 at 100/s, a slow first step (a probe seed of our own, 61206): rank 12 turns 1.1x
    # slow. Its seven tensor-parallel mates wait on it, and the node's eight ranks reach their
    # data-parallel reduces late together by 0.7-0.9 of their thresholds, as a slow node's do;
    # inside the node rank 12 is late by 0.05 s per s and its mates by nothing. The test for a node
    # whose ranks sit one to a group named the node 8 s after the onset without that check
    res = run(
        Layout(tp=8, pp=1, dp=4),
        Fault("slow_compute", "rank", ranks=(12,), factor=1.1, onset=24.308330921792578),
        rate=100.0,
        profile=UNSEEN_PROFILES["first_step~"],
        duration=60.0,
        seed=61206103,
    )
    assert not [r.key for r in res.reported if ":node:" in r.key]


def test_a_node_held_up_by_a_gc_pause_is_not_named_on_the_judgement_its_groups_kept(run) -> None:  # type: ignore[no-untyped-def]
    # heldout-two_stragglers-001 (tp8dp8, GC pauses, 30/s): a GC pause held node 3's tensor-
    # parallel group up at 21.5 s, and its data-parallel groups, with no fresh buckets for seconds
    # after it, kept that lateness as their last judgement. Judged on it, the test
    # for a node whose ranks sit one to a group named node 3 at 27.5 s, a second after its own
    # straggler's (rank 26, 1.3x) onset, and rank 26 was never named
    sc = next(s for s in build_suite("heldout") if s.name == "heldout-two_stragglers-001")
    res = run_scenario(sc)
    assert [r.key for r in res.false_suspects] == []
    assert None not in res.latency


def test_a_pipeline_stage_held_up_by_a_straggler_is_not_a_node_whose_ranks_sit_one_to_a_group() -> None:
    # tune-two_stragglers-007 (tp8pp4dp4 saving checkpoints, 10/s): behind the stragglers, node 7's
    # ranks, one stage of a pipeline, reached their data-parallel reduces late together. A stage's
    # node is left to the stage test: taken as a node whose ranks sit one to a group, node 7 was
    # named at 37 s
    sc = next(s for s in build_suite("tune") if s.name == "tune-two_stragglers-007")
    res = run_scenario(sc)
    assert [r.key for r in res.false_suspects] == []
    assert None not in res.latency


def test_a_straggler_that_starts_during_a_save_is_judged_with_the_buckets_before_it(run) -> None:  # type: ignore[no-untyped-def]
    # heldout-straggler-004 (tp2pp4dp4, 300/s, every kind of jitter, a 3 s save every 50 steps):
    # rank 19 slows to 2x at 30.9 s, while the job saves (27.7-31.7 s). After the save, its
    # slots were judged only once they had five buckets with ops after it (2 s of steps), and it
    # was named 4.1 s after its onset. A group that runs ops in nearly every bucket and went quiet
    # is judged over its newest buckets before the pause and after it together, as if the pause
    # had not been: named at 3.6 s
    res = run(
        Layout(tp=2, pp=4, dp=4),
        Fault("slow_compute", "rank", ranks=(19,), factor=2.0, onset=30.91851526053058),
        rate=300.0,
        profile=HELDOUT_PROFILES["everything+"],
        duration=38.0,
        seed=1020007,
    )
    assert [r.key for r in res.reported] == ["noncomm_slow:rank:19"]
    assert res.latency[0] is not None and res.latency[0] <= 3.6


def test_a_group_that_runs_in_bursts_is_not_judged_across_a_save(run) -> None:  # type: ignore[no-untyped-def]
    # unseen-slow_rnic-001 (tp4pp4dp2, 50/s, a 5 s save every 30 steps): rank 23's NIC slows 3x.
    # The data-parallel pairs run a burst of ops a step, with buckets between them empty. Judged
    # after a save over their newest buckets before it and after it (as a group that runs ops in
    # nearly every bucket is), their bursts' uneven lateness named node 0 at 46 s
    res = run(
        Layout(tp=4, pp=4, dp=2),
        Fault("slow_comm", "rnic", ranks=(23,), factor=3.0, onset=23.95759350816349),
        rate=50.0,
        profile=UNSEEN_PROFILES["checkpoint~"],
        duration=48.0,
        seed=3020818,
    )
    assert [r.key for r in res.reported] == ["comm_slow:rank:23"]


def test_a_straggler_far_over_its_line_counts_the_late_buckets_its_evidence_opens_on(run) -> None:  # type: ignore[no-untyped-def]
    # tune-straggler_flap-006 (tp2pp2dp8, 10/s, CPU noise and GC pauses): rank 30 turns 1.5x at
    # 29.1 s for 6 s at a time. Its evidence opened at six times its threshold, late in four of
    # its five buckets, yet counted only the newest bucket: 7 of the short hold's twice
    # ``cusum_h`` (10) for the second it was a root, then it dropped out of the roots for 1.5 s
    # and was named 5.9 s after its onset. Counting the three buckets its window's median stands
    # for when the evidence opens: named on the short hold, 2.9 s after it
    res = run(
        Layout(tp=2, pp=2, dp=8),
        Fault("slow_compute", "rank", ranks=(30,), factor=1.5, onset=29.079923887830038, flap=(6.0, 10.0)),
        rate=10.0,
        profile="gc",
        duration=40.0,
        seed=20306,
    )
    assert [r.key for r in res.reported] == ["noncomm_slow:rank:30"]
    assert res.latency[0] is not None and res.latency[0] <= 3.0


def test_a_straggler_whose_share_inside_ops_rose_with_everybody_elses_is_no_victim(run) -> None:  # type: ignore[no-untyped-def]
    # unseen-straggler-004 (tp4pp4dp2, 50/s, a slow first step): rank 20 turns 1.2x at 31.4 s and
    # costs the job 1.04x. Its share of time inside ops stayed 0.0-0.1 over its usual (learned low
    # in the job's first seconds, as every rank's was), so the victim test's line, (u - 0.5) times
    # its lateness of 0.03-0.05 s per s, about 0.001, excused it at every analysis: never named.
    # The ranks' shares where nobody is late drifted up 0.06-0.13 together; over that drift it is
    # a straggler at almost every analysis, and named
    res = run(
        Layout(tp=4, pp=4, dp=2),
        Fault("slow_compute", "rank", ranks=(20,), factor=1.2, onset=31.395589510529284),
        rate=50.0,
        profile=UNSEEN_PROFILES["first_step~"],
        duration=50.0,
        seed=3020021,
    )
    assert [r.key for r in res.reported] == ["noncomm_slow:rank:20"]


def test_a_stage_that_waits_on_a_slow_nic_is_not_named_over_the_drift(run) -> None:  # type: ignore[no-untyped-def]
    # fresh-slow_rnic-003 (tp2pp4dp4, 300/s, clusters of GC pauses): rank 29's NIC turns 3x slow
    # at 26.4 s. Rank 13, two stages up the same pipeline, is late by its waits there at about
    # its threshold, and over the ranks' common drift it was named at 48.5 s; while transfers are
    # slow the drift is not taken out
    res = run(
        TP2PP4DP4,
        Fault("slow_comm", "rnic", ranks=(29,), factor=3.0, onset=26.4374321014366),
        rate=300.0,
        profile=HELDOUT_PROFILES["gc+"],
        duration=50.0,
        seed=2020832,
    )
    assert not [r.key for r in res.reported if r.key.startswith("noncomm_slow")]
    assert all(lat is not None for lat in res.latency)


def test_a_job_that_runs_in_short_bursts_between_saves_is_judged_across_them(run) -> None:  # type: ignore[no-untyped-def]
    # unseen-straggler-000 (dp32, 50/s, every kind of jitter): the job saves for about 4 s after
    # every 2 s of steps, and rank 15 slows to 2x at 24.8 s, in a save (22-26 s). The group's
    # runs of steps fill five to seven of the window's ten buckets, never the eight that make it
    # one that runs ops often, so it was not judged across the saves: judged once it had five
    # buckets after the save, and named 4.2 s after the onset. Buckets with ops side by side
    # since the last pause count as a group that runs ops often: named at 3.2 s
    res = run(
        Layout(tp=1, pp=1, dp=32),
        Fault("slow_compute", "rank", ranks=(15,), factor=2.0, onset=24.78307365266923),
        rate=50.0,
        profile=UNSEEN_PROFILES["everything~"],
        duration=32.0,
        seed=3020017,
    )
    assert [r.key for r in res.reported] == ["noncomm_slow:rank:15"]
    assert res.latency[0] is not None and res.latency[0] <= 3.5


def test_a_slow_first_step_is_not_a_save_to_judge_across(run) -> None:  # type: ignore[no-untyped-def]
    # unseen-slow_link_and_straggler-002 (tp4pp4dp2, 200/s, a slow first step): the first step
    # left the groups quiet after a few buckets of ops side by side. Judged across that as across a
    # save, the straggler rank 21 (1.5x from 26.8 s, beside a 4x slow link between nodes 0 and 1)
    # was missed; bridged only once a slot's fluctuation is learned for half of ``noise_warm_s``,
    # it is named 7.7 s after its onset, as before short runs counted as running ops often
    res = run(
        Layout(tp=4, pp=4, dp=2),
        Fault("slow_comm", "link", nodes=(0, 1), factor=4.0, onset=23.79076070723002),
        Fault("slow_compute", "rank", ranks=(21,), factor=1.5, onset=26.79076070723002),
        rate=200.0,
        profile=UNSEEN_PROFILES["first_step~"],
        duration=40.0,
        seed=3020919,
    )
    assert "noncomm_slow:rank:21" in {r.key for r in res.reported}
    assert not res.false_suspects


def test_a_slow_node_whose_ranks_flicker_out_of_the_roots_is_not_also_named_as_one_of_them(run) -> None:  # type: ignore[no-untyped-def]
    # tp8dp4 at 10/s (each node one tensor-parallel group), node 3 1.5x slower: its eight ranks are
    # roots together at one analysis and none at the next. At 29.5 s rank 29 alone was left a
    # root, with no other root on its node, and was named as a rank half a second before its node
    # (``bench/probe_classes.py`` seed 8181). Node-mates that dropped out of the roots within
    # ``root_gap_s`` count as roots on its node, which makes a single rank wait ``mild_hold_s``
    res = run(
        Layout(tp=8, pp=1, dp=4),
        Fault("slow_compute", "node", nodes=(3,), factor=1.5, onset=23.96920712092523),
        rate=10.0,
        profile=UNSEEN_PROFILES["cpu_noise~"],
        duration=60.0,
        seed=8181202,
    )
    assert [r.key for r in res.reported] == ["noncomm_slow:node:node00003"]
    assert res.latency[0] is not None and res.latency[0] <= 7.0, res.latency


TP2PP4DP2 = Layout(tp=2, pp=4, dp=2)  # 16 ranks on 2 nodes: ranks 4 and 7 are stage 1, 12 and 15 stage 3


@pytest.mark.parametrize(
    ("profile", "first", "second", "onset", "seed"),
    [
        # ``bench/probe_classes.py --seed 61209``'s two_stragglers-002 (tp2pp4dp2 `gc~`, 10/s): rank
        # 7 slows to 1.5x, rank 15, two stages further down the same pipeline, to 1.3x five seconds
        # later. Rank 15 is late in its tensor-parallel group, but it also waits 0.1 of its time
        # more at its receives (the pipeline passes rank 7's delay along), and that rise in its
        # share inside ops excused it as a victim at every other analysis: never named in 30 s. Its
        # mate there waits as much along its own pipeline, so those waits are rank 7's doing
        pytest.param("gc~", 7, 15, 25.132237357684165, 61209502, id="excused-by-its-share-inside-ops"),
        # ``bench/probe_classes.py --seed 61208``'s two_stragglers-004 (tp2pp4dp2 `checkpoint~`, 10/s):
        # rank 4 (stage 1) 1.5x, rank 12 (stage 3 of the same pipeline) 1.3x. Rank 12 is late in
        # its tensor-parallel group by 0.15-0.2 s of the window and waits 0.3-0.45 s at its
        # receives: more than one and a half times its lateness, which excused it outright at
        # nearly every analysis, though its mate there (rank 13) waited 0.28-0.43 s at its own
        pytest.param("checkpoint~", 4, 12, 29.270020895814717, 61208504, id="excused-outright"),
    ],
)
def test_a_second_straggler_down_the_pipeline_of_a_reported_one_is_named(
    profile: str, first: int, second: int, onset: float, seed: int
) -> None:
    lay = TP2PP4DP2
    sc = _two_stragglers(lay, Workload.for_rate(10.0, lay), UNSEEN_PROFILES[profile], first, second, onset, 60.0, seed)
    res = run_scenario(sc)
    assert sorted(r.key for r in res.reported) == sorted([f"noncomm_slow:rank:{first}", f"noncomm_slow:rank:{second}"])
    assert res.latency[1] is not None and res.latency[1] <= 15.0, res.latency


def test_two_stragglers_of_one_pipeline_that_make_each_other_wait_are_both_named() -> None:
    # ``bench/probe_classes.py --seed 61206``'s two_stragglers-004 (tp2pp4dp2 `everything~`, 10/s):
    # rank 7 (stage 1) slows to 1.5x, rank 15 (stage 3 of the same pipeline) to 1.3x five seconds
    # later. With one microbatch every stage waits for all the others, so each waited at its
    # sends and receives behind the other, 0.3-0.9 s of the window against a lateness of 0.2-0.3
    # s in its tensor-parallel group, and was excused outright, though its mate there waited as
    # much along its own pipeline: rank 7 named 24.6 s after its onset, rank 15 never
    lay = TP2PP4DP2
    sc = _two_stragglers(
        lay, Workload.for_rate(10.0, lay), UNSEEN_PROFILES["everything~"], 7, 15, 23.874322423565864, 60.0, 61206504
    )
    res = run_scenario(sc)
    assert sorted(r.key for r in res.reported) == ["noncomm_slow:rank:15", "noncomm_slow:rank:7"]
    assert res.latency[0] is not None and res.latency[0] <= 12.0, res.latency


def test_a_stage_behind_a_second_straggler_keeps_its_waits_that_other_replicas_did_not_share() -> None:
    # unseen-two_stragglers-001 (tp8pp2dp4 `gc~`, 50/s): node 2, stage 0 of the replica whose stage
    # 1 holds the second straggler (rank 50, 1.3x), waits on it at its receives and reaches its
    # data-parallel reduces late. Its mates there are the other replicas' first stages: taking out
    # of its waits what they waited along their own pipelines as well (up to 0.23 s of the window)
    # left one more of its ranks short of the outright victim test at 29.0 s, with five of the eight
    # roots already, and node 2 was named
    sc = next(s for s in build_suite("unseen") if s.name == "unseen-two_stragglers-001")
    res = run_scenario(sc)
    assert [r.key for r in res.false_suspects] == []
    assert None not in res.latency


def test_the_next_stage_of_a_reported_straggler_is_still_its_victim_where_its_mates_did_not_wait(run) -> None:  # type: ignore[no-untyped-def]
    # unseen-straggler_flap-002 (tp4pp4dp2 `everything~`, 200/s): rank 20 (stage 2) flaps 1.5x
    # slow. Rank 28, the next stage of its pipeline, waits on it at its receives and so reaches
    # its data-parallel reduce late, where its mate (the other replica) waited on nobody. Its
    # pipeline waits explain that lateness: taken out of its share there as well, it was named
    # at 37 s
    res = run(
        Layout(tp=4, pp=4, dp=2),
        Fault("slow_compute", "rank", ranks=(20,), factor=1.5, onset=25.681068955463168, flap=(10.0, 6.0)),
        rate=200.0,
        profile=UNSEEN_PROFILES["everything~"],
        duration=60.0,
        seed=3020319,
    )
    assert [r.key for r in res.reported] == ["noncomm_slow:rank:20"], [r.key for r in res.reported]


def test_a_slow_stage_of_a_four_stage_pipeline_at_ten_ops_a_second_is_named(run) -> None:  # type: ignore[no-untyped-def]
    # ``bench/probe_classes.py --seed 61209``'s straggler_node-001 (tp4pp4dp2 `gc~`, 10/s): node 1,
    # stage 1 of both pipelines, slows to 1.2x. Each send and receive carries an op every two or
    # three 0.4 s buckets, never five in the window, and was never judged: the slow-stage test's
    # late sign read 0 while the node's share inside ops dropped 0.04-0.05 for 30 s
    res = run(
        Layout(tp=4, pp=4, dp=2),
        Fault("slow_compute", "node", nodes=(1,), factor=1.2, onset=23.467313308917703),
        rate=10.0,
        profile=UNSEEN_PROFILES["gc~"],
        duration=60.0,
        seed=61209201,
    )
    assert [r.key for r in res.reported] == ["noncomm_slow:node:node00001"], [r.key for r in res.reported]
    assert res.latency[0] is not None and res.latency[0] <= 20.0, res.latency


def test_a_stage_s_change_against_its_neighbour_restarts_only_once_both_are_known(run) -> None:  # type: ignore[no-untyped-def]
    # ``bench/probe_classes.py --seed 61207``'s straggler_node-006 (tp2pp4dp2 `everything~`, 100/s):
    # two nodes of two stages each, each the other's only pipeline neighbour, so each one's change
    # of share against its neighbour is the other's negated. After a save the nodes' shares come
    # back at different analyses; the one not yet back read 0 against the other's, the smoothed
    # change restarted from that (node 1 at +0.29 against node 0's -0.04), took ten seconds to
    # decay, and held back the slow stage it is (named 12.8 s after its onset, now 10.8 s)
    worst = [0.0]
    both = [0]

    def watch(now: float, det: JobDetector) -> None:
        zn = det.late.stage_zn
        if zn.shape[0] >= 2 and np.isfinite(zn[:2]).all():
            both[0] += 1
            worst[0] = max(worst[0], abs(float(zn[0] + zn[1])))

    res = run(
        TP2PP4DP2,
        Fault("slow_compute", "node", nodes=(1,), factor=1.5, onset=22.170023575960833),
        rate=100.0,
        profile=UNSEEN_PROFILES["everything~"],
        duration=60.0,
        seed=61207206,
        watch=watch,
    )
    assert both[0] >= 60, both  # read on both nodes for most of the job
    assert worst[0] < 1e-9, worst
    assert [r.key for r in res.reported] == ["noncomm_slow:node:node00001"], [r.key for r in res.reported]


@pytest.mark.xfail(
    strict=True,
    reason="a known false node (docs/decisions.md: a reported stage's pipeline victims across a save): "
    "each version that named no false node here named false ranks or came later elsewhere",
)
def test_a_reported_stage_s_victims_are_not_named_across_a_save(run) -> None:  # type: ignore[no-untyped-def]
    # ``bench/probe_classes.py --seed 61206``'s straggler_node-001 (tp4pp2dp4 `everything~`, 100/s):
    # node 1 (stage 0 of replicas 2 and 3) slows 1.5x from 23.6 s and is named; node 3, their
    # stage 1, waits on it at its receives and reaches its data-parallel reduces late, which the
    # victim tests excuse while ops run. A save runs from 35.1 s to 41.2 s. During it no op comes
    # in, yet what the victim tests read moves (the op rates decay over the pause), and node 3's
    # ranks turn roots 1.8 s in; the node is named at 37.5 s. Kept from turning roots with no new
    # op, they turn roots after the save instead: their receives' usual wait, learned over windows
    # the group ran through, is taken whole from windows holding a second of ops, so their waits
    # read 0 (named at 43.5 s). A strict xfail: it fails here once the false node is gone
    res = run(
        Layout(tp=4, pp=2, dp=4),
        Fault("slow_compute", "node", nodes=(1,), factor=1.5, onset=23.554110889098965),
        rate=100.0,
        profile=UNSEEN_PROFILES["everything~"],
        duration=60.0,
        seed=61206201,
    )
    assert res.latency[0] is not None and res.latency[0] <= 5.0, res.latency
    assert [r.key for r in res.reported] == ["noncomm_slow:node:node00001"], [r.key for r in res.reported]


def test_a_slow_stage_after_a_slow_first_step_is_named(run) -> None:  # type: ignore[no-untyped-def]
    # ``bench/probe_classes.py --seed 61208``'s straggler_node-005 (tp2pp2dp4 `first_step~`, 100/s):
    # node 0, the first stage of every pipeline, slows to 1.1x 27.6 s in, after a first step of
    # about 8 s. The slow-stage test's usual share inside ops was learned from windows that still
    # held that step's long waits (1.35-1.48 of wall-clock against a steady 0.5); the two nodes
    # then read 0.07-0.12 apart for the rest of the job, the spread learned from it lifted the
    # line from its floor of 0.02 to 0.15, and the stage was never named. Now, with the job's
    # median rank far under that usual, the test's usuals start again once the window it reads
    # has left the first step (``DetectorConfig.stage_restart``): the nodes read together before
    # the onset, and the stage is named
    restarts: list[float] = []
    apart: list[float] = []

    def watch(now: float, det: JobDetector) -> None:
        if det.late.stage_restarted:
            restarts.append(now)
        if 20.0 <= now < 27.5 and det.late.stage_z.shape[0] >= 2:
            apart.append(float(np.nanmax(np.abs(det.late.stage_z[:2]))))

    res = run(
        Layout(tp=2, pp=2, dp=4),
        Fault("slow_compute", "node", nodes=(0,), factor=1.1, onset=27.614175378382846),
        rate=100.0,
        profile=UNSEEN_PROFILES["first_step~"],
        duration=60.0,
        seed=61208205,
        watch=watch,
    )
    assert len(restarts) == 1 and 10.0 <= restarts[0] <= 25.0, restarts  # once, after the first step
    assert apart and max(apart) < 0.03, max(apart)  # the nodes read together before the onset
    assert [r.key for r in res.reported] == ["noncomm_slow:node:node00000"], [r.key for r in res.reported]
    assert res.latency[0] is not None and res.latency[0] <= 15.0, res.latency


def test_the_stage_test_does_not_start_again_in_a_healthy_job_with_gc_pauses(run) -> None:  # type: ignore[no-untyped-def]
    # the restart above is for a level the whole job has left: GC pauses move a node's ranks by
    # 0.1-0.2 of wall-clock at a time, the job's median rank by 0.13 at most (``bench/probe_healthy.py``
    # tp4pp2dp4 `gc+`), and in such a job the usuals are never learned again
    restarts: list[float] = []

    def watch(now: float, det: JobDetector) -> None:
        if det.late.stage_restarted:
            restarts.append(now)

    res = run(
        Layout(tp=4, pp=2, dp=4),
        rate=30.0,
        profile=dataclasses.replace(PROFILES["gc"], name="gc+", gc_rate=0.08, gc_s=0.3),
        duration=60.0,
        seed=30001,
        watch=watch,
    )
    assert not restarts, restarts
    assert not res.reported, [r.key for r in res.reported]


def test_a_wait_before_a_straggler_s_onset_does_not_excuse_it(run) -> None:  # type: ignore[no-untyped-def]
    # ``bench/probe_classes.py --seed 61207``'s straggler_ends-002 (tp8dp4 `gc~`, 10/s): rank 9
    # slows to 1.5x 27.2 s in. Two seconds before, a GC pause of rank 17 held its data-parallel
    # reduce, and rank 9 waited there 0.54 s, inside the 4 s window its first lateness was judged
    # over: against 0.27-0.33 s of lateness in its tensor-parallel group, it passed as the victim
    # of that wait (outright: waiting elsewhere 1.5 times its lateness) for a second, and was
    # named 3.3 s after its onset. A wait before the last op it was on time for cannot have
    # made it late: counted from there, it is a root as soon as it is late, and named within 3 s
    hot: list[float] = []
    roots: list[float] = []

    def watch(now: float, det: JobDetector) -> None:
        topo, n = det.topo, det.topo.n_slots
        if now >= 27.0 and det.late.hot[:n][topo.slot_rank[:n] == 9].any():
            hot.append(now)
        if 9 in det.roots:
            roots.append(now)

    res = run(
        Layout(tp=8, dp=4),
        Fault("slow_compute", "rank", ranks=(9,), factor=1.5, onset=27.226411417384263, duration=15.0),
        rate=10.0,
        profile=UNSEEN_PROFILES["gc~"],
        duration=60.0,
        seed=61207402,
        watch=watch,
    )
    assert hot and roots and roots[0] == hot[0], (hot[:3], roots[:3])  # a root from its first late analysis
    assert [r.key for r in res.reported] == ["noncomm_slow:rank:9"], [r.key for r in res.reported]
    assert res.latency[0] is not None and res.latency[0] <= 3.0, res.latency


def _link_then_straggler(run, onset: float, rank: int, profile: str, seed: int):  # type: ignore[no-untyped-def]
    # as ``bench/probe_classes.py`` lays out slow_link_and_straggler in tp4pp4dp2 at 100/s: the
    # link between nodes 1 and 2 4x slow, and three seconds later one rank 1.5x
    return run(
        Layout(tp=4, pp=4, dp=2),
        Fault("slow_comm", "link", nodes=(1, 2), factor=4.0, onset=onset),
        Fault("slow_compute", "rank", ranks=(rank,), factor=1.5, onset=onset + 3.0),
        rate=100.0,
        profile=UNSEEN_PROFILES[profile],
        duration=60.0,
        seed=seed,
    )


def test_a_straggler_upstream_of_a_slow_link_is_named(run) -> None:  # type: ignore[no-untyped-def]
    # ``bench/probe_classes.py --seed 61206``'s slow_link_and_straggler-002 (tp4pp4dp2
    # `first_step~`, 100/s): the link between nodes 1 and 2 slows 4x, and three seconds later rank
    # 5 (node 0, the pipelines' first stage) slows to 1.5x. Rank 5 waits at its receives on the
    # link's delay, 0.05-0.09 of its time over its usual, and was excused as a victim throughout;
    # its tensor-parallel mates wait there as much
    res = _link_then_straggler(run, 23.839455918900963, 5, "first_step~", 61206902)
    slow = sorted(r.key for r in res.reported if r.kind == "noncomm_slow")
    assert slow == ["noncomm_slow:rank:5"], [r.key for r in res.reported]
    assert all(x is not None for x in res.latency), res.latency


def test_a_stage_whose_pipeline_waited_on_a_slow_link_more_than_its_mates_is_not_named(run) -> None:  # type: ignore[no-untyped-def]
    # ``bench/probe_classes.py --seed 61207``'s slow_link_and_straggler-004 (tp4pp4dp2
    # `checkpoint~`, 100/s): the link between nodes 1 and 2 slows 4x, then rank 24 to 1.5x. Ranks
    # 1-3 (stage 0) wait at their receives on the link, more than their data-parallel mates (the
    # other replica's stage 0) do, and so reach that reduce late: those waits are what made them
    # late. Taken out of their victim test whole, not only as far as their mates shared them,
    # node 0 was named at 46.5 s
    res = _link_then_straggler(run, 25.017993491804507, 24, "checkpoint~", 61207904)
    slow = {r.key for r in res.reported if r.kind == "noncomm_slow"}
    assert slow <= {"noncomm_slow:rank:24"}, [r.key for r in res.reported]
    assert res.latency[0] is not None, res.latency


def test_a_middle_stage_straggler_whose_receive_envelope_fell_late_is_named(run) -> None:  # type: ignore[no-untyped-def]
    # ``bench/probe_classes.py --seed 61208``'s straggler-004 (tp4pp4dp2 `first_step~`, 100/s): rank
    # 17, the third stage of one pipeline, slows to 1.5x. Its receive from rank 9 had a per-op
    # envelope still falling from the slow first step (6 ms, its mates' 1.3 ms) when its fault froze
    # what it learns, and the usual excess learned over that envelope lagged the fall: its normal
    # waits there read as 0.4 s in 4 s of waiting, its mates' none, and the victim test excused it
    # throughout. Read at the envelope as it is now, the usual shows no such wait
    res = run(
        Layout(tp=4, pp=4, dp=2),
        Fault("slow_compute", "rank", ranks=(17,), factor=1.5, onset=24.515560873324397),
        rate=100.0,
        profile=UNSEEN_PROFILES["first_step~"],
        duration=60.0,
        seed=61208004,
    )
    assert [r.key for r in res.reported] == ["noncomm_slow:rank:17"], [r.key for r in res.reported]
    assert res.latency[0] is not None and res.latency[0] <= 12.0, res.latency
