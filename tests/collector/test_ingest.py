"""The ingest path: malformed, oversized, replayed and restarted batches, through the real app.

The app runs in-process (ASGI) on a real database: SQLite in the test's tmp dir, and PostgreSQL.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from support import make_body, make_header

from rankwatch.api.app import create_app
from rankwatch.collector.settings import Settings
from rankwatch.multibatch import MULTI_CONTENT_TYPE, encode_multi
from rankwatch.wire import CONTENT_TYPE, MAGIC, WIRE_VERSION

HDR = {"Content-Type": CONTENT_TYPE}


@pytest.fixture
def client(tmp_path: Path, db_url: str) -> Iterator[TestClient]:
    app = create_app(Settings(data_dir=tmp_path, db=db_url, max_body_mb=1.0))
    with TestClient(app) as c:
        yield c


def _post(client: TestClient, body: bytes, headers: dict[str, str] | None = None) -> Any:
    return client.post("/ingest", content=body, headers=headers or HDR)


def _raw(header: dict[str, Any], n: int = 0, block: bytes = b"", flags: int = 0) -> bytes:
    head = json.dumps(header).encode()
    return struct.pack("<4sHHII", MAGIC, WIRE_VERSION, flags, len(head), n) + head + block


def test_good_batch_is_taken_and_counted(client: TestClient) -> None:
    r = _post(client, make_body())
    assert r.status_code == 200, r.text
    assert r.json() == {"accepted": 3, "duplicate": False, "commands": []}
    job = client.get("/jobs/job-a").json()
    assert job["ranks"][0]["ops"] == 3
    assert job["groups"][0]["op_counts"] == {"all_reduce": 3}
    assert job["groups"][0]["last_seq"] == 3


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"", "shorter than"),
        (b"GARBAGE-GARBAGE-GARBAGE", "bad magic"),
        (struct.pack("<4sHHII", MAGIC, 99, 0, 2, 0) + b"{}", "wire version 99"),
        (struct.pack("<4sHHII", MAGIC, WIRE_VERSION, 0, 50, 0) + b"{}", "truncated"),
        (struct.pack("<4sHHII", MAGIC, WIRE_VERSION, 0, 5, 0) + b"{nope", "not valid JSON"),
        (_raw({"rank": 0}), "lacks required field 'job'"),
        (_raw(make_header(rank=5, world=2)), "rank 5 is not within world size 2"),
        (_raw(make_header(world=0)), "world size 0"),
        (_raw(make_header(state="zombie")), "state must be one of"),
        (_raw(make_header(), n=2, block=b"\x00" * 7), "column block is 7 bytes"),
        (_raw(make_header(), n=2, block=b"not zlib", flags=1), "not valid zlib"),
        (_raw(make_header(), flags=8), "unknown flags"),
    ],
)
def test_malformed_batches_are_rejected_with_a_reason(client: TestClient, body: bytes, says: str) -> None:
    r = _post(client, body)
    assert r.status_code == 400, r.text
    assert says in r.json()["detail"]
    assert client.get("/jobs").json() == []  # and nothing of it was taken


def test_records_are_checked_against_the_header(client: TestClient) -> None:
    # sequence number ahead of what the group says it entered
    r = _post(client, make_body(make_header(entered=2), n=3))
    assert r.status_code == 400 and "ahead of its group's 'entered'" in r.json()["detail"]
    # sequence numbers start at 1
    r = _post(client, make_body(make_header(entered=3), n=3, first_seq=0))
    assert r.status_code == 400 and "start at 1" in r.json()["detail"]
    # a rank reporting a group it is not a member of
    h = make_header(rank=1, world=4)
    h["groups"][0]["ranks"] = [[0, 4, 2]]
    r = _post(client, make_body(h))
    assert r.status_code == 400 and "not one of its members" in r.json()["detail"]


def test_oversized_and_wrong_type(client: TestClient) -> None:
    big = make_body(make_header(meta={"pad": "x" * (2 * 1024 * 1024)}))
    r = _post(client, big)
    assert r.status_code == 413
    r = _post(client, make_body(), headers={"Content-Type": "application/json"})
    assert r.status_code == 415


def test_oversized_without_a_length_is_refused(client: TestClient) -> None:
    def chunks() -> Iterator[bytes]:  # streamed: no Content-Length to refuse it by
        body = make_body(make_header(meta={"pad": "x" * (2 * 1024 * 1024)}))
        for i in range(0, len(body), 65536):
            yield body[i : i + 65536]

    r = client.post("/ingest", content=chunks(), headers=HDR)
    assert r.status_code == 413 and "larger than the limit" in r.json()["detail"]
    assert client.get("/jobs").json() == []


def test_a_multi_batch_is_answered_per_batch(client: TestClient) -> None:
    multi = {"Content-Type": MULTI_CONTENT_TYPE}
    bodies = [make_body(), make_body(make_header(rank=5)), make_body(make_header(rank=1)), make_body()]
    r = client.post("/ingest", content=encode_multi(bodies), headers=multi)
    assert r.status_code == 200, r.text
    got = r.json()["results"]
    assert [g["status"] for g in got] == [200, 400, 200, 200]
    assert "rank 5 is not within world size 2" in got[1]["detail"]
    assert got[0] == {"status": 200, "accepted": 3, "duplicate": False, "commands": []}
    assert got[3]["duplicate"] is True  # the same batch twice in one request is still taken once
    assert [r["ops"] for r in client.get("/jobs/job-a").json()["ranks"]] == [3, 3]
    r = client.post("/ingest", content=b"RWM\x00garbage", headers=multi)
    assert r.status_code == 400 and "multi-batch" in r.json()["detail"]


def test_zip_bomb_is_refused(client: TestClient) -> None:
    block = zlib.compress(b"\x00" * (10 * 1024 * 1024))
    r = _post(client, _raw(make_header(), n=1, block=block, flags=1))
    assert r.status_code == 400 and "expected size" in r.json()["detail"]


def test_a_replayed_batch_is_not_counted_twice(client: TestClient) -> None:
    body = make_body()
    assert _post(client, body).json()["accepted"] == 3
    again = _post(client, body)
    assert again.status_code == 200
    assert again.json()["duplicate"] is True and again.json()["accepted"] == 0
    assert client.get("/jobs/job-a").json()["ranks"][0]["ops"] == 3
    # an older batch of the same incarnation is a replay too
    assert _post(client, make_body(make_header(batch=1, entered=6), first_seq=4)).json()["accepted"] == 3
    assert _post(client, body).json()["duplicate"] is True
    assert client.get("/jobs/job-a").json()["ranks"][0]["ops"] == 6


def test_a_restarted_jobs_batches_are_accepted(client: TestClient) -> None:
    assert _post(client, make_body()).json()["accepted"] == 3
    # torchrun restarted the worker: new incarnation, batch numbers and sequence numbers start over
    restarted = make_header(incarnation="1-200-bbbb", restart=1)
    r = _post(client, make_body(restarted))
    assert r.json() == {"accepted": 3, "duplicate": False, "commands": []}
    rank = client.get("/jobs/job-a").json()["ranks"][0]
    assert rank["incarnation"] == "1-200-bbbb" and rank["restart"] == 1 and rank["ops"] == 6


def test_jobs_survive_a_service_restart(tmp_path: Path, db_url: str) -> None:
    settings = Settings(data_dir=tmp_path, db=db_url)
    body = make_body()
    with TestClient(create_app(settings)) as c:
        assert _post(c, body).status_code == 200
    with TestClient(create_app(settings)) as c:
        jobs = c.get("/jobs").json()
        assert [j["id"] for j in jobs] == ["job-a"]
        job = c.get("/jobs/job-a").json()
        assert job["ranks"][0]["ops"] == 3 and job["groups"][0]["op_counts"] == {"all_reduce": 3}
        # a retried batch from before the restart is still recognised as a replay
        assert _post(c, body).json()["duplicate"] is True
        assert c.get("/jobs/job-a").json()["ranks"][0]["ops"] == 3


def test_unknown_job_is_404(client: TestClient) -> None:
    assert client.get("/jobs/nope").status_code == 404
    assert client.get("/jobs/nope/ops").status_code == 404
