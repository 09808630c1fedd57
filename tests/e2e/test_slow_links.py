"""Real slow NICs and links between real hosts (network namespaces), found as communication faults.

Four hosts h0..h3, one rank each, laid out 2 x 2 (rows {0,1} {2,3}, columns {0,2} {1,3}, and the
world), so that every rank sits in several groups: a slow NIC makes every group through its host
slow, a slow link only the groups that use it, and intersecting slow and healthy groups names the
node or the link. The service runs in the root namespace on the hosts' bridge, with tokens (it
refuses a non-loopback address without them). Needs root for ``ip netns`` and ``tc``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from netns import BRIDGE_IP, Hosts, can_make_hosts
from support import SCRIPTS, Service, clean_env, free_port, kill_tree, start_service

pytestmark = [
    pytest.mark.torchrun,
    pytest.mark.skipif(
        not can_make_hosts(), reason="needs root for network namespaces (the test command runs as root)"
    ),
]

TOKENS = {"RANKWATCH_INGEST_TOKENS": "ingest-t0k", "RANKWATCH_READ_TOKENS": "read-t0k"}


@pytest.fixture
def hosts() -> Iterator[Hosts]:
    with Hosts(4) as h:
        yield h


@pytest.fixture
def bridge_service(hosts: Hosts, tmp_path: Path) -> Iterator[Service]:
    svc = start_service(tmp_path, "--host", BRIDGE_IP, env=clean_env(**TOKENS), url_host=BRIDGE_IP)
    svc.headers = {"Authorization": f"Bearer {TOKENS['RANKWATCH_READ_TOKENS']}"}
    yield svc
    svc.stop()


def _launch(
    hosts: Hosts, svc: Service, tmp: Path, job: str, steps: int = 3000, mib: float = 0.5
) -> list[subprocess.Popen[bytes]]:
    (tmp / "out").mkdir(exist_ok=True)
    port = free_port()
    url = svc.url.replace("http://", f"http://{TOKENS['RANKWATCH_INGEST_TOKENS']}@")
    procs = []
    for i in range(hosts.n):
        env = clean_env(
            RANKWATCH=url,
            RANKWATCH_JOB=job,
            RANKWATCH_NODE=f"h{i}",
            RANKWATCH_FLUSH_S="0.5",
            GLOO_SOCKET_IFNAME=hosts.veth_host(i),
        )
        cmd = [
            *hosts.prefix(i),
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nnodes={hosts.n}",
            f"--node-rank={i}",
            "--nproc-per-node=1",
            f"--master-addr={hosts.ip(0)}",
            f"--master-port={port}",
            str(SCRIPTS / "comm_job.py"),
            str(steps),
            str(mib),
            "out",
        ]
        log = open(tmp / f"h{i}.log", "wb")
        procs.append(
            subprocess.Popen(cmd, cwd=tmp, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        )
    return procs


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        kill_tree(p)


def _wait(
    svc: Service, job: str, kind: str, timeout: float = 90, pred: Callable[[dict[str, Any]], bool] | None = None
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    seen: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        seen = svc.get("/suspects", job_id=job)
        hits = [s for s in seen if s["kind"] == kind and s["status"] == "active" and (pred is None or pred(s))]
        if hits:
            return hits[0]
        time.sleep(1)
    raise AssertionError(f"no active {kind} suspect in {timeout}s; suspects: {seen}")


def _running(svc: Service, job: str, ops: int) -> None:
    svc.wait_job(job, lambda j: len(j["ranks"]) == 4 and min(r["ops"] for r in j["ranks"]) >= ops, timeout=120)


def test_healthy_hosts_have_no_suspect(hosts: Hosts, bridge_service: Service, tmp_path: Path) -> None:
    procs = _launch(hosts, bridge_service, tmp_path, "links-healthy", steps=200)
    try:
        assert [p.wait(timeout=240) for p in procs] == [0, 0, 0, 0]
    finally:
        _stop(procs)
    time.sleep(2)
    assert bridge_service.get("/suspects", job_id="links-healthy") == []


def test_slow_nic_is_a_comm_slow_node(hosts: Hosts, bridge_service: Service, tmp_path: Path) -> None:
    job = "links-nic"
    procs = _launch(hosts, bridge_service, tmp_path, job)
    try:
        _running(bridge_service, job, 60)
        hosts.slow_nic(3)
        # Known limit (docs/detector.md, "Limits"): a slow NIC is often named as the node, but
        # sometimes as one of its links, when h3's channels do not all look slow at once on this
        # loaded 2-core machine. What must hold: a comm_slow that blames h3, on every suspect.
        s = _wait(bridge_service, job, "comm_slow")
        assert "h3" in s["nodes"] and s["level"] in ("node", "link"), s
        if s["level"] == "node":
            assert s["nodes"] == ["h3"], s
        time.sleep(3)
        active = [x for x in bridge_service.get("/suspects", job_id=job) if x["status"] == "active"]
        assert active and all(x["kind"] == "comm_slow" and "h3" in x["nodes"] for x in active), json.dumps(active)
        assert not [x for x in bridge_service.get("/suspects", job_id=job) if x["kind"] == "noncomm_slow"]
    finally:
        _stop(procs)


def test_slow_link_is_a_comm_slow_link(hosts: Hosts, bridge_service: Service, tmp_path: Path) -> None:
    job = "links-link"
    procs = _launch(hosts, bridge_service, tmp_path, job)
    try:
        _running(bridge_service, job, 60)
        hosts.slow_link(1, 3)
        s = _wait(bridge_service, job, "comm_slow")
        assert s["level"] == "link" and sorted(s["link"]) == ["h1", "h3"], json.dumps(s)
    finally:
        _stop(procs)


def test_blocked_link_is_a_comm_hang(hosts: Hosts, bridge_service: Service, tmp_path: Path) -> None:
    job = "links-hang"
    procs = _launch(hosts, bridge_service, tmp_path, job)
    try:
        _running(bridge_service, job, 60)
        hosts.slow_link(1, 3, rate="8bit")  # effectively nothing gets through
        s = _wait(bridge_service, job, "comm_hang", timeout=90)
        assert s["level"] in ("link", "node"), s
        if s["level"] == "link":
            assert sorted(s["link"]) == ["h1", "h3"], s
        else:
            assert set(s["nodes"]) <= {"h1", "h3"}, s
    finally:
        _stop(procs)
