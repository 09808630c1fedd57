"""Webhooks end to end: real receivers on loopback, suspects written through the outbox, the real worker.

Every test drives suspects through ``SuspectStore`` (the transaction that writes the outbox event)
and waits for the worker to deliver them over real HTTP to a receiver on 127.0.0.1
(``RANKWATCH_WEBHOOK_ALLOW=127.0.0.1`` lets the SSRF guard pass it).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import pytest
from paging_support import Finding, Reply
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from rankwatch.api import payloads
from rankwatch.collector.db import open_database
from rankwatch.collector.suspects import SuspectStore


def _delivered(n: int) -> Any:
    return lambda ds: len(ds) >= n and all(d["status"] == "delivered" for d in ds)


def test_every_generic_delivery_is_signed_and_verifies(harness: Any, receiver: Any) -> None:
    h, rx = harness(), receiver()
    created = h.subscribe(url=rx.url, description="ops")
    secret = created["secret"]
    assert secret.startswith("whsec_") and created["has_secret"]
    # the secret is shown once: never again
    assert "secret" not in h.client.get(f"/webhooks/{created['id']}").json()
    assert secret not in h.client.get("/webhooks").text

    opened = h.open(Finding(key="straggler:3"))
    shown = h.client.get(f"/suspects/{opened['id']}").json()
    h.resolve("straggler:3")
    assert h.client.post(f"/webhooks/{created['id']}/test").status_code == 202
    got = rx.wait_for(3)
    h.wait_deliveries(created["id"], _delivered(3))

    verifier = Webhook(secret)  # the Standard Webhooks reference library, not our code
    for req in got:
        verifier.verify(req.body, req.headers)
        assert req.headers["webhook-signature"].startswith("v1,")
        with pytest.raises(WebhookVerificationError):  # and a tampered body does not verify
            verifier.verify(req.body[:-1] + b" }", req.headers)
    assert len({r.headers["webhook-id"] for r in got}) == 3
    types = sorted(r.json()["type"] for r in got)
    assert types == ["suspect.opened", "suspect.resolved", "webhook.test"]
    first = next(r.json() for r in got if r.json()["type"] == "suspect.opened")
    # the suspect as GET /suspects/{id} shows it (less its history), and a link to it
    assert first["data"]["suspect"] == {k: v for k, v in shown.items() if k != "history"}
    assert first["links"]["suspect"] == f"https://rankwatch.example/suspects/{opened['id']}"
    assert first["job_id"] == "job-a" and first["event_id"] >= 1


def test_the_readme_snippet_verifies_a_delivery(harness: Any, receiver: Any) -> None:
    from pathlib import Path

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    snippet = readme.split("<!-- verify-snippet -->", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    namespace: dict[str, Any] = {}
    exec(snippet, namespace)
    verify = namespace["verify"]

    h, rx = harness(), receiver()
    secret = h.subscribe(url=rx.url)["secret"]
    h.open(Finding(key="straggler:3"))
    (req,) = rx.wait_for(1)
    assert verify(secret, req.headers, req.body) is True
    assert verify(secret, req.headers, req.body + b" ") is False
    assert verify(secret, {**req.headers, "webhook-timestamp": str(int(time.time()) - 3600)}, req.body) is False


def test_pagerduty_trigger_then_resolve_with_the_same_dedup_key(harness: Any, receiver: Any) -> None:
    h = harness()
    # the trigger fails once: the resolve must still arrive after it, never before
    rx = receiver(script=[Reply(500), Reply(202)], default=Reply(202, body=b'{"status":"success"}'))
    key = "R0UT1NGKEY0123456789abcdef012345"
    sub = h.subscribe(kind="pagerduty", url=rx.url, routing_key=key)
    assert sub["events"] == ["suspect.opened", "suspect.resolved"] and sub["has_routing_key"]
    assert key not in h.client.get("/webhooks").text

    s = h.open(Finding(key="hang:3", kind="noncomm_hang", slowdown=None, evidence={"stack": "train.py:42"}))
    h.resolve("hang:3")
    got = [r.json() for r in rx.wait_for(3)]
    h.wait_deliveries(sub["id"], _delivered(2))
    assert [b["event_action"] for b in got] == ["trigger", "trigger", "resolve"]
    trigger, resolve = got[1], got[2]
    assert trigger["dedup_key"] == resolve["dedup_key"] == f"rankwatch/job-a/suspect/{s['id']}"
    assert trigger["routing_key"] == resolve["routing_key"] == key
    p = trigger["payload"]
    assert p["summary"] == "Hang in job job-a: rank 3 on node gpu017 — job stuck"
    assert p["severity"] == "critical" and p["source"] == "gpu017"
    assert p["custom_details"]["evidence"] == {"stack": "train.py:42"}
    assert p["custom_details"]["suspect_url"] == f"https://rankwatch.example/suspects/{s['id']}"
    assert trigger["links"][0]["href"] == p["custom_details"]["suspect_url"]
    # a test message leaves nothing open: a trigger, then its resolve
    assert h.client.post(f"/webhooks/{sub['id']}/test").status_code == 202
    test_trigger, test_resolve = (r.json() for r in rx.wait_for(5)[3:])
    assert (test_trigger["event_action"], test_resolve["event_action"]) == ("trigger", "resolve")
    assert test_trigger["dedup_key"] == test_resolve["dedup_key"] and test_trigger["payload"]["severity"] == "info"


def test_pagerduty_severity_and_summary_follow_the_slowdown() -> None:
    slow = {"id": 7, "job_id": "llm", "kind": "noncomm_slow", "level": "rank", "ranks": [5], "nodes": ["n1"]}
    assert payloads.pagerduty_severity({**slow, "slowdown": 1.1}) == "warning"
    assert payloads.pagerduty_severity({**slow, "slowdown": 1.4}) == "error"
    assert payloads.pagerduty_severity({**slow, "kind": "rank_dead"}) == "critical"
    assert payloads.summary({**slow, "slowdown": 1.4}) == "Straggler in job llm: rank 5 on node n1 — job 1.40x slower"
    link = {**slow, "kind": "comm_slow", "level": "link", "link": ["n1", "n2"], "slowdown": 1.2}
    assert payloads.summary(link) == "Slow communication in job llm: link n1 <-> n2 — job 1.20x slower"


def test_a_receiver_that_fails_twice_gets_the_event_exactly_once(harness: Any, receiver: Any) -> None:
    h = harness()
    rx = receiver(script=[Reply(500), Reply(503)], default=Reply(200))
    sub = h.subscribe(url=rx.url)
    h.open(Finding(key="straggler:3"))
    got = rx.wait_for(3)
    (d,) = h.wait_deliveries(sub["id"], _delivered(1))
    time.sleep(0.6)  # well past the retry delays: nothing more comes
    assert len(rx.requests) == 3
    processed = {r.headers["webhook-id"] for r in got if r.answered == 200}  # a receiver that dedupes on the id
    assert len({r.headers["webhook-id"] for r in got}) == 1 and processed == {d["msg_id"]}
    assert [a["status_code"] for a in d["attempt_log"]] == [500, 503, 200]
    assert d["attempts"] == 3 and d["delivered_at"] is not None


def test_a_dead_receiver_ends_in_a_dead_delivery_that_can_be_replayed(harness: Any, receiver: Any) -> None:
    h = harness()
    rx = receiver(default=Reply(500, body=b"database on fire"))
    sub = h.subscribe(url=rx.url)
    h.open(Finding(key="straggler:3"))
    (d,) = h.wait_deliveries(sub["id"], lambda ds: bool(ds) and ds[0]["status"] == "dead")
    assert len(d["attempt_log"]) == 3 == h.settings.webhook_max_attempts
    assert all(a["status_code"] == 500 and "database on fire" in a["error"] for a in d["attempt_log"])
    assert h.deliveries(sub["id"], status="dead")[0]["id"] == d["id"]
    time.sleep(0.5)
    assert len(rx.requests) == 3  # dead means no more attempts

    rx.default = Reply(200)
    r = h.client.post(f"/webhooks/{sub['id']}/deliveries/{d['id']}/retry")
    assert r.status_code == 202, r.text
    (d2,) = h.wait_deliveries(sub["id"], _delivered(1))
    assert d2["attempts"] == 4 and d2["attempt_log"][-1]["status_code"] == 200
    ids = {req.headers["webhook-id"] for req in rx.wait_for(4)}
    assert ids == {d["msg_id"]}  # the replay is the same message
    assert h.client.post(f"/webhooks/{sub['id']}/deliveries/999/retry").status_code == 404


def test_retry_after_is_honoured(harness: Any, receiver: Any) -> None:
    h = harness()
    rx = receiver(script=[Reply(429, headers={"Retry-After": "1"})], default=Reply(200))
    sub = h.subscribe(url=rx.url)
    h.open(Finding(key="straggler:3"))
    first, second = rx.wait_for(2)
    h.wait_deliveries(sub["id"], _delivered(1))
    # the backoff alone would retry within 0.05 s; the receiver asked for a second
    assert 0.95 <= second.at - first.at < 5


def test_410_disables_the_subscription(harness: Any, receiver: Any) -> None:
    h = harness()
    rx = receiver(default=Reply(410))
    sub = h.subscribe(url=rx.url)
    h.open(Finding(key="straggler:3"))
    (d,) = h.wait_deliveries(sub["id"], lambda ds: bool(ds) and ds[0]["status"] == "dead")
    assert d["attempts"] == 1
    shown = h.client.get(f"/webhooks/{sub['id']}").json()
    assert shown["enabled"] is False and "410" in shown["disabled_reason"]
    h.open(Finding(key="straggler:4", ranks=[4]))
    time.sleep(0.4)
    assert len(h.deliveries(sub["id"])) == 1 and len(rx.requests) == 1  # nothing new goes to it
    r = h.client.post(f"/webhooks/{sub['id']}/deliveries/{d['id']}/retry")
    assert r.status_code == 409 and "disabled" in r.json()["detail"]


def test_one_receiver_that_never_answers_does_not_delay_another(harness: Any, receiver: Any) -> None:
    h = harness(webhook_timeout_s=30.0)
    stuck, fine = receiver(default=Reply(hang=True)), receiver()
    a = h.subscribe(url=stuck.url)
    b = h.subscribe(url=fine.url)
    t0 = time.monotonic()
    for i in range(6):
        h.open(Finding(key=f"straggler:{i}", ranks=[i]))
    fine.wait_for(6, timeout=5)
    h.wait_deliveries(b["id"], _delivered(6), timeout=5)
    elapsed = time.monotonic() - t0
    assert elapsed < 5  # against a 30 s timeout on the stuck receiver
    # the stuck receiver holds exactly its own per-webhook share in flight, and nothing of it has finished
    stuck.wait_for(h.dispatcher.per_webhook, timeout=5)
    time.sleep(0.3)
    assert len(stuck.requests) == h.dispatcher.per_webhook < 6
    assert all(d["status"] == "pending" and d["attempts"] == 0 for d in h.deliveries(a["id"]))


def test_redirects_are_not_followed(harness: Any, receiver: Any) -> None:
    h = harness()
    target = receiver()
    rx = receiver(default=Reply(302, headers={"Location": target.url}))
    sub = h.subscribe(url=rx.url)
    h.open(Finding(key="straggler:3"))
    rx.wait_for(1)
    d = h.wait_deliveries(sub["id"], lambda ds: bool(ds) and ds[0]["attempts"] >= 1)[0]
    assert d["attempt_log"][0]["status_code"] == 302
    assert "redirects are not followed" in d["attempt_log"][0]["error"]
    time.sleep(0.3)
    assert target.requests == []


def test_slack_and_alertmanager_bodies(harness: Any, receiver: Any) -> None:
    h = harness()
    slack, am = receiver(), receiver()
    s_sub = h.subscribe(kind="slack", url=slack.url + "/services/T000/B000/XXXXSECRET")
    a_sub = h.subscribe(kind="alertmanager", url=am.url)
    s = h.open(Finding(key="straggler:3", slowdown=1.35))
    h.resolve("straggler:3")
    msgs = [r.json() for r in slack.wait_for(2)]
    assert msgs[0]["text"].startswith(":rotating_light: Straggler in job job-a: rank 3 on node gpu017")
    assert "1.35x slower" in msgs[0]["text"]
    assert msgs[1]["text"].startswith(":white_check_mark: Resolved: Straggler in job job-a")
    blocks = msgs[0]["blocks"]
    assert blocks[0]["type"] == "header" and blocks[1]["type"] == "section"
    button = blocks[2]["elements"][0]
    assert button["url"] == f"https://rankwatch.example/suspects/{s['id']}"
    # the Slack URL is its secret: shown without its path
    shown = h.client.get(f"/webhooks/{s_sub['id']}").json()
    assert "XXXXSECRET" not in json.dumps(shown) and shown["url"].endswith("/…")

    firing, resolved = (r.json() for r in am.wait_for(2))
    assert firing["version"] == resolved["version"] == "4"
    assert (firing["status"], resolved["status"]) == ("firing", "resolved")
    fa, ra = firing["alerts"][0], resolved["alerts"][0]
    assert fa["fingerprint"] == ra["fingerprint"] and len(fa["fingerprint"]) == 16
    assert fa["labels"] == ra["labels"]
    assert fa["labels"]["alertname"] == "RankwatchSuspect" and fa["labels"]["kind"] == "noncomm_slow"
    assert fa["endsAt"] == "0001-01-01T00:00:00Z" and ra["endsAt"] != fa["endsAt"]
    assert firing["groupKey"] == resolved["groupKey"]
    assert "rank 3 on node gpu017" in fa["annotations"]["summary"]
    h.wait_deliveries(a_sub["id"], _delivered(2))


def test_a_suspects_next_step_reaches_every_pager(harness: Any, receiver: Any) -> None:
    # what on-call checks next (a rank's hang its node's would look like) is in the page itself,
    # not only behind the link; PagerDuty keeps it when the evidence is cut for size
    h = harness()
    slack, am, pd = receiver(), receiver(), receiver(default=Reply(202, body=b'{"status":"success"}'))
    h.subscribe(kind="slack", url=slack.url + "/services/T000/B000/XXXXSECRET")
    h.subscribe(kind="alertmanager", url=am.url)
    h.subscribe(kind="pagerduty", url=pd.url, routing_key="R0UT1NGKEY0123456789abcdef012345")
    step = "every other rank of gpu017 waits on rank 3 inside group 2 (tp): check gpu017 (nvidia-smi, dmesg)"
    evidence = {"node_alike": True, "next_step": step, "stack": "x" * 600_000}
    h.open(Finding(key="hang:3", kind="noncomm_hang", slowdown=None, evidence=evidence))
    blocks = slack.wait_for(1)[0].json()["blocks"]
    assert blocks[2] == {"type": "section", "text": {"type": "mrkdwn", "text": f"*Next step*\n{step}"}}
    assert blocks[3]["type"] == "actions"
    assert am.wait_for(1)[0].json()["alerts"][0]["annotations"]["next_step"] == step
    details = pd.wait_for(1)[0].json()["payload"]["custom_details"]
    assert details["evidence"]["truncated"] is True and details["next_step"] == step
    # a suspect without one pages as before
    assert payloads.next_step({"evidence": {"stack": "train.py:42"}}) is None


def test_alertmanager_fingerprint_is_prometheus_s() -> None:
    # Prometheus: model.LabelSet{"foo": "bar"}.Fingerprint() == 0x83e... computed by FNV-1a over
    # name 0xff value 0xff; the empty set hashes to the FNV offset basis.
    assert payloads.fingerprint({}) == "cbf29ce484222325"
    one = payloads.fingerprint({"a": "b"})
    assert one == payloads.fingerprint({"a": "b"}) != payloads.fingerprint({"a": "c"})
    assert payloads.fingerprint({"a": "1", "b": "2"}) == payloads.fingerprint({"b": "2", "a": "1"})


def test_filters_and_follow_ups(harness: Any, receiver: Any) -> None:
    h = harness()
    rx = {n: receiver() for n in ("score", "kind", "job", "all")}
    score = h.subscribe(url=rx["score"].url, min_score=0.8)
    h.subscribe(url=rx["kind"].url, kinds=["comm_slow"])
    h.subscribe(url=rx["job"].url, job_id="job-b")
    h.subscribe(url=rx["all"].url)
    high = Finding(key="straggler:3", score=0.9)
    h.open(high)
    h.open(Finding(key="straggler:4", ranks=[4], score=0.5))
    high.score = 0.3  # the score falls before it resolves: the resolve still follows the trigger
    h.resolve("straggler:3")
    h.resolve("straggler:4")
    rx["all"].wait_for(4)
    h.wait_deliveries(score["id"], _delivered(2))
    time.sleep(0.3)
    got = [(r.json()["type"], r.json()["data"]["suspect"]["ranks"]) for r in rx["score"].requests]
    assert got == [("suspect.opened", [3]), ("suspect.resolved", [3])]
    assert rx["kind"].requests == [] and rx["job"].requests == []


def test_pending_deliveries_survive_a_restart(harness: Any, receiver: Any, tmp_path: Any) -> None:
    rx = receiver(script=[Reply(hang=True)], default=Reply(200))
    h = harness(webhook_timeout_s=30.0)
    sub = h.subscribe(url=rx.url)
    h.open(Finding(key="straggler:3"))
    first = rx.wait_for(1)[0]
    h.close()  # the service stops with the attempt in flight
    # while it is down, the detector's last pass writes another event to the outbox
    db = open_database(h.settings.database_url)
    h.findings["job-a"].append(Finding(key="straggler:5", ranks=[5]))
    SuspectStore(db).reconcile("job-a", h.findings["job-a"], True, time.time())
    db.close()

    h2 = harness()
    # a clean stop hands the in-flight attempt back at once; if the stop could not (a loaded
    # machine, the worker slow to wind down), its claim lapses after webhook_timeout_s: either way
    # it is retried, with the same webhook-id
    got = rx.wait_for(3, timeout=45)
    ds = h2.wait_deliveries(sub["id"], _delivered(2), timeout=45)
    assert len(ds) == 2
    ids = [r.headers["webhook-id"] for r in got]
    # the same message is retried after the restart (in any order with the new event's delivery)
    assert ids[0] == first.headers["webhook-id"] and first.headers["webhook-id"] in ids[1:]
    assert len(set(ids)) == 2
    assert {r.json()["data"]["suspect"]["ranks"][0] for r in got} == {3, 5}


def test_secrets_are_never_logged(harness: Any, receiver: Any, caplog: Any) -> None:
    caplog.set_level(logging.DEBUG)
    h = harness()
    key = "R0UT1NGKEYabcdef0123456789abcdef01"
    rx = receiver(script=[Reply(500, body=b"no such hook /services/T1/B1/slackpathsecret")])
    rx_pd = receiver(script=[Reply(500, body=f"invalid routing key {key}".encode())])  # a receiver echoing it
    g = h.subscribe(url=receiver().url + "?token=querysecret123")
    pd = h.subscribe(kind="pagerduty", url=rx_pd.url, routing_key=key)
    sl = h.subscribe(kind="slack", url=rx.url + "/services/T1/B1/slackpathsecret")
    h.open(Finding(key="straggler:3"))
    for sub in (g, pd, sl):
        h.wait_deliveries(sub["id"], _delivered(1))
    logged = h.deliveries(pd["id"])[0]["attempt_log"][0]["error"]
    assert logged == "HTTP 500: invalid routing key [redacted]"
    everything = caplog.text + json.dumps([h.deliveries(s["id"]) for s in (g, pd, sl)]) + h.client.get("/webhooks").text
    for secret in (g["secret"], key, "slackpathsecret", "querysecret123"):
        assert secret not in everything
    assert "webhooks: " in caplog.text  # the worker did log (the check above is not vacuous)
