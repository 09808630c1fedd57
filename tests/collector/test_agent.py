"""``rankwatch agent`` as a real process between ranks and a real collector.

Ranks (threads posting real batches, and once a real torchrun job) send to the agent; the agent
must merge them into fewer requests, give each rank its own answer and commands, keep tokens and
per-rank errors per rank, and answer 503 when the collector is gone.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from support import BIN, SCRIPTS, Service, clean_env, free_port, make_body, make_header, start_service

from rankwatch.wire import CONTENT_TYPE

RANKS = 8


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[Service]:
    env = clean_env(RANKWATCH_INGEST_TOKENS="rank-token", RANKWATCH_ADMIN_TOKENS="admin-token")
    svc = start_service(tmp_path, env=env)
    svc.headers = {"Authorization": "Bearer admin-token"}
    yield svc
    svc.stop()


@pytest.fixture
def agent(tmp_path: Path, collector: Service) -> Iterator[str]:
    port = free_port()
    log = tmp_path / "agent.log"
    cmd = [str(BIN / "rankwatch"), "agent", "--port", str(port), "--upstream", collector.url, "--linger-ms", "300"]
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=clean_env(), stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        assert proc.poll() is None, log.read_text()
        try:
            if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)
    yield url
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=20)


def _post(url: str, body: bytes, token: str | None = "rank-token") -> httpx.Response:
    headers = {"Content-Type": CONTENT_TYPE}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return httpx.post(url + "/ingest", content=body, headers=headers, timeout=30)


def _round(url: str, batch: int, bodies: dict[int, bytes] | None = None, tokens: dict[int, str] | None = None) -> list:
    """Every rank posts its batch at about the same time, as ranks flushing each second do."""

    def one(rank: int) -> httpx.Response:
        header = make_header(rank=rank, world=RANKS, batch=batch, entered=3 * batch + 3)
        body = (bodies or {}).get(rank) or make_body(header, first_seq=3 * batch + 1)
        return _post(url, body, (tokens or {}).get(rank, "rank-token"))

    with ThreadPoolExecutor(RANKS) as pool:
        return list(pool.map(one, range(RANKS)))


def test_the_agent_merges_ranks_and_answers_each(agent: str, collector: Service) -> None:
    replies = _round(agent, 0)
    assert [r.status_code for r in replies] == [200] * RANKS
    assert all(r.json() == {"accepted": 3, "duplicate": False, "commands": []} for r in replies)
    health = httpx.get(agent + "/healthz").json()
    assert health["batches"] == RANKS and health["requests"] < RANKS  # merged into fewer requests
    job = collector.job("job-a")
    assert job is not None and [r["ops"] for r in job["ranks"]] == [3] * RANKS
    # a command for rank 5 comes back to rank 5 only
    r = httpx.post(
        collector.url + "/jobs/job-a/commands",
        json={"type": "dump_flight_recorder", "ranks": [5]},
        headers=collector.headers,
    )
    assert r.status_code == 202
    replies = _round(agent, 1)
    commands = {rank: r.json()["commands"] for rank, r in enumerate(replies)}
    assert [c["type"] for c in commands.pop(5)] == ["dump_flight_recorder"]
    assert all(c == [] for c in commands.values())
    # a replayed batch is still a duplicate per rank; a malformed one and a wrong token fail alone
    bad = {2: make_body(make_header(rank=2, world=RANKS, batch=2, entered=1), n=3)}  # seq ahead of 'entered'
    replies = _round(agent, 2, bodies=bad, tokens={6: "not-a-token"})
    status = [r.status_code for r in replies]
    assert status == [200, 200, 400, 200, 200, 200, 401, 200], [r.text for r in replies]
    assert "ahead of its group's 'entered'" in replies[2].json()["detail"]
    assert _post(agent, make_body(make_header(rank=0, world=RANKS, batch=2, entered=9), first_seq=7)).json()[
        "duplicate"
    ]


def test_the_agent_answers_503_without_a_collector(agent: str, collector: Service) -> None:
    collector.stop(signal.SIGKILL)
    r = _post(agent, make_body(make_header(world=RANKS)))
    assert r.status_code == 503 and "retry" in r.json()["detail"]
    r = httpx.post(agent + "/ingest", content=b"x", headers={"Content-Type": "application/json"})
    assert r.status_code == 415


@pytest.mark.torchrun
def test_a_torchrun_job_through_the_agent(agent: str, collector: Service, run_torchrun: Any) -> None:
    host = agent.removeprefix("http://")
    env = clean_env(RANKWATCH=f"http://rank-token@{host}", RANKWATCH_JOB="via-agent", RANKWATCH_FLUSH_S="0.25")
    run = run_torchrun(SCRIPTS / "loop.py", "20", "0.02", "out", nproc=2, env=env)
    assert run.returncode == 0, run.output[-2000:]
    job = collector.wait_job("via-agent", lambda j: [r["state"] for r in j["ranks"]] == ["goodbye", "goodbye"])
    assert all(r["ops"] >= 20 for r in job["ranks"])  # every all_reduce of both ranks arrived
