"""Remediation through the REST API: the action state machine, policies, safety rules, paging.

The service runs in-process (``paging_support.Harness``) on SQLite and on PostgreSQL; suspects are
written through ``SuspectStore`` as the analysis loop writes them; the executor is stepped by hand
(``run_once``) so each state can be looked at. Actuators are real where that is harmless: the
``command`` actuator running ``touch``, so a dry run can be seen to change nothing on disk.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from paging_support import Finding, Harness, Receiver

from rankwatch.api.remediation import Executor
from rankwatch.collector.models import RankRow
from rankwatch.collector.settings import Settings

JOB = "job-a"
NODES = {"gpu016": [0, 1], "gpu017": [2, 3], "gpu018": [4, 5], "gpu019": [6, 7]}


def _ranks(h: Harness, job: str = JOB) -> None:
    h.open(Finding(key="warmup", kind="noncomm_slow", score=0.1), job)  # creates the job row (below min_score)
    now = time.time()
    with h.collector.db.sessions.begin() as s:
        for node, ranks in NODES.items():
            for r in ranks:
                s.merge(
                    RankRow(
                        job_id=job, rank=r, node=node, pid=1000 + r, incarnation="i", restart=0, state="running",
                        first_seen=now, last_seen=now, meta={},
                    )
                )  # fmt: skip


@pytest.fixture
def rem(harness: Callable[..., Harness], db_url: str, tmp_path: Path) -> Callable[..., Harness]:
    def make(**settings: Any) -> Harness:
        h = harness(db=db_url, **settings)
        _ranks(h)
        return h

    return make


def _executor(h: Harness) -> Executor:
    return h.app.state.executor  # type: ignore[no-any-return]


def _touch_policy(tmp: Path, **extra: Any) -> dict[str, Any]:
    """The ``command`` actuator, touching a file per step: real effects a test can look for."""
    opts = {
        "templates": {
            "isolate": ["touch", str(tmp / "isolated-{node}")],
            "restart": ["touch", str(tmp / "restarted-{job_id}")],
            "swap": ["touch", str(tmp / "swapped-{node}")],
            "release": ["rm", "-f", str(tmp / "isolated-{node}")],
        }
    }
    return {"actuator": "command", "actuator_options": opts, **extra}


def _policy(h: Harness, **body: Any) -> dict[str, Any]:
    r = h.client.put(f"/jobs/{JOB}/policy", json=body)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def _actions(h: Harness, **params: Any) -> list[dict[str, Any]]:
    r = h.client.get("/actions", params={"job_id": JOB, **params})
    assert r.status_code == 200, r.text
    return sorted(r.json(), key=lambda a: a["id"])


def _suspect(h: Harness, sid: int) -> dict[str, Any]:
    r = h.client.get(f"/suspects/{sid}")
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def _drain(h: Harness) -> int:
    n = 0
    while _executor(h).run_once():
        n += 1
    return n


def test_auto_isolates_then_restarts_and_logs_and_pages_every_step(
    rem: Callable[..., Harness], receiver: Callable[..., Receiver], tmp_path: Path
) -> None:
    h = rem()
    rx = receiver()
    h.subscribe(
        url=rx.url,
        kind="generic",
        events=["action.approved", "action.started", "action.finished", "suspect.isolated", "suspect.opened"],
    )
    _policy(h, mode="auto", **_touch_policy(tmp_path))
    s = h.open(Finding(key="slow-3", ranks=[3], nodes=["gpu017"], slowdown=1.52))
    (a,) = _actions(h)
    assert (a["type"], a["state"], a["node"], a["ranks"], a["actor"]) == (
        "isolate", "approved", "gpu017", [2, 3], "rankwatch (policy)"
    )  # fmt: skip
    assert a["reason"] == "rankwatch: noncomm_slow rank 3 1.52x slower"
    assert _drain(h) == 2  # the isolation, then the restart it asks for
    iso, restart = _actions(h)
    assert iso["state"] == "succeeded" and restart["type"] == "restart" and restart["state"] == "succeeded"
    assert [st["step"] for st in iso["steps"]] == ["approved", "running", "isolate", "succeeded"]
    for st in iso["steps"] + restart["steps"]:
        assert st["at"] and st["actor"], st
    run = iso["steps"][2]
    assert run["actor"] == "actuator command" and "touch" in run["output"] and "(exit 0)" in run["output"]
    assert (tmp_path / "isolated-gpu017").exists() and (tmp_path / f"restarted-{JOB}").exists()
    assert iso["finished_at"] and iso["error"] is None
    assert _suspect(h, s["id"])["status"] == "isolated"
    # paged: every step reached the webhook
    got = rx.wait_for(8, timeout=15)
    types = [r.json()["type"] for r in got]
    assert types.count("action.approved") == 2 and types.count("action.finished") == 2, types
    assert "action.started" in types and "suspect.opened" in types


def test_one_suspect_gets_at_most_one_isolation(rem: Callable[..., Harness], tmp_path: Path) -> None:
    h = rem()
    _policy(h, mode="auto", **_touch_policy(tmp_path))
    f = Finding(key="slow-3", ranks=[3], nodes=["gpu017"])
    s = h.open(f)
    for _ in range(3):  # the detector keeps reporting it
        h.collector.suspects.reconcile(JOB, h.findings[JOB], True, time.time())
    # asking by hand for the same suspect returns the same action
    r = h.client.post(f"/jobs/{JOB}/actions", json={"type": "isolate", "suspect_id": s["id"]})
    assert r.status_code == 201, r.text
    (a,) = _actions(h)
    assert r.json()["id"] == a["id"]
    _drain(h)
    # the same fault flapping (resolved, reopened as a new suspect) on an isolated node: nothing more
    for i in range(3):
        h.open(Finding(key=f"slow-3-{i}", ranks=[3], nodes=["gpu017"]))
        h.resolve(f"slow-3-{i}")
        _drain(h)
    assert [(a["type"], a["state"]) for a in _actions(h)] == [("isolate", "succeeded"), ("restart", "succeeded")]


def test_flapping_suspects_stay_within_budget_and_cooldown(rem: Callable[..., Harness], tmp_path: Path) -> None:
    h = rem()
    _policy(h, mode="auto", budget=2, cooldown_s=0, max_isolated_share=1.0, **_touch_policy(tmp_path))
    for i, node in enumerate(["gpu016", "gpu017", "gpu018", "gpu019", "gpu016", "gpu017"]):
        h.open(Finding(key=f"flap-{i}", ranks=NODES[node][:1], nodes=[node]))
        h.resolve(f"flap-{i}")
    acts = _actions(h)
    taken = [a for a in acts if a["state"] != "refused"]
    refused = [a for a in acts if a["state"] == "refused"]
    assert len(taken) == 2 and len(refused) == 4, acts
    assert all(a["error"].startswith("budget spent: 2 actions") for a in refused), refused
    assert all([st["step"] for st in a["steps"]] == ["refused"] and a["finished_at"] for a in refused)
    _drain(h)
    # restarts are follow-ups of isolations the budget allowed: never more than the budget's isolations
    assert len([a for a in _actions(h) if a["type"] == "restart"]) == 2


def test_cooldown_refuses_a_second_action_too_soon(rem: Callable[..., Harness], tmp_path: Path) -> None:
    h = rem()
    _policy(h, mode="auto", budget=10, cooldown_s=600, **_touch_policy(tmp_path))
    h.open(Finding(key="a", ranks=[0], nodes=["gpu016"]))
    h.open(Finding(key="b", ranks=[4], nodes=["gpu018"]))
    first, second = _actions(h)
    assert first["state"] == "approved"
    assert second["state"] == "refused" and second["error"].startswith("cool-down"), second


def test_share_limit_links_and_foreign_nodes_are_refused_logged_and_paged(
    rem: Callable[..., Harness], receiver: Callable[..., Receiver], tmp_path: Path
) -> None:
    h = rem()
    rx = receiver()
    h.subscribe(url=rx.url, kind="generic")  # the default events: suspects, and decisions about them
    _policy(h, **_touch_policy(tmp_path))  # observe: only what people ask for is done
    for node in ("gpu016", "gpu017"):
        r = h.client.post(f"/jobs/{JOB}/actions", json={"type": "isolate", "node": node, "reason": "bad GPU"})
        assert r.status_code == 201 and r.json()["state"] == "approved", r.text
        _drain(h)
    r = h.client.post(f"/jobs/{JOB}/actions", json={"type": "isolate", "node": "gpu018"})
    assert r.json()["state"] == "refused"
    assert "3 of the job's 4 nodes" in r.json()["error"], r.json()
    r = h.client.post(f"/jobs/{JOB}/actions", json={"type": "isolate", "node": "gpu999"})
    assert r.json()["state"] == "refused" and r.json()["error"] == f"node gpu999 is not a node of job {JOB}"
    assert not (tmp_path / "isolated-gpu018").exists() and not (tmp_path / "isolated-gpu999").exists()
    # a link suspect under auto: refused with the reason, not guessed at
    _policy(h, mode="auto", max_isolated_share=1.0, cooldown_s=0, **_touch_policy(tmp_path))
    h.open(Finding(key="link", kind="comm_slow", level="link", ranks=[], nodes=[], link=("gpu018", "gpu019")))
    refused = [a for a in _actions(h, state="refused")]
    assert len(refused) == 3 and "slow link between gpu018 and gpu019" in refused[-1]["error"]
    deadline = time.monotonic() + 10
    while len([p for p in rx.requests if p.json()["type"] == "action.refused"]) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    pages = [p.json() for p in rx.requests if p.json()["type"] == "action.refused"]
    assert sorted(p["data"]["action"]["id"] for p in pages) == sorted(a["id"] for a in refused)
    assert h.client.post("/jobs/nope/actions", json={"type": "isolate", "node": "gpu016"}).status_code == 404


def test_dry_run_changes_nothing(rem: Callable[..., Harness], tmp_path: Path) -> None:
    h = rem()
    _policy(h, **_touch_policy(tmp_path))
    s = h.open(Finding(key="slow-3", ranks=[3], nodes=["gpu017"]))
    for kind in ("isolate", "restart", "swap"):
        r = h.client.post(f"/jobs/{JOB}/actions", json={"type": kind, "suspect_id": s["id"], "dry_run": True})
        assert r.status_code == 201 and r.json()["dry_run"] is True, r.text
    assert _drain(h) == 3
    acts = _actions(h)
    assert [a["state"] for a in acts] == ["succeeded"] * 3  # no follow-up restart after a dry isolation
    for a in acts:
        assert "would run: touch" in a["steps"][2]["output"], a
    assert list(tmp_path.glob("isolated-*")) == [] and list(tmp_path.glob("restarted-*")) == []
    assert list(tmp_path.glob("swapped-*")) == []
    assert _suspect(h, s["id"])["status"] == "active"
    assert h.client.get("/standby").json() == []
    # a real isolation is still possible afterwards (a dry run holds no idempotency key)
    r = h.client.post(f"/jobs/{JOB}/actions", json={"type": "isolate", "suspect_id": s["id"]})
    assert r.json()["state"] == "approved"


def test_approve_waits_for_a_person(rem: Callable[..., Harness], tmp_path: Path) -> None:
    h = rem(admin_tokens=["adm"], read_tokens=["rd"])
    admin = {"Authorization": "Bearer adm"}
    h.client.headers.update(admin)
    _policy(h, mode="approve", **_touch_policy(tmp_path))
    s = h.open(Finding(key="slow-3", ranks=[3], nodes=["gpu017"]))
    (a,) = _actions(h)
    assert a["state"] == "proposed" and a["actor"] == "rankwatch (policy)"
    assert _drain(h) == 0
    time.sleep(0.2)
    assert _actions(h)[0]["state"] == "proposed" and not (tmp_path / "isolated-gpu017").exists()
    r = h.client.post(f"/actions/{a['id']}/approve", headers={"Authorization": "Bearer rd"})
    assert r.status_code == 403, r.text  # a read token may not approve
    r = h.client.post(f"/actions/{a['id']}/approve")
    assert r.status_code == 200 and r.json()["state"] == "approved", r.text
    assert h.client.post(f"/actions/{a['id']}/approve").status_code == 409  # only once
    assert h.client.post("/actions/99999/approve").status_code == 404
    _drain(h)
    iso = _actions(h)[0]
    assert [(st["step"], st["actor"]) for st in iso["steps"]][:2] == [
        ("proposed", "rankwatch (policy)"),
        ("approved", "admin token"),
    ]
    assert iso["state"] == "succeeded" and (tmp_path / "isolated-gpu017").exists()
    assert _suspect(h, s["id"])["status"] == "isolated"
    # under approve the recovery the policy asks for is proposed too, and waits for its own approval
    assert [(a["type"], a["state"]) for a in _actions(h)] == [("isolate", "succeeded"), ("restart", "proposed")]


def test_failed_actuator_step_is_recorded_as_failed(rem: Callable[..., Harness], tmp_path: Path) -> None:
    h = rem()
    _policy(h, mode="auto", actuator="command", actuator_options={"templates": {"isolate": ["false"]}})
    s = h.open(Finding(key="slow-3", ranks=[3], nodes=["gpu017"]))
    _drain(h)
    (a,) = _actions(h)
    assert a["state"] == "failed" and "(exit 1)" in a["error"], a
    assert _suspect(h, s["id"])["status"] == "active"


def test_standby_pool_swap_and_release(rem: Callable[..., Harness], tmp_path: Path) -> None:
    h = rem()
    _policy(h, **_touch_policy(tmp_path))
    assert h.client.post("/standby", json={"node": "spare1"}).status_code == 201
    assert h.client.post("/standby", json={"node": "spare2", "cluster": "west"}).status_code == 201
    assert [x["node"] for x in h.client.get("/standby").json()] == ["spare1", "spare2"]
    assert [x["node"] for x in h.client.get("/standby", params={"cluster": "west"}).json()] == ["spare2"]
    r = h.client.post(f"/jobs/{JOB}/actions", json={"type": "swap", "node": "gpu017"})
    assert r.json()["state"] == "approved"
    _drain(h)
    a = h.client.get(f"/actions/{r.json()['id']}").json()
    assert a["state"] == "succeeded" and a["steps"][2]["data"]["standby"] == "spare1", a
    pool = {x["node"]: x for x in h.client.get("/standby").json()}
    assert pool["spare1"]["state"] == "used" and pool["spare1"]["job_id"] == JOB
    assert pool["spare2"]["state"] == "free"
    assert (tmp_path / "swapped-gpu017").exists()
    # release gpu017 through the actuator that isolated it
    r = h.client.post(f"/jobs/{JOB}/actions", json={"type": "isolate", "node": "gpu016"})
    _drain(h)
    assert (tmp_path / "isolated-gpu016").exists()
    r = h.client.post("/nodes/gpu016/release", json={})
    assert r.status_code == 200 and r.json()["state"] == "succeeded" and r.json()["type"] == "release", r.text
    assert not (tmp_path / "isolated-gpu016").exists()
    assert h.client.post("/nodes/never/release", json={}).status_code == 404
    with h.collector.db.sessions() as s:
        assert h.collector.actions.isolated_nodes(s, JOB) == {"gpu017"}
    assert h.client.delete("/standby/west/spare2").status_code == 204
    assert h.client.delete("/standby/west/spare2").status_code == 404
    assert [x["node"] for x in h.client.get("/standby").json()] == ["spare1"]


def test_policy_defaults_from_settings_and_validation(
    harness: Callable[..., Harness], db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANKWATCH_POLICY", "approve")
    monkeypatch.setenv("RANKWATCH_ACTUATOR", "slurm")
    s = Settings()
    assert (s.policy, s.actuator) == ("approve", "slurm")
    h = harness(db=db_url, policy="approve", actuator="slurm")
    _ranks(h)
    p = h.client.get(f"/jobs/{JOB}/policy").json()
    assert (p["mode"], p["actuator"], p["recovery"]) == ("approve", "slurm", "restart")
    p = _policy(h, mode="auto", budget=1)
    assert (p["mode"], p["actuator"], p["budget"]) == ("auto", "slurm", 1)
    assert h.client.get(f"/jobs/{JOB}/policy").json()["budget"] == 1
    assert h.client.put(f"/jobs/{JOB}/policy", json={"mode": "yolo"}).status_code == 422
    assert h.client.put(f"/jobs/{JOB}/policy", json={"kinds": ["bogus"]}).status_code == 422
    assert h.client.put(f"/jobs/{JOB}/policy", json={"actuator": "ssh"}).status_code == 422
    assert h.client.put("/jobs/nope/policy", json={"mode": "auto"}).status_code == 404
    with pytest.raises(ValueError):
        Settings(policy="yolo")
    with pytest.raises(ValueError):
        Settings(actuator="ssh")


class _LiveJob:
    """What the executor reads of a live job while it waits for a restart: ranks and command results."""

    def __init__(self, ranks: list[Any], results: dict[str, str | None] | None = None) -> None:
        import threading

        self.lock = threading.Lock()
        self.ranks = {r.rank: r for r in ranks}
        self.results = results or {}

    def command_status(self) -> list[dict[str, Any]]:
        return [{"id": k, "result": v} for k, v in self.results.items()]


def _waiter(job: _LiveJob) -> Executor:
    from types import SimpleNamespace

    ex = Executor(SimpleNamespace(actions=None, jobs={"j": job}))  # type: ignore[arg-type]
    ex.comeback_timeout_s = 1.5
    return ex


def test_a_restart_succeeds_only_once_the_new_processes_step() -> None:
    import threading

    from rankwatch.collector.jobs import RankInfo

    old = RankInfo(rank=0, node="n", incarnation="old", first_seen=0, last_seen=0, ops=40)
    job = _LiveJob([old])
    ex = _waiter(job)
    # the restarted process said hello (the collector keeps the rank's op count across incarnations)
    job.ranks[0] = RankInfo(rank=0, node="n", incarnation="new", first_seen=0, last_seen=0, ops=40, restart=1)
    res = ex._await_comeback("j", None, {"old"}, since="the exit commands")
    assert not res.ok and "did not come back" in res.output

    def step() -> None:
        time.sleep(0.5)
        job.ranks[0].ops += 3

    threading.Thread(target=step).start()
    res = ex._await_comeback("j", None, {"old"}, since="the exit commands")
    assert res.ok and "ranks [0] on ['n'] stepping again (restart 1)" in res.output, res.output
    assert "after the exit commands" in res.output


def test_a_restart_whose_exit_commands_were_ignored_fails_at_once() -> None:
    from rankwatch.collector.jobs import RankInfo

    job = _LiveJob(
        [RankInfo(rank=0, node="n", incarnation="old", first_seen=0, last_seen=0, ops=40)],
        {"c1": "ignored", "c2": "ignored", "other": None},
    )
    ex = _waiter(job)
    ex.comeback_timeout_s = 30
    t0 = time.monotonic()
    res = ex._await_comeback("j", None, {"old"}, commands=["c1", "c2"])
    assert not res.ok and "ignored the exit command" in res.output and time.monotonic() - t0 < 5


def test_exit_margin_is_five_seconds_of_the_world_groups_ops_whatever_the_world_size() -> None:
    from rankwatch.api.remediation import _margin

    def ops(ranks: int) -> list[dict[str, Any]]:  # 20 ops a second, each recorded by every rank
        return [
            {"rank": r, "seq": s, "t_enter_ns": int(s * 0.05e9) + r * 1000} for s in range(1, 101) for r in range(ranks)
        ]

    assert _margin(ops(1)) == _margin(ops(2)) == _margin(ops(8))  # not multiplied by the ranks
    assert 100 <= _margin(ops(8)) <= 101  # 5 s at 20 ops a second
    assert _margin([]) == 5 and _margin(ops(1)[:1]) == 5
