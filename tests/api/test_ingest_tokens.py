"""Ingest tokens: required once configured, taken from the ranks' RANKWATCH URL, bound to a job."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from support import SCRIPTS, Service, clean_env, make_body, make_header, start_service

from rankwatch.api.app import create_app
from rankwatch.collector.settings import Settings
from rankwatch.wire import CONTENT_TYPE


@pytest.fixture
def client(tmp_path: Path, db_url: str) -> Iterator[TestClient]:
    tokens = tmp_path / "tokens"
    tokens.write_text("ingest job-a-only job=job-a\nread reader\n# a comment\n")
    app = create_app(Settings(data_dir=tmp_path, db=db_url, ingest_tokens=["rank-token"], tokens_file=tokens))
    with TestClient(app) as c:
        yield c


def _post(c: TestClient, token: str | None, job: str = "job-a") -> Any:
    headers = {"Content-Type": CONTENT_TYPE}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return c.post("/ingest", content=make_body(make_header(job=job)), headers=headers)


def test_ingest_needs_a_token_of_the_ingest_scope(client: TestClient) -> None:
    r = _post(client, None)
    assert r.status_code == 401 and "'ingest' scope" in r.json()["detail"]
    assert r.headers["www-authenticate"] == "Bearer"
    assert _post(client, "wrong").status_code == 401
    r = _post(client, "reader")
    assert r.status_code == 403 and "this route needs 'ingest'" in r.json()["detail"]
    assert _post(client, "rank-token").status_code == 200


def test_a_job_bound_token_cannot_send_for_another_job(client: TestClient) -> None:
    assert _post(client, "job-a-only", job="job-a").status_code == 200
    r = _post(client, "job-a-only", job="job-b")
    assert r.status_code == 403 and "job-a" in r.json()["detail"]
    assert [j["id"] for j in client.get("/jobs", headers={"Authorization": "Bearer reader"}).json()] == ["job-a"]


@pytest.mark.torchrun
def test_ranks_send_the_token_from_the_url(tmp_path: Path, run_torchrun: Any) -> None:
    env = clean_env(RANKWATCH_INGEST_TOKENS="s3cret-token", RANKWATCH_READ_TOKENS="reader")
    svc: Service = start_service(tmp_path, env=env)
    svc.headers = {"Authorization": "Bearer reader"}
    try:
        host = svc.url.removeprefix("http://")
        for job, url in (("with-token", f"http://s3cret-token@{host}"), ("no-token", svc.url)):
            run_env = clean_env(RANKWATCH=url, RANKWATCH_JOB=job, RANKWATCH_FLUSH_S="0.25")
            run = run_torchrun(SCRIPTS / "loop.py", "5", "0.01", "out", nproc=2, env=run_env)
            assert run.returncode == 0, run.output[-2000:]  # the job runs either way
        svc.wait_job("with-token", lambda j: len(j["ranks"]) == 2)
        assert svc.job("no-token") is None
        assert "s3cret-token" not in svc.log.read_text()  # never logged
    finally:
        svc.stop()
