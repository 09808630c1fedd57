"""What a webhook says, in each of the four formats: generic (signed JSON), PagerDuty, Slack, Alertmanager.

``render`` turns one outbox event into the JSON body for one subscription kind, or None when that
kind has nothing to say about it (PagerDuty and Alertmanager page about suspects; they skip action
events). Every format is built from the event alone, so a retry or a replay sends the same body.

Event types (``EventRow.type``): ``suspect.opened``, ``suspect.resolved``, ``suspect.isolated``,
``action.proposed``, ``action.approved``, ``action.refused``, ``action.started``,
``action.finished``; the test endpoint sends ``webhook.test``. Generic and
Slack bodies handle any type, so a new event type needs no change here to be delivered.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from rankwatch import __version__
from rankwatch.collector.jobs import iso

__all__ = [
    "DEFAULT_EVENTS",
    "EVENT_TYPES",
    "KIND_EVENTS",
    "PAGERDUTY_URL",
    "WEBHOOK_KINDS",
    "Event",
    "dedup_key",
    "fingerprint",
    "order_key",
    "render",
    "render_test",
    "summary",
]

WEBHOOK_KINDS = ("generic", "pagerduty", "slack", "alertmanager")
EVENT_TYPES = (
    "suspect.opened",
    "suspect.resolved",
    "suspect.isolated",
    "action.proposed",
    "action.approved",
    "action.refused",
    "action.started",
    "action.finished",
)
DEFAULT_EVENTS = (
    "suspect.opened",
    "suspect.resolved",
    "action.proposed",
    "action.refused",
    "action.started",
    "action.finished",
)
SUSPECT_EVENTS = ("suspect.opened", "suspect.resolved", "suspect.isolated")
KIND_EVENTS = {
    "generic": EVENT_TYPES,
    "slack": EVENT_TYPES,
    "pagerduty": SUSPECT_EVENTS,
    "alertmanager": SUSPECT_EVENTS,
}
PAGERDUTY_URL = "https://events.pagerduty.com/v2/enqueue"
PAGERDUTY_MAX_BYTES = 500_000  # PagerDuty refuses events over 512 KB
ERROR_SLOWDOWN = 1.25  # a slow suspect that makes the job this much slower pages as "error", else "warning"

TITLES = {
    "noncomm_slow": "Straggler",
    "comm_slow": "Slow communication",
    "noncomm_hang": "Hang",
    "comm_hang": "Communication hang",
    "rank_dead": "Dead rank",
}
ZERO_TIME = "0001-01-01T00:00:00Z"  # Alertmanager's endsAt of a firing alert


@dataclass(frozen=True, slots=True)
class Event:
    """One outbox event, as the delivery worker read it."""

    type: str
    at: float
    job_id: str
    payload: dict[str, Any] = field(default_factory=dict)
    id: int | None = None
    suspect_id: int | None = None
    action_id: int | None = None

    @property
    def suspect(self) -> dict[str, Any] | None:
        s = self.payload.get("suspect")
        return s if isinstance(s, dict) else None


def order_key(event: Event) -> str | None:
    """Events with the same key reach a subscription in order (a resolve never overtakes its trigger)."""
    if event.suspect_id is not None:
        return f"suspect:{event.suspect_id}"
    if event.action_id is not None:
        return f"action:{event.action_id}"
    return None


def render(kind: str, event: Event, *, base_url: str, webhook_id: int, routing_key: str | None = None) -> Any:
    """The JSON body ``kind`` sends for ``event``, or None when it sends nothing for it."""
    if kind == "generic":
        return _generic(event, base_url)
    if kind == "slack":
        return _slack(event, base_url)
    if kind == "pagerduty":
        return _pagerduty(event, base_url, routing_key or "")
    if kind == "alertmanager":
        return _alertmanager(event, base_url, webhook_id)
    raise ValueError(f"unknown webhook kind {kind!r}")


def render_test(
    kind: str, *, base_url: str, webhook_id: int, now: float, routing_key: str | None = None
) -> list[tuple[str, Any]]:
    """What ``POST /webhooks/{id}/test`` sends: (event type, body) pairs, in order.

    PagerDuty and Alertmanager get a trigger and then its resolve, so a test leaves nothing open.
    """
    msg = f"rankwatch test message for webhook #{webhook_id}: no action needed"
    if kind == "generic":
        body = {"type": "webhook.test", "timestamp": iso(now), "data": {"webhook": webhook_id, "message": msg}}
        return [("webhook.test", body)]
    if kind == "slack":
        return [("webhook.test", {"text": f":white_check_mark: {msg}", "blocks": [_section(f"*{_esc(msg)}*")]})]
    if kind == "pagerduty":
        key = f"rankwatch/test/webhook-{webhook_id}/{int(now * 1000)}"
        trigger = {
            "routing_key": routing_key or "",
            "event_action": "trigger",
            "dedup_key": key,
            "client": "rankwatch",
            "client_url": base_url,
            "payload": {"summary": msg, "source": "rankwatch", "severity": "info", "timestamp": iso(now)},
        }
        resolve = {"routing_key": routing_key or "", "event_action": "resolve", "dedup_key": key}
        return [("webhook.test", trigger), ("webhook.test", resolve)]
    if kind == "alertmanager":
        labels = {"alertname": "RankwatchTest", "severity": "info", "webhook_id": str(webhook_id)}
        alert = {
            "labels": labels,
            "annotations": {"summary": msg},
            "startsAt": iso(now),
            "generatorURL": base_url,
            "fingerprint": fingerprint(labels),
        }
        firing = _am_message(webhook_id, base_url, "firing", {**alert, "status": "firing", "endsAt": ZERO_TIME})
        resolved = _am_message(webhook_id, base_url, "resolved", {**alert, "status": "resolved", "endsAt": iso(now)})
        return [("webhook.test", firing), ("webhook.test", resolved)]
    raise ValueError(f"unknown webhook kind {kind!r}")


# -- words an on-call can act on --------------------------------------------------------------------
def _ranks(ranks: Sequence[Any]) -> str:
    rs = sorted(int(r) for r in ranks)
    if len(rs) == 1:
        return f"rank {rs[0]}"
    if rs and rs == list(range(rs[0], rs[-1] + 1)):
        return f"ranks {rs[0]}-{rs[-1]}"
    shown = ", ".join(str(r) for r in rs[:8])
    return f"ranks {shown}" + (f" and {len(rs) - 8} more" if len(rs) > 8 else "")


def _nodes(nodes: Sequence[Any]) -> str:
    ns = [str(n) for n in nodes]
    if not ns:
        return ""
    shown = ", ".join(ns[:4]) + (f" and {len(ns) - 4} more" if len(ns) > 4 else "")
    return f"node {shown}" if len(ns) == 1 else f"nodes {shown}"


def where(s: dict[str, Any]) -> str:
    """Which rank, node or link: ``rank 3 on node gpu017``, ``link gpu017 <-> gpu023``."""
    level, ranks, nodes = s.get("level"), s.get("ranks") or [], s.get("nodes") or []
    if level == "link" and s.get("link"):
        return "link " + " <-> ".join(str(n) for n in s["link"])
    if level == "node" and nodes:
        return _nodes(nodes) + (f" ({_ranks(ranks)})" if ranks else "")
    if ranks:
        return _ranks(ranks) + (f" on {_nodes(nodes)}" if nodes else "")
    return _nodes(nodes) or "unknown location"


def effect(s: dict[str, Any]) -> str:
    """How much it hurts the job: ``job 1.35x slower``, ``job stuck``."""
    kind, slowdown = s.get("kind"), s.get("slowdown")
    if kind in ("noncomm_hang", "comm_hang"):
        return "job stuck"
    if kind == "rank_dead":
        return "no heartbeat; the job cannot make progress"
    if isinstance(slowdown, (int, float)):
        return f"job {slowdown:.2f}x slower"
    return "job slower"


def summary(s: dict[str, Any], event_type: str = "suspect.opened") -> str:
    """One line for a pager: what, which job, which rank/node/link, how much slower."""
    title = TITLES.get(str(s.get("kind")), str(s.get("kind")))
    line = f"{title} in job {s.get('job_id')}: {where(s)}"
    if event_type == "suspect.resolved":
        lasted = _duration(s.get("detected_at"), s.get("resolved_at"))
        return f"Resolved: {line}" + (f" (lasted {lasted})" if lasted else "")
    if event_type == "suspect.isolated":
        return f"Isolated: {line}"
    return f"{line} — {effect(s)}"


def next_step(s: dict[str, Any]) -> str | None:
    """What on-call should check next, where the detector knows its answer is not the whole story
    (places the timings cannot split, a rank's hang its node's would look like)."""
    ev = s.get("evidence")
    step = ev.get("next_step") if isinstance(ev, dict) else None
    return step if isinstance(step, str) and step else None


def pagerduty_severity(s: dict[str, Any]) -> str:
    """Hang and dead: critical; slow: error from a 1.25x slowdown, warning below."""
    kind, slowdown = s.get("kind"), s.get("slowdown")
    if kind in ("noncomm_hang", "comm_hang", "rank_dead"):
        return "critical"
    if isinstance(slowdown, (int, float)) and slowdown >= ERROR_SLOWDOWN:
        return "error"
    return "warning"


def _duration(start: Any, end: Any) -> str | None:
    a, b = _parse_iso(start), _parse_iso(end)
    if a is None or b is None or b < a:
        return None
    secs = int(b - a)
    if secs < 60:
        return f"{secs}s"
    if secs < 3600:
        return f"{secs // 60}m{secs % 60:02d}s"
    return f"{secs // 3600}h{secs % 3600 // 60:02d}m"


def _parse_iso(value: Any) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def suspect_url(base_url: str, s: dict[str, Any]) -> str:
    return f"{base_url.rstrip('/')}/suspects/{s.get('id')}"


# -- generic -----------------------------------------------------------------------------------------
def _generic(event: Event, base_url: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "type": event.type,
        "timestamp": iso(event.at),
        "event_id": event.id,
        "job_id": event.job_id,
        "data": {k: v for k, v in event.payload.items() if k != "type"},
    }
    if event.suspect is not None:
        body["links"] = {"suspect": suspect_url(base_url, event.suspect)}
    return body


# -- PagerDuty Events API v2 ------------------------------------------------------------------------
def dedup_key(s: dict[str, Any]) -> str:
    """The same key for a suspect's trigger and resolve (at most 255 characters)."""
    job = str(s.get("job_id"))
    if len(job) > 160:
        job = job[:120] + "~" + hashlib.sha256(job.encode()).hexdigest()[:16]
    return f"rankwatch/{job}/suspect/{s.get('id')}"


