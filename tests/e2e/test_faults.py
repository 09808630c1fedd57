"""Faults in real jobs, found by the real service: two torchrun agents stand in for two nodes
(in raw mode, and at the end in block mode).

Each test launches nodeA (ranks 0, 1) and nodeB (ranks 2, 3) as two torchrun agents with a
static rendezvous on loopback, breaks one rank or node — through ``RANKWATCH_INJECT``, a training
loop that is slow on one rank, or from outside with SIGSTOP — and checks that the service names
the right suspect at the right level, and that a healthy run names none.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support import SCRIPTS, Service, clean_env, free_port, kill_tree, start_agent

pytestmark = pytest.mark.torchrun


class TwoNodes:
    """Two torchrun agents, nodeA and nodeB, 2 ranks each, running ``loop.py``."""

    def __init__(self, tmp: Path, service: Service, job: str, loop_args: list[str], **env: str) -> None:
        (tmp / "out").mkdir(exist_ok=True)
        port = free_port()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs = []
        for node_rank, node in enumerate(("nodeA", "nodeB")):
            e = clean_env(RANKWATCH=service.url, RANKWATCH_JOB=job, RANKWATCH_NODE=node, RANKWATCH_FLUSH_S="0.5")
            e.update(env)
            cmd = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes=2",
                f"--node-rank={node_rank}",
                "--nproc-per-node=2",
                "--master-addr=127.0.0.1",
                f"--master-port={port}",
                str(SCRIPTS / "loop.py"),
                *loop_args,
            ]
            log = open(tmp / f"{node}.log", "wb")
            self.logs.append(log)
            self.procs.append(
                subprocess.Popen(cmd, cwd=tmp, env=e, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            )

    def wait(self, timeout: float = 240) -> list[int]:
        return [p.wait(timeout=timeout) for p in self.procs]

    def stop(self) -> None:
        for p in self.procs:
            kill_tree(p)
        for log in self.logs:
            log.close()


def _suspects(service: Service, job: str) -> list[dict[str, Any]]:
    return list(service.get("/suspects", job_id=job))


def _wait_suspect(
    service: Service, job: str, pred: Callable[[dict[str, Any]], bool], timeout: float = 60
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    seen: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        seen = _suspects(service, job)
        for s in seen:
            if pred(s):
                return s
        time.sleep(0.5)
    raise AssertionError(f"no matching suspect within {timeout}s; suspects: {seen}")


def _rank_pid(service: Service, job: str, rank: int) -> int:
    info = service.wait_job(job, lambda j: any(r["rank"] == rank for r in j["ranks"]), timeout=60)
    return int(next(r["pid"] for r in info["ranks"] if r["rank"] == rank))


def test_healthy_job_has_no_suspect(service: Service, tmp_path: Path) -> None:
    job = "healthy"
    nodes = TwoNodes(tmp_path, service, job, ["300", "0.03", "out"])
    try:
        assert nodes.wait() == [0, 0]
    finally:
        nodes.stop()
    service.wait_job(job, lambda j: len(j["ranks"]) == 4 and all(r["state"] == "goodbye" for r in j["ranks"]))
    time.sleep(2)
    assert _suspects(service, job) == []


def test_slow_rank_is_a_noncomm_straggler(service: Service, tmp_path: Path) -> None:
    job = "slow-rank"
    nodes = TwoNodes(tmp_path, service, job, ["400", "0.03", "out"], RANKWATCH_INJECT="slow:rank=3,delay=0.03,after=3")
    try:
        s = _wait_suspect(service, job, lambda s: s["kind"] == "noncomm_slow")
        assert (s["level"], s["ranks"], s["nodes"]) == ("rank", [3], ["nodeB"]), s
        assert s["slowdown"] is not None and 1.3 < s["slowdown"] < 2.5, s  # ~30 ms of ~33 ms steps, plus ~30 ms waiting
        assert s["detection_latency_s"] <= 10, s
    finally:
        nodes.stop()
    assert len([x for x in _suspects(service, job) if x["kind"] == "noncomm_slow"]) == 1


def test_slow_training_loop_on_one_rank(service: Service, tmp_path: Path) -> None:
    job = "slow-loop"
    nodes = TwoNodes(tmp_path, service, job, ["400", "0.03", "out", "1", "0.04"])  # no help from rankwatch
    try:
        s = _wait_suspect(service, job, lambda s: s["kind"] == "noncomm_slow")
        assert (s["level"], s["ranks"]) == ("rank", [1]), s
    finally:
        nodes.stop()


def test_slow_node(service: Service, tmp_path: Path) -> None:
    job = "slow-node"
    nodes = TwoNodes(
        tmp_path, service, job, ["400", "0.03", "out"], RANKWATCH_INJECT="slow:node=nodeB,delay=0.03,after=3"
    )
    try:
        s = _wait_suspect(service, job, lambda s: s["kind"] == "noncomm_slow")
        assert (s["level"], s["nodes"], sorted(s["ranks"])) == ("node", ["nodeB"], [2, 3]), s
    finally:
        nodes.stop()


def test_stalled_rank_is_a_noncomm_hang_with_its_stack_and_flight_recorder(service: Service, tmp_path: Path) -> None:
    job = "hang"
    # the stall comes after ~15 s of training: long enough for the group to have a history of
    # sub-second collectives (a hang during start-up waits for hang_warm_floor_s, docs/detector.md)
    nodes = TwoNodes(tmp_path, service, job, ["3000", "0.02", "out"], RANKWATCH_INJECT="stall:rank=2,seq=700")
    try:
        s = _wait_suspect(service, job, lambda s: s["kind"] == "noncomm_hang", timeout=90)
        assert s["ranks"] == [2] and s["level"] == "rank", s
        assert s["slowdown"] is None  # stopped
        assert s["detection_latency_s"] <= 15, s  # from the moment the others entered op 700
        detail = service.get(f"/suspects/{s['id']}")
        assert "loop.py" in str(detail["evidence"]), detail["evidence"]  # the line the culprit is stuck on
        deadline = time.monotonic() + 30
        fr: dict[str, Any] = {}
        while time.monotonic() < deadline and not fr.get("groups"):
            time.sleep(1)
            fr = service.get(f"/suspects/{s['id']}/flight-recorder")
        world = fr["groups"]["0"]
        assert world["first_unmatched"] == 700 and world["missing_ranks"] == [2], world
    finally:
        nodes.stop()


def test_sigstopped_rank_is_dead(service: Service, tmp_path: Path) -> None:
    job = "sigstop"
    nodes = TwoNodes(tmp_path, service, job, ["2000", "0.02", "out"])
    try:
        pid = _rank_pid(service, job, 1)
        time.sleep(3)
        os.kill(pid, signal.SIGSTOP)
        s = _wait_suspect(service, job, lambda s: s["kind"] == "rank_dead", timeout=60)
        assert s["ranks"] == [1], s
        others = [x for x in _suspects(service, job) if x["status"] == "active" and x["id"] != s["id"]]
        assert not [x for x in others if set(x["ranks"]) & {0, 2, 3}], others  # the waiting ranks are not blamed
        os.kill(pid, signal.SIGCONT)
    finally:
        nodes.stop()


def test_first_casualty_of_a_crash(service: Service, tmp_path: Path) -> None:
    job = "crash"
    nodes = TwoNodes(tmp_path, service, job, ["2000", "0.02", "out"], RANKWATCH_INJECT="crash:rank=2,seq=80")
    try:
        rcs = nodes.wait(timeout=120)
        assert any(rc != 0 for rc in rcs)
        s = _wait_suspect(service, job, lambda s: s["kind"] == "rank_dead", timeout=60)
        assert s["ranks"] == [2], s
        time.sleep(2)
        blamed = {r for x in _suspects(service, job) for r in x["ranks"]}
        assert blamed == {2}, _suspects(service, job)
    finally:
        nodes.stop()


# -- block mode: the ranks ship block summaries (RANKWATCH_WIRE_MODE=blocks) instead of records ------
BLOCKS = {"RANKWATCH_WIRE_MODE": "blocks"}


def test_block_mode_job_groups_and_progress(service: Service, tmp_path: Path) -> None:
    job = "blocks-healthy"
    steps = 200
    nodes = TwoNodes(tmp_path, service, job, [str(steps), "0.02", "out"], **BLOCKS)
    try:
        assert nodes.wait() == [0, 0]
    finally:
        nodes.stop()
    info: dict[str, Any] = service.wait_job(
        job, lambda j: len(j["ranks"]) == 4 and all(r["state"] == "goodbye" for r in j["ranks"])
    )
    assert sorted(r["rank"] for r in info["ranks"]) == [0, 1, 2, 3]
    assert {r["node"] for r in info["ranks"]} == {"nodeA", "nodeB"}
    world = next(g for g in info["groups"] if g["ranks"] == [0, 1, 2, 3])
    assert world["block_seqs"] is not None and world["block_seqs"] > 1  # the ranks sent blocks
    assert world["last_seq"] >= steps  # every step's all-reduce (and the start-up collectives)
    assert world["op_counts"].get("all_reduce", 0) >= 4 * steps  # every rank's, none lost in blocks
    for r in info["ranks"]:
        assert r["ops"] >= steps and r["drops"] == 0, r
    time.sleep(2)
    assert _suspects(service, job) == []


def test_straggler_is_found_in_block_mode(service: Service, tmp_path: Path) -> None:
    job = "blocks-slow-rank"
    nodes = TwoNodes(
        tmp_path, service, job, ["400", "0.03", "out"], RANKWATCH_INJECT="slow:rank=1,delay=0.03,after=3", **BLOCKS
    )
    try:
        s = _wait_suspect(service, job, lambda s: s["kind"] == "noncomm_slow")
        assert (s["level"], s["ranks"], s["nodes"]) == ("rank", [1], ["nodeA"]), s
        assert s["slowdown"] is not None and 1.3 < s["slowdown"] < 2.5, s
        info = service.job(job)
        assert info is not None and all(g["block_seqs"] for g in info["groups"] if g["ops"]), info["groups"]
    finally:
        nodes.stop()
    assert len([x for x in _suspects(service, job) if x["kind"] == "noncomm_slow"]) == 1


def test_straggler_is_found_in_block_mode_through_a_merging_agent(service: Service, tmp_path: Path) -> None:
    """Both nodes' ranks send to one ``rankwatch agent`` (a rack-level agent), which merges their
    block bodies into one body per flush; the straggler is still found, on its rank and node."""
    job = "blocks-agent-slow-rank"
    agent = start_agent(tmp_path, service.url)
    nodes = TwoNodes(
        tmp_path,
        service,
        job,
        ["400", "0.03", "out"],
        RANKWATCH=agent.url,
        RANKWATCH_INJECT="slow:rank=2,delay=0.03,after=3",
        **BLOCKS,
    )
    try:
        s = _wait_suspect(service, job, lambda s: s["kind"] == "noncomm_slow")
        assert (s["level"], s["ranks"], s["nodes"]) == ("rank", [2], ["nodeB"]), s
        assert s["slowdown"] is not None and 1.3 < s["slowdown"] < 2.5, s
        health = agent.health()
        assert health["merged"] > 0 and health["requests"] < health["batches"], health  # bodies were merged
        info = service.job(job)
        assert info is not None and sorted(r["rank"] for r in info["ranks"]) == [0, 1, 2, 3]
    finally:
        nodes.stop()
        agent.stop()
    assert len([x for x in _suspects(service, job) if x["kind"] == "noncomm_slow"]) == 1


def test_stalled_rank_is_a_noncomm_hang_in_block_mode(service: Service, tmp_path: Path) -> None:
    job = "blocks-hang"
    nodes = TwoNodes(tmp_path, service, job, ["3000", "0.02", "out"], RANKWATCH_INJECT="stall:rank=2,seq=700", **BLOCKS)
    try:
        s = _wait_suspect(service, job, lambda s: s["kind"] == "noncomm_hang", timeout=90)
        assert s["ranks"] == [2] and s["level"] == "rank", s
        assert s["detection_latency_s"] <= 15, s
        detail = service.get(f"/suspects/{s['id']}")
        assert "loop.py" in str(detail["evidence"]), detail["evidence"]  # the stack still travels
    finally:
        nodes.stop()
