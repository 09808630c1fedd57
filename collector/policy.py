"""Remediation policy: what rankwatch may do about a suspect, decided where the suspect is written.

A job's policy (``PUT /jobs/{job_id}/policy``, else the service's defaults ``RANKWATCH_POLICY`` /
``RANKWATCH_ACTUATOR``) says whether rankwatch only reports (``observe``), proposes an action and
waits for a person (``approve``), or acts on its own (``auto``), and how it recovers the job
(``restart`` from checkpoint without the node, or ``swap`` to a standby). ``decide`` is pure: it
turns a new suspect into the action to record — or a refusal, with its reason — applying the
safety rules: a target node must be in the job, at most one isolation per suspect, a per-job
budget and cool-down (a flapping suspect never causes a restart storm), and never isolating more
than a set share of the job's nodes. The collector writes what ``decide`` returns in the same
transaction as the suspect and its outbox events; the API's executor runs approved actions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from rankwatch.errors import ConfigError

__all__ = ["ACTION_TYPES", "MODES", "Decision", "Policy", "decide", "drain_reason"]

MODES = ("observe", "approve", "auto")
RECOVERIES = ("restart", "swap")
ACTION_TYPES = ("isolate", "restart", "swap")
ALL_KINDS = ("noncomm_slow", "comm_slow", "noncomm_hang", "comm_hang", "rank_dead")


@dataclass(frozen=True)
class Policy:
    """What rankwatch may do about a job's suspects."""

    mode: str = "observe"
    recovery: str = "restart"
    actuator: str = "none"
    actuator_options: dict[str, Any] = field(default_factory=dict)
    kinds: tuple[str, ...] = ALL_KINDS
    min_score: float = 0.8
    budget: int = 3
    budget_window_s: float = 3600.0
    cooldown_s: float = 120.0
    max_isolated_share: float = 0.5
    exit_code: int = 3
    protect_nodes: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None, defaults: Policy | None = None) -> Policy:
        """A policy from JSON, on top of ``defaults``.

        Raises:
            ConfigError: an unknown field or a value out of range, named.
        """
        base = defaults or cls()
        if not data:
            return base
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown policy fields: {', '.join(unknown)}")
        values = dict(data)
        for key in ("kinds", "protect_nodes"):
            if key in values:
                values[key] = tuple(values[key])
        p = replace(base, **values)
        p.validate()
        return p

    def validate(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"mode must be one of {', '.join(MODES)}")
        if self.recovery not in RECOVERIES:
            raise ConfigError(f"recovery must be one of {', '.join(RECOVERIES)}")
        bad = [k for k in self.kinds if k not in ALL_KINDS]
        if bad:
            raise ConfigError(f"unknown suspect kinds: {', '.join(bad)}")
        if not 0 < self.max_isolated_share <= 1:
            raise ConfigError("max_isolated_share must be in (0, 1]")
        if self.budget < 0 or self.cooldown_s < 0 or self.budget_window_s <= 0:
            raise ConfigError("budget, cooldown_s and budget_window_s must not be negative")
        if not 0 <= self.exit_code <= 255:
            raise ConfigError("exit_code must be 0..255")

    def public(self) -> dict[str, Any]:
        out = asdict(self)
        out["kinds"] = list(self.kinds)
        out["protect_nodes"] = list(self.protect_nodes)
        return out


@dataclass(frozen=True)
class Decision:
    """An action to record: ``state`` is proposed, approved, or refused (with ``refusal``)."""

    type: str
    node: str | None
    ranks: tuple[int, ...]
    state: str
    reason: str
    refusal: str | None = None


def drain_reason(kind: str, level: str, ranks: Sequence[int], nodes: Sequence[str], slowdown: float | None) -> str:
    """The one line a scheduler shows for a drained node: what, who, how much slower."""
    how = f"{slowdown:.2f}x slower" if slowdown else "job stopped"
    listed = ",".join(map(str, ranks))
    if level == "rank":
        who = f"rank {listed}"
    else:
        who = f"node {','.join(nodes)}" + (f" (rank {listed})" if ranks else "")
    return f"rankwatch: {kind} {who} {how}"


def decide(
    policy: Policy,
    suspect: Mapping[str, Any],
    node_ranks: Mapping[str, Sequence[int]],
    isolated: set[str],
    recent: Sequence[tuple[float, str, str]],
    now: float,
) -> list[Decision]:
    """What to record for a newly opened suspect (nothing, under ``observe``).

    Args:
        policy: the job's policy.
        suspect: the suspect as ``suspect_public`` shows it.
        node_ranks: the job's nodes and their ranks.
        isolated: nodes of the job already isolated.
        recent: the job's earlier automatic actions as (created_at, type, state).
        now: server time.
    """
    if policy.mode == "observe":
        return []
    if suspect["kind"] not in policy.kinds or float(suspect["score"]) < policy.min_score:
        return []
    kind_of_action = "swap" if policy.recovery == "swap" else "isolate"
    state = "approved" if policy.mode == "auto" else "proposed"

    def refuse(why: str, node: str | None = None, ranks: Sequence[int] = ()) -> list[Decision]:
        return [Decision(kind_of_action, node, tuple(ranks), "refused", why, refusal=why)]

    level, nodes, ranks = suspect["level"], list(suspect.get("nodes") or []), list(suspect.get("ranks") or [])
    if level == "link":
        a, b = (suspect.get("link") or ["?", "?"])[:2]
        return refuse(f"a slow link between {a} and {b}: isolating either end would be a guess; fix the link")
    if level == "rank" and not nodes:
        nodes = [n for n, rs in node_ranks.items() if set(ranks) & set(rs)]
    if len(set(nodes)) != 1:
        return refuse(f"the suspect spans nodes {sorted(set(nodes))}; rankwatch acts on one node at a time")
    node = nodes[0]
    reason = drain_reason(suspect["kind"], level, ranks, nodes, suspect.get("slowdown"))
    if node not in node_ranks:
        return refuse(f"node {node} is not a node of job {suspect['job_id']}", node, ranks)
    if node in policy.protect_nodes:
        return refuse(f"node {node} is protected by the job's policy (protect_nodes)", node, ranks)
    if node in isolated:
        return []  # already isolated: nothing more to do for it
    taken = [r for r in recent if r[2] != "refused" and now - r[0] < policy.budget_window_s]
    if len(taken) >= policy.budget:
        return refuse(
            f"budget spent: {len(taken)} actions in the last {policy.budget_window_s:.0f}s (budget {policy.budget})",
            node,
            ranks,
        )
    if taken and now - max(r[0] for r in taken) < policy.cooldown_s:
        return refuse(f"cool-down: the last action was under {policy.cooldown_s:.0f}s ago", node, ranks)
    share = (len(isolated) + 1) / max(1, len(node_ranks))
    if kind_of_action == "isolate" and share > policy.max_isolated_share:
        return refuse(
            f"isolating {node} would take {len(isolated) + 1} of the job's {len(node_ranks)} nodes "
            f"(more than max_isolated_share {policy.max_isolated_share:g})",
            node,
            ranks,
        )
    return [Decision(kind_of_action, node, tuple(node_ranks.get(node, ranks)), state, reason)]
