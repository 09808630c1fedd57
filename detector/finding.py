"""``Finding``: one suspect the detector reports, with its evidence."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["KINDS", "LEVELS", "Finding"]

KINDS = ("noncomm_slow", "comm_slow", "noncomm_hang", "comm_hang", "rank_dead")
LEVELS = ("rank", "node", "link")


@dataclass(slots=True)
class Finding:
    """A suspect active now.

    ``key`` is stable for as long as the same fault goes on, so the collector can open a suspect
    once and resolve it when the key stops appearing.
    """

    key: str
    """Stable identity: kind, level and what is named (``noncomm_slow:rank:12``)."""
    kind: str
    """One of ``KINDS``."""
    level: str
    """One of ``LEVELS``: the finest place the evidence supports."""
    ranks: list[int]
    """Global ranks named (for a node, its ranks involved; for a link, the ranks at its ends)."""
    nodes: list[str]
    """Node names named (one for rank and node level, two for a link)."""
    link: tuple[str, str] | None
    """The two nodes of a link, sorted; None unless ``level == "link"``."""
    score: float
    """Confidence, 0 to 1."""
    slowdown: float | None
    """1 / (1 - w), w the share of wall-clock the rest of the job waits on it; None: stopped."""
    first_seen: float
    """Server time the fault is estimated to have started."""
    detected_at: float
    """Server time the detector first reported this key (in this episode)."""
    evidence: dict[str, Any] = field(default_factory=dict)
    """JSON-serialisable: groups and sequence numbers, lateness, baselines, stacks."""
    flight_recorder_ranks: list[int] = field(default_factory=list)
    """For hangs: ranks whose Flight Recorder ring the collector should ask for."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "kind": self.kind,
            "level": self.level,
            "ranks": list(self.ranks),
            "nodes": list(self.nodes),
            "link": list(self.link) if self.link else None,
            "score": self.score,
            "slowdown": self.slowdown,
            "first_seen": self.first_seen,
            "detected_at": self.detected_at,
            "evidence": self.evidence,
            "flight_recorder_ranks": list(self.flight_recorder_ranks),
        }
