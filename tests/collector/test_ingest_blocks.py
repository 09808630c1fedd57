"""Block batches through the real app: taken into the job's ranks, groups and summaries, de-duplicated,
block sizes settled by the first word, refused with a 4xx when malformed, and carried by the agent's
multi-batch frame like raw batches."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from rankwatch.api.app import create_app
from rankwatch.blockmerge import merge_bodies, pack
from rankwatch.blockwire import BLOCK_CONTENT_TYPE, decode_blocks, encode_blocks, rank_body
from rankwatch.collector.settings import Settings
from rankwatch.multibatch import MULTI_CONTENT_TYPE, encode_multi
from rankwatch.sim import PROFILES, Layout, Scenario, Workload, deliveries, from_batch
from rankwatch.sim.blocks import BLOCK_DTYPE
from rankwatch.sim.stream import stream_blocks

HDR = {"Content-Type": BLOCK_CONTENT_TYPE}


@pytest.fixture
def client(tmp_path: Path, db_url: str) -> Iterator[TestClient]:
    app = create_app(Settings(data_dir=tmp_path, db=db_url, max_body_mb=4.0))
    with TestClient(app) as c:
        yield c


def _scenario(duration: float = 3.0) -> Scenario:
    lay = Layout(tp=2, pp=2, dp=2)
    return Scenario(
        "blk", layout=lay, workload=Workload.for_rate(100, lay), profile=PROFILES["quiet"], duration=duration, seed=2
    )


def _rank_bodies(sc: Scenario, b: int = 8) -> list[tuple[dict[str, Any], int, bytes]]:
    out = []
    for d in deliveries(sc):
        h = d.batch.header
        bb = from_batch(h, d.batch.records, np.full(len(h["groups"]), b))
        for g in h["groups"]:
            g["block_seqs"] = b
        out.append((h, len(d.batch.records), rank_body(h, bb.blocks)))
    return out


def test_block_batches_fill_the_job_like_raw_ones(client: TestClient) -> None:
    sc = _scenario()
    bodies = _rank_bodies(sc)
    total = 0
    for _, n, body in bodies:
        r = client.post("/ingest", content=body, headers=HDR)
        assert r.status_code == 200, r.text
        assert r.json()["accepted"] == n and r.json()["duplicate"] is False
        total += n
    job = client.get(f"/jobs/{bodies[0][0]['job']}").json()
    assert job["world"] == sc.layout.world and len(job["ranks"]) == sc.layout.world
    assert job["ops"] == total == sum(r["ops"] for r in job["ranks"])
    last = {}
    for h, _, _ in bodies:
        for g in h["groups"]:
            last[g["id"]] = max(last.get(g["id"], 0), g["entered"])
    groups = {g["id"]: g for g in job["groups"]}
    assert {gid: groups[gid]["last_seq"] for gid in last} == last  # sequence progress as raw mode shows it
    assert sum(sum(g["op_counts"].values()) for g in job["groups"]) == total
    # a retried body is a duplicate, and nothing is counted twice
    r = client.post("/ingest", content=bodies[-1][2], headers=HDR)
    assert r.json()["duplicate"] is True and r.json()["accepted"] == 0
    assert client.get(f"/jobs/{bodies[0][0]['job']}").json()["ops"] == total


def test_summaries_are_written_from_blocks(client: TestClient) -> None:
    bodies = _rank_bodies(_scenario())
    for _, _, body in bodies:
        assert client.post("/ingest", content=body, headers=HDR).status_code == 200
    app = client.app
    collector = app.state.collector  # type: ignore[attr-defined]
    collector.persist()
    rows = collector.summaries(bodies[0][0]["job"])
    assert rows and sum(r["ops"] for r in rows) == sum(n for _, n, _ in bodies)
    assert all(r["time_min_ms"] <= r["time_p50_ms"] <= r["time_max_ms"] for r in rows)
    # each rank's bodies number its own groups: the ops land in the groups they were run on
    job = client.get(f"/jobs/{bodies[0][0]['job']}").json()
    got: dict[str, int] = {}
    ranks: dict[str, int] = {}
    for r in rows:
        got[r["group"]] = got.get(r["group"], 0) + r["ops"]
        ranks[r["group"]] = max(ranks.get(r["group"], 0), r["ranks"])
    assert got == {g["id"]: g["ops"] for g in job["groups"] if g["ops"]}
    assert ranks == {g["id"]: g["size"] for g in job["groups"] if g["ops"]}  # every member reported


def test_first_word_settles_a_groups_block_size(client: TestClient) -> None:
    sc = _scenario(2.5)
    by_rank: dict[int, dict[str, Any]] = {}
    for d in deliveries(sc):
        by_rank.setdefault(d.batch.header["rank"], d.batch.header)
    firsts = [by_rank[0], by_rank[1]]  # tensor-parallel peers: they share a group
    replies = []
    for i, h in enumerate(firsts):
        for g in h["groups"]:
            g.pop("block_seqs", None)
            g["block_want"] = 16 if i == 0 else 4  # the members propose differently
        r = client.post("/ingest", content=rank_body(h, np.zeros(0, BLOCK_DTYPE)), headers=HDR)
        assert r.status_code == 200, r.text
        replies.append(r.json()["block_seqs"])
    shared = set(replies[0]) & set(replies[1])
    assert shared and all(replies[0][g] == replies[1][g] == 16 for g in shared)


def test_many_ranks_in_one_body_and_in_a_multibatch(client: TestClient) -> None:
    lay = Layout(tp=8, pp=2, dp=2)
    sc = Scenario(
        "agg", layout=lay, workload=Workload.for_rate(100, lay), profile=PROFILES["quiet"], duration=3, seed=3
    )
    sent = 0
    frames = []
    for k, d in enumerate(stream_blocks(sc, agent_ranks=16)):
        bb = d.batch
        infos = [
            {"rank": int(r), "node": f"node{int(r) // 8}", "incarnation": "0-1-x", "batch": k} for r in bb.ranks["rank"]
        ]
        frames.append(encode_blocks("agg", lay.world, bb, infos))
        sent += int(bb.blocks["count"].sum())
    r = client.post("/ingest", content=frames[0], headers=HDR)
    assert r.status_code == 200, r.text
    r = client.post("/ingest", content=encode_multi(frames[1:]), headers={"Content-Type": MULTI_CONTENT_TYPE})
    assert r.status_code == 200 and all(x["status"] == 200 for x in r.json()["results"]), r.text
    job = client.get("/jobs/agg").json()
    assert job["ops"] == sent > 0 and len(job["ranks"]) == lay.world
    assert max(int.from_bytes(f[24:28], "little") for f in frames) > 64  # block rows: counted by numpy, not one by one
    assert sum(sum(g["op_counts"].values()) for g in job["groups"]) == sent
    assert all(sum(g["op_counts"].values()) == g["ops"] for g in job["groups"])


@pytest.mark.parametrize(
    ("mangle", "status", "says"),
    [
        (lambda b: b[:20], 400, "shorter than"),
        (lambda b: b[:-3], 400, "does not decompress"),
        (lambda b: b"RWK\x00\x07" + b[5:], 400, "block wire version"),
    ],
)
def test_malformed_block_batches_get_a_4xx(client: TestClient, mangle: Any, status: int, says: str) -> None:
    body = _rank_bodies(_scenario(2.0))[0][2]
    r = client.post("/ingest", content=mangle(body), headers=HDR)
    assert r.status_code == status, r.text
    assert says in r.json()["detail"]
    assert client.get("/jobs").json() == []


def test_a_token_bound_to_another_job_is_refused(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("ingest tok-a job=other-job\n")
    app = create_app(Settings(data_dir=tmp_path, tokens_file=tokens))
    with TestClient(app) as c:
        body = _rank_bodies(_scenario(2.0))[0][2]
        r = c.post("/ingest", content=body, headers=HDR | {"Authorization": "Bearer tok-a"})
        assert r.status_code == 403 and "other-job" in r.json()["detail"], r.text


# -- merged bodies (``rankwatch agent``): decoded once, answered per rank ------------------------------
def _rounds(sc: Scenario, b: int = 8) -> list[list[bytes]]:
    """Each send round's rank bodies, in rank order (what an agent gathers in one linger)."""
    by_batch: dict[int, dict[int, bytes]] = {}
    for h, _, body in _rank_bodies(sc, b):
        by_batch.setdefault(h["batch"], {})[h["rank"]] = body
    return [[r[k] for k in sorted(r)] for _, r in sorted(by_batch.items())]