def _pagerduty(event: Event, base_url: str, routing_key: str) -> dict[str, Any] | None:
    s = event.suspect
    if s is None or event.type not in SUSPECT_EVENTS:
        return None
    if event.type == "suspect.resolved":
        return {"routing_key": routing_key, "event_action": "resolve", "dedup_key": dedup_key(s)}
    link = suspect_url(base_url, s)
    nodes = s.get("nodes") or []
    details = {
        "job_id": s.get("job_id"),
        "kind": s.get("kind"),
        "level": s.get("level"),
        "ranks": s.get("ranks"),
        "nodes": nodes,
        "link": s.get("link"),
        "status": s.get("status"),
        "score": s.get("score"),
        "slowdown": s.get("slowdown"),
        "first_seen": s.get("first_seen"),
        "detected_at": s.get("detected_at"),
        "suspect_url": link,
        "evidence": s.get("evidence"),
    }
    if step := next_step(s):
        details["next_step"] = step  # kept when the evidence is cut for size
    body = {
        "routing_key": routing_key,
        "event_action": "trigger",
        "dedup_key": dedup_key(s),
        "client": f"rankwatch {__version__}",
        "client_url": link,
        "links": [{"href": link, "text": f"rankwatch suspect #{s.get('id')}"}],
        "payload": {
            "summary": summary(s, event.type)[:1024],
            "source": str(nodes[0]) if nodes else f"job {s.get('job_id')}",
            "severity": pagerduty_severity(s),
            "timestamp": s.get("detected_at") or iso(event.at),
            "component": where(s),
            "group": str(s.get("job_id")),
            "class": str(s.get("kind")),
            "custom_details": details,
        },
    }
    if len(json.dumps(body)) > PAGERDUTY_MAX_BYTES:
        details["evidence"] = {"truncated": True, "full": link}
    return body


