"""``rankwatch agent`` as a real process between ranks and a real collector.

Ranks (threads posting real batches, and once a real torchrun job) send to the agent; the agent
must merge them into fewer requests, give each rank its own answer and commands, keep tokens and
per-rank errors per rank, and answer 503 when the collector is gone.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from support import (
    BIN,
    SCRIPTS,
    Agent,
    Service,
    clean_env,
    free_port,
    make_body,
    make_header,
    start_agent,
    start_service,
)

from rankwatch.blockwire import BLOCK_CONTENT_TYPE, decode_blocks, encode_blocks, rank_body
from rankwatch.collector.agent import Agent as Agent_
from rankwatch.env import CollectorURL
from rankwatch.errors import WireError
from rankwatch.multibatch import MULTI_CONTENT_TYPE, decode_multi
from rankwatch.sim import PROFILES, Layout, Scenario, Workload, deliveries, from_batch
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


# -- block mode: the agent merges ranks' block bodies into one body per job ---------------------------
BLOCK_JOB = "sim-blk"


@pytest.fixture
def bound_collector(tmp_path: Path) -> Iterator[Service]:
    tokens = tmp_path / "tokens"
    tokens.write_text(
        f"ingest rank-token\ningest job-token job={BLOCK_JOB}\ningest wrong-token job=other-job\nadmin admin-token\n"
    )
    svc = start_service(tmp_path, env=clean_env(RANKWATCH_TOKENS_FILE=str(tokens)))
    svc.headers = {"Authorization": "Bearer admin-token"}
    yield svc
    svc.stop()


@pytest.fixture
def block_agent(tmp_path: Path, bound_collector: Service) -> Iterator[Agent]:
    agent = start_agent(tmp_path, bound_collector.url, "--linger-ms", "300")
    yield agent
    agent.stop()


def _block_rounds() -> list[list[bytes]]:
    """Each send round of an 8-rank job (tp 2, pp 2, dp 2): every rank's own block body, by rank."""
    lay = Layout(tp=2, pp=2, dp=2)
    sc = Scenario(
        "blk", layout=lay, workload=Workload.for_rate(100, lay), profile=PROFILES["quiet"], duration=4.0, seed=2
    )
    by_batch: dict[int, dict[int, bytes]] = {}
    for d in deliveries(sc):
        h = d.batch.header
        bb = from_batch(h, d.batch.records, np.full(len(h["groups"]), 8))
        for g in h["groups"]:
            g["block_seqs"] = 8
        by_batch.setdefault(h["batch"], {})[h["rank"]] = rank_body(h, bb.blocks)
    return [[r[k] for k in sorted(r)] for _, r in sorted(by_batch.items())]


def _block_round(url: str, bodies: list[bytes], tokens: dict[int, str] | None = None) -> list[httpx.Response]:
    def one(rank: int) -> httpx.Response:
        headers = {
            "Content-Type": BLOCK_CONTENT_TYPE,
            "Authorization": f"Bearer {(tokens or {}).get(rank, 'rank-token')}",
        }
        return httpx.post(url + "/ingest", content=bodies[rank], headers=headers, timeout=30)

    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(one, range(len(bodies))))


def _not_a_member(body: bytes) -> bytes:
    """The rank's body, with its first group claiming members that leave the rank out."""
    got = decode_blocks(body)
    rank = got.rank_info[0]["rank"]
    got.batch.groups[0]["ranks"] = [[r, r + 1, 1] for r in range(got.world) if r != rank][:1]
    return encode_blocks(got.job, got.world, got.batch, got.rank_info)