def _merged(bodies: list[bytes]) -> bytes:
    (item,) = pack(bodies)
    assert item.merged and item.members == list(range(len(bodies)))
    return item.body


def test_a_merged_body_is_answered_per_rank_as_each_rank_alone(tmp_path: Path) -> None:
    sc = _scenario()
    rounds = _rounds(sc)
    alone = TestClient(create_app(Settings(data_dir=tmp_path / "a")))
    merged = TestClient(create_app(Settings(data_dir=tmp_path / "m")))
    with alone, merged:
        for bodies in rounds:
            want = [alone.post("/ingest", content=b, headers=HDR) for b in bodies]
            assert all(r.status_code == 200 for r in want)
            r = merged.post("/ingest", content=_merged(bodies), headers=HDR)
            assert r.status_code == 200, r.text
            got = r.json()["results"]
            assert got == [{"status": 200, **w.json()} for w in want]
            assert sum(x["accepted"] for x in got) > 0
        job = f"sim-{sc.name}"
        a, m = alone.get(f"/jobs/{job}").json(), merged.get(f"/jobs/{job}").json()
        assert m["ops"] == a["ops"] > 0
        assert [(r["rank"], r["ops"], r["batches"]) for r in m["ranks"]] == [
            (r["rank"], r["ops"], r["batches"]) for r in a["ranks"]
        ]
        assert [(g["id"], g["last_seq"], g["op_counts"]) for g in m["groups"]] == [
            (g["id"], g["last_seq"], g["op_counts"]) for g in a["groups"]
        ]
        # the detector took the merged body as one batch, and saw every rank
        det_m = merged.app.state.collector.jobs[job].detector  # type: ignore[attr-defined]
        det_a = alone.app.state.collector.jobs[job].detector  # type: ignore[attr-defined]
        assert det_m.batches == len(rounds) and det_a.batches == sum(len(b) for b in rounds)