# -- Slack incoming webhook -------------------------------------------------------------------------
def _esc(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": text[:3000]}}


def _slack(event: Event, base_url: str) -> dict[str, Any]:
    s = event.suspect
    if s is None:
        text = f"rankwatch: {event.type} in job {event.job_id}"
        detail = json.dumps({k: v for k, v in event.payload.items() if k != "type"}, indent=1, default=str)
        return {"text": text, "blocks": [_section(f"*{_esc(text)}*"), _section(f"```{_esc(detail[:2800])}```")]}
    icon = {"suspect.opened": ":rotating_light:", "suspect.resolved": ":white_check_mark:"}.get(event.type, ":wrench:")
    line = summary(s, event.type)
    link = suspect_url(base_url, s)
    slowdown = s.get("slowdown")
    fields = [
        f"*Job*\n{_esc(str(s.get('job_id')))}",
        f"*Where*\n{_esc(where(s))}",
        f"*Kind*\n{_esc(str(s.get('kind')))} ({_esc(str(s.get('level')))})",
        f"*Effect*\n{_esc(effect(s))}" if event.type == "suspect.opened" else f"*Status*\n{_esc(str(s.get('status')))}",
        f"*Score*\n{s.get('score')}",
        f"*Slowdown*\n{slowdown:.2f}x" if isinstance(slowdown, (int, float)) else "*Slowdown*\n-",
    ]
    steps = []
    if event.type == "suspect.opened" and (step := next_step(s)):
        steps = [_section(f"*Next step*\n{_esc(step)[:2900]}")]
    return {
        "text": f"{icon} {line}",
        "blocks": [
            {"type": "header", "text": {"type": "plain_text", "text": f"{icon} {line}"[:150], "emoji": True}},
            {"type": "section", "fields": [{"type": "mrkdwn", "text": f} for f in fields]},
            *steps,
            {
                "type": "actions",
                "elements": [
                    {"type": "button", "text": {"type": "plain_text", "text": "Open suspect"}, "url": link[:3000]}
                ],
            },
            {
                "type": "context",
                "elements": [
                    {
                        "type": "mrkdwn",
                        "text": _esc(f"rankwatch suspect #{s.get('id')} · first seen {s.get('first_seen')}"),
                    }
                ],
            },
        ],
    }


# -- Alertmanager webhook (version 4) -----------------------------------------------------------------
def fingerprint(labels: dict[str, str]) -> str:
    """Prometheus's label-set fingerprint: FNV-1a 64 over sorted name/value pairs, as 16 hex digits."""
    h = 0xCBF29CE484222325
    for name in sorted(labels):
        for part in (name.encode(), b"\xff", labels[name].encode(), b"\xff"):
            for byte in part:
                h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def _am_message(webhook_id: int, base_url: str, status: str, alert: dict[str, Any]) -> dict[str, Any]:
    labels = alert["labels"]
    group = {k: labels[k] for k in ("alertname", "job_id", "suspect_id", "webhook_id") if k in labels}
    group_key = "{}:{" + ", ".join(f'{k}="{v}"' for k, v in sorted(group.items())) + "}"
    return {
        "version": "4",
        "groupKey": group_key,
        "truncatedAlerts": 0,
        "status": status,
        "receiver": f"rankwatch-webhook-{webhook_id}",
        "groupLabels": group,
        "commonLabels": labels,
        "commonAnnotations": alert["annotations"],
        "externalURL": base_url,
        "alerts": [alert],
    }


def _alertmanager(event: Event, base_url: str, webhook_id: int) -> dict[str, Any] | None:
    s = event.suspect
    if s is None or event.type not in SUSPECT_EVENTS:
        return None
    # labels are the alert's identity: nothing in them may change between firing and resolved
    labels = {
        "alertname": "RankwatchSuspect",
        "severity": "critical" if s.get("kind") in ("noncomm_hang", "comm_hang", "rank_dead") else "warning",
        "job_id": str(s.get("job_id")),
        "kind": str(s.get("kind")),
        "level": str(s.get("level")),
        "suspect_id": str(s.get("id")),
    }
    link = suspect_url(base_url, s)
    annotations = {
        "summary": summary(s, event.type),
        "description": f"{TITLES.get(str(s.get('kind')), s.get('kind'))} at {where(s)}: {effect(s)} "
        f"(score {s.get('score')}, first seen {s.get('first_seen')})",
        "where": where(s),
        "ranks": ",".join(str(r) for r in s.get("ranks") or []),
        "nodes": ",".join(str(n) for n in s.get("nodes") or []),
        "slowdown": "" if s.get("slowdown") is None else str(s.get("slowdown")),
        "score": str(s.get("score")),
        "suspect_url": link,
    }
    if step := next_step(s):
        annotations["next_step"] = step
    resolved = event.type == "suspect.resolved"
    status = "resolved" if resolved else "firing"
    alert = {
        "status": status,
        "labels": labels,
        "annotations": annotations,
        "startsAt": s.get("first_seen") or iso(event.at),
        "endsAt": (s.get("resolved_at") or iso(event.at)) if resolved else ZERO_TIME,
        "generatorURL": link,
        "fingerprint": fingerprint(labels),
    }
    return _am_message(webhook_id, base_url, status, alert)