def test_the_agent_merges_block_bodies_and_answers_each_rank(block_agent: Agent, bound_collector: Service) -> None:
    rounds = _block_rounds()
    replies = _block_round(block_agent.url, rounds[0])
    assert [r.status_code for r in replies] == [200] * RANKS, [r.text for r in replies]
    for body, r in zip(rounds[0], replies, strict=True):
        assert r.json() == {
            "accepted": decode_blocks(body).records,
            "duplicate": False,
            "commands": [],
            "block_seqs": {},
        }
    health = block_agent.health()
    assert health["batches"] == RANKS and health["merged"] == RANKS and health["requests"] < RANKS, health
    job = bound_collector.job(BLOCK_JOB)
    assert job is not None and [r["ops"] for r in job["ranks"]] == [decode_blocks(b).records for b in rounds[0]]
    # a command for rank 5 comes back to rank 5 only
    r = httpx.post(
        f"{bound_collector.url}/jobs/{BLOCK_JOB}/commands",
        json={"type": "dump_flight_recorder", "ranks": [5]},
        headers=bound_collector.headers,
    )
    assert r.status_code == 202, r.text
    replies = _block_round(block_agent.url, rounds[1])
    commands = {rank: r.json()["commands"] for rank, r in enumerate(replies)}
    assert [(c["type"], c["rank"]) for c in commands.pop(5)] == [("dump_flight_recorder", 5)]
    assert all(c == [] for c in commands.values()), commands
    # a malformed body is refused for its rank with the collector's reason; a retried one is a
    # duplicate for its rank only; the others' data is taken
    before = {r["rank"]: r["ops"] for r in bound_collector.job(BLOCK_JOB)["ranks"]}  # type: ignore[index]
    bodies = [*rounds[2]]
    bodies[2] = _not_a_member(bodies[2])
    bodies[4] = rounds[1][4]
    replies = _block_round(block_agent.url, bodies)
    assert [r.status_code for r in replies] == [200, 200, 400, 200, 200, 200, 200, 200], [r.text for r in replies]
    assert "rank 2 reports groups[0]" in replies[2].json()["detail"]
    assert [r.json().get("duplicate") for r in replies] == [False, False, None, False, True, False, False, False]
    after = {r["rank"]: r["ops"] for r in bound_collector.job(BLOCK_JOB)["ranks"]}  # type: ignore[index]
    grew = {rank: after[rank] - before[rank] for rank in after}
    assert grew == {rank: 0 if rank in (2, 4) else decode_blocks(rounds[2][rank]).records for rank in after}
    assert block_agent.health()["merged"] == RANKS + RANKS + RANKS - 1  # the malformed body went alone


def test_job_bound_tokens_still_bind_through_a_merging_agent(block_agent: Agent, bound_collector: Service) -> None:
    rounds = _block_rounds()
    tokens = {rank: "job-token" if rank < 4 else "wrong-token" for rank in range(RANKS)}
    replies = _block_round(block_agent.url, rounds[0], tokens)
    assert [r.status_code for r in replies] == [200] * 4 + [403] * 4, [r.text for r in replies]
    assert all("other-job" in r.json()["detail"] for r in replies[4:])
    job = bound_collector.job(BLOCK_JOB)
    assert job is not None and sorted(r["rank"] for r in job["ranks"]) == [0, 1, 2, 3]
    assert block_agent.health()["merged"] == 4  # each token's bodies were merged on their own


def test_blocks_through_the_agent_get_503_without_a_collector(block_agent: Agent, bound_collector: Service) -> None:
    bound_collector.stop(signal.SIGKILL)
    replies = _block_round(block_agent.url, _block_rounds()[0][:3])
    assert [r.status_code for r in replies] == [503] * 3
    assert all("retry" in r.json()["detail"] for r in replies)