def test_a_retried_rank_inside_a_merged_body_is_a_duplicate_for_that_rank_only(client: TestClient) -> None:
    first, second = _rounds(_scenario())[:2]
    assert client.post("/ingest", content=first[3], headers=HDR).json()["duplicate"] is False  # rank 3 alone
    r = client.post("/ingest", content=_merged(first), headers=HDR)  # rank 3 retried inside the merged body
    res = r.json()["results"]
    assert [x["duplicate"] for x in res] == [i == 3 for i in range(len(first))], res
    assert res[3]["accepted"] == 0 and all(x["accepted"] > 0 for i, x in enumerate(res) if i != 3)
    job = f"sim-{_scenario().name}"
    ops = {x["rank"]: x["ops"] for x in client.get(f"/jobs/{job}").json()["ranks"]}
    again = client.post("/ingest", content=_merged(first), headers=HDR).json()["results"]  # all retried
    assert all(x["duplicate"] and x["accepted"] == 0 for x in again)
    assert {x["rank"]: x["ops"] for x in client.get(f"/jobs/{job}").json()["ranks"]} == ops  # nothing twice
    nxt = client.post("/ingest", content=_merged(second), headers=HDR).json()["results"]
    assert not any(x["duplicate"] for x in nxt)


def test_commands_in_a_merged_bodys_answer_go_to_their_rank_only(client: TestClient) -> None:
    first, second = _rounds(_scenario())[:2]
    assert client.post("/ingest", content=_merged(first), headers=HDR).status_code == 200
    job = f"sim-{_scenario().name}"
    r = client.post(f"/jobs/{job}/commands", json={"type": "dump_flight_recorder", "ranks": [5]})
    assert r.status_code == 202, r.text
    res = client.post("/ingest", content=_merged(second), headers=HDR).json()["results"]
    commands = {i: x["commands"] for i, x in enumerate(res)}
    assert [(c["type"], c["rank"]) for c in commands.pop(5)] == [("dump_flight_recorder", 5)]
    assert all(c == [] for c in commands.values()), commands


def test_block_sizes_in_a_merged_bodys_answer_are_each_ranks_own(client: TestClient) -> None:
    (first,) = _rounds(_scenario(1.2), b=8)[:1]
    own = [decode_blocks(b) for b in first]
    for body in own:
        for g in body.batch.groups:
            g.pop("block_seqs", None)
            g["block_want"] = 4 if body.rank_info[0]["rank"] % 2 else 16
        body.batch.blocks = body.batch.blocks[:0]
    res = client.post("/ingest", content=merge_bodies(own), headers=HDR).json()["results"]
    for body, x in zip(own, res, strict=True):
        assert set(x["block_seqs"]) == {g["id"] for g in body.batch.groups}  # its own groups, all of them
    settled: dict[str, int] = {}
    for x in res:
        for gid, size in x["block_seqs"].items():
            assert settled.setdefault(gid, size) == size  # every member is told the same size


def test_a_merged_body_under_a_token_bound_to_another_job_is_refused(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("ingest tok-a job=other-job\n")
    with TestClient(create_app(Settings(data_dir=tmp_path, tokens_file=tokens))) as c:
        r = c.post("/ingest", content=_merged(_rounds(_scenario())[0]), headers=HDR | {"Authorization": "Bearer tok-a"})
        assert r.status_code == 403 and "other-job" in r.json()["detail"], r.text
        assert c.app.state.collector.jobs == {}  # type: ignore[attr-defined]