def test_a_collector_without_merged_bodies_gets_them_unmerged() -> None:
    """An older collector answers a version-2 body 400: the agent sends the ranks' own bodies instead."""
    seen: list[str] = []

    def old_collector(request: httpx.Request) -> httpx.Response:
        items = (
            decode_multi(request.content)
            if request.headers["content-type"] == MULTI_CONTENT_TYPE
            else [request.content]
        )
        seen.append(f"{len(items)}:{','.join(str(int.from_bytes(i[4:6], 'little')) for i in items)}")
        results = []
        for item in items:
            try:
                got = decode_blocks(item)
            except WireError as exc:
                results.append({"status": 400, "detail": str(exc)})
                continue
            if got.per_rank:  # what a collector before block wire version 2 said
                results.append(
                    {"status": 400, "detail": "block wire version 2 is not supported; this collector reads 1"}
                )
            else:
                results.append(
                    {
                        "status": 200,
                        "accepted": got.records,
                        "duplicate": False,
                        "commands": [],
                        "rank": got.rank_info[0]["rank"],
                    }
                )
        if len(items) == 1:
            r = dict(results[0])
            return httpx.Response(r.pop("status"), json=r)
        return httpx.Response(200, json={"results": results})

    async def go() -> list[tuple[int, bytes]]:
        agent = Agent_(
            CollectorURL("http://collector:7433", None), linger_s=0.05, transport=httpx.MockTransport(old_collector)
        )
        bodies = _block_rounds()[0]
        try:
            return list(await asyncio.gather(*(agent.submit(b, "Bearer t") for b in bodies)))
        finally:
            await agent.aclose()

    answers = asyncio.run(go())
    assert [s for s, _ in answers] == [200] * RANKS
    assert [json.loads(b)["rank"] for _, b in answers] == list(range(RANKS))  # each rank its own answer
    assert seen == ["1:2", f"{RANKS}:{','.join(['1'] * RANKS)}"]  # merged, refused, then as they came


# -- the window: closed once every expected rank is in, the linger only bounds it ---------------------
LINGER_S = 2.0


class _Stub:
    """A collector behind a ``MockTransport``: answers every rank 200 and notes the ranks of each request."""

    def __init__(self) -> None:
        self.requests: list[list[int]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        multi = request.headers["content-type"] == MULTI_CONTENT_TYPE
        items = decode_multi(request.content) if multi else [request.content]
        bodies = [decode_blocks(item) for item in items]
        self.requests.append(sorted(int(r["rank"]) for b in bodies for r in b.rank_info))
        results = [
            {"status": 200, "accepted": 1, "duplicate": False, "commands": [], "rank": r["rank"]}
            for b in bodies
            for r in b.rank_info
        ]
        if len(results) == 1:
            return httpx.Response(200, json={k: v for k, v in results[0].items() if k != "status"})
        if multi and any(b.per_rank for b in bodies):
            raise AssertionError("the stub takes one merged body or several rank bodies, not both")
        return httpx.Response(200, json={"results": results})


async def _send_round(agent: Agent_, bodies: dict[int, bytes], delays: dict[int, float] | None = None) -> float:
    """Each rank posts its body after its delay (s); how long until the last rank had its answer."""

    async def one(rank: int) -> tuple[int, bytes]:
        await asyncio.sleep((delays or {}).get(rank, 0.0))
        return await agent.submit(bodies[rank], "Bearer t")

    t0 = time.monotonic()
    answers = await asyncio.gather(*(one(rank) for rank in bodies))
    assert [s for s, _ in answers] == [200] * len(bodies)
    assert [json.loads(b)["rank"] for _, b in answers] == list(bodies)
    return time.monotonic() - t0


def _windows(delays_s: float = 0.05) -> tuple[_Stub, Agent_, list[dict[int, bytes]], dict[int, float]]:
    stub = _Stub()
    agent = Agent_(CollectorURL("http://collector:7433", None), linger_s=LINGER_S, transport=httpx.MockTransport(stub))
    rounds = [dict(enumerate(r)) for r in _block_rounds()]
    phases = dict(enumerate(np.random.default_rng(1).uniform(0, delays_s, RANKS).tolist()))
    return stub, agent, rounds, phases


def test_a_window_closes_once_every_known_rank_is_in() -> None:
    stub, agent, rounds, phases = _windows()

    async def go() -> list[float]:
        try:
            return [await _send_round(agent, rounds[k % len(rounds)], phases) for k in range(3)]
        finally:
            await agent.aclose()

    took = asyncio.run(go())
    assert took[0] >= LINGER_S  # the first window learns who sends: it waits the whole linger
    assert max(took[1:]) < 0.25 * LINGER_S, took  # then each closes when the last rank is in
    assert stub.requests == [list(range(RANKS))] * 3
    assert agent.stats["closed_early"] == 2 and agent.stats["merged"] == 3 * RANKS


def test_a_rank_that_stops_sending_delays_the_others_once() -> None:
    stub, agent, rounds, phases = _windows()
    alive = [r for r in range(RANKS) if r != 3]

    async def go() -> list[float]:
        try:
            took = [await _send_round(agent, rounds[0], phases)]
            for k in range(1, 4):
                took.append(await _send_round(agent, {r: rounds[k % len(rounds)][r] for r in alive}, phases))
            return took
        finally:
            await agent.aclose()

    took = asyncio.run(go())
    assert took[1] >= LINGER_S, took  # the window waited for rank 3 ...
    assert max(took[2:]) < 0.25 * LINGER_S, took  # ... once: it is not expected any more
    assert stub.requests == [list(range(RANKS))] + [alive] * 3


def test_a_rank_that_joins_is_merged_in_and_then_waited_for() -> None:
    stub, agent, rounds, phases = _windows()
    first = list(range(RANKS - 1))
    late = RANKS - 1

    async def go() -> list[float]:
        try:
            took = [await _send_round(agent, {r: rounds[0][r] for r in first}, phases)]
            took.append(await _send_round(agent, {r: rounds[1][r] for r in first}, phases))
            # the new rank opens a window on its own phase: the known ranks join it, one body
            took.append(await _send_round(agent, rounds[2], {r: 0.0 if r == late else 0.3 for r in range(RANKS)}))
            # from then on it is waited for, even when it comes last
            took.append(await _send_round(agent, rounds[3 % len(rounds)], {**phases, late: 0.15}))
            return took
        finally:
            await agent.aclose()

    took = asyncio.run(go())
    assert max(took[1:]) < 0.25 * LINGER_S, took
    assert stub.requests == [first, first, list(range(RANKS)), list(range(RANKS))]


def test_a_rank_that_says_it_ended_is_not_waited_for() -> None:
    stub, agent, rounds, phases = _windows()
    bodies = dict(rounds[1])
    got = decode_blocks(bodies[5])
    got.rank_info[0]["end_reason"] = "interpreter exit"
    bodies[5] = encode_blocks(got.job, got.world, got.batch, got.rank_info)
    alive = [r for r in range(RANKS) if r != 5]

    async def go() -> list[float]:
        try:
            took = [await _send_round(agent, rounds[0], phases), await _send_round(agent, bodies, phases)]
            took.append(await _send_round(agent, {r: rounds[2][r] for r in alive}, phases))
            return took
        finally:
            await agent.aclose()

    took = asyncio.run(go())
    assert max(took[1:]) < 0.25 * LINGER_S, took
    assert stub.requests == [list(range(RANKS))] * 2 + [alive]


def test_a_live_agent_closes_windows_early(bound_collector: Service, tmp_path: Path) -> None:
    """Real HTTP through a real agent to a real collector: after the first window, no batch waits
    the linger (3 s here), and every round is one merged body."""
    agent = start_agent(tmp_path, bound_collector.url, "--linger-ms", "3000")
    try:
        rounds = _block_rounds()
        took = []
        for bodies in rounds[:3]:
            t0 = time.monotonic()
            replies = _block_round(agent.url, bodies)
            took.append(time.monotonic() - t0)
            assert [r.status_code for r in replies] == [200] * RANKS, [r.text for r in replies]
        assert took[0] >= 3.0 and max(took[1:]) < 1.5, took
        health = agent.health()
        assert health["requests"] == 3 and health["merged"] == 3 * RANKS and health["closed_early"] == 2, health
    finally:
        agent.stop()
