"""Fault injection for tests and demos (``RANKWATCH_INJECT``): slow, stall or kill chosen ranks.

A testing aid, off unless the variable is set. Syntax: clauses separated by ``;``, each
``action:key=value,...``::

    slow:rank=1,delay=0.05            sleep 50 ms before every collective on rank 1
    slow:node=n2,delay=0.2,after=10   every rank on node n2, from 10 s after start
    slow:rank=3,delay=0.1,after=5,for=20    a slowdown that lasts 20 s, then ends
    stall:rank=2,seq=40               block forever before rank 2 enters op #40 of the world group
    stall:rank=2,seq=40,group=1       ... of group "1"
    exit:rank=1,seq=30,code=1         the process exits (os._exit) before op #30
    crash:rank=1,seq=30               op #30 raises RuntimeError, as a crashing rank would

Selectors: ``rank`` (global rank; a list with ``+``: ``rank=1+3``), ``node`` (node name), or
neither (every rank). ``after``/``for`` are seconds since the rank's first process group.
The delays happen before the op is entered, so a slowed rank looks like a slow GPU: it arrives
late and spends little time inside the collective.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from rankwatch.errors import InjectSpecError

__all__ = ["InjectRule", "Injector", "parse_inject"]

ACTIONS = ("slow", "stall", "exit", "crash")
_KEYS = {"rank", "node", "delay", "after", "for", "seq", "group", "code"}


@dataclass(frozen=True, slots=True)
class InjectRule:
    """One clause of ``RANKWATCH_INJECT``."""

    action: str
    ranks: frozenset[int] | None = None
    node: str | None = None
    delay: float = 0.0
    after: float = 0.0
    duration: float | None = None
    seq: int | None = None
    group: str | None = None
    code: int = 1

    def selects(self, rank: int, node: str) -> bool:
        if self.ranks is not None and rank not in self.ranks:
            return False
        return self.node is None or self.node == node


def parse_inject(spec: str) -> list[InjectRule]:
    """Parse a ``RANKWATCH_INJECT`` value.

    Raises:
        InjectSpecError: naming the clause and what is wrong with it.
    """
    rules: list[InjectRule] = []
    for clause in (c.strip() for c in spec.split(";")):
        if not clause:
            continue
        action, _, rest = clause.partition(":")
        action = action.strip()
        if action not in ACTIONS:
            raise InjectSpecError(f"{clause!r}: action must be one of {', '.join(ACTIONS)}")
        kv: dict[str, str] = {}
        for item in (i.strip() for i in rest.split(",")):
            if not item:
                continue
            key, eq, value = item.partition("=")
            if not eq or key not in _KEYS:
                raise InjectSpecError(f"{clause!r}: bad item {item!r} (keys: {', '.join(sorted(_KEYS))})")
            kv[key] = value
        try:
            ranks = frozenset(int(r) for r in kv["rank"].split("+")) if "rank" in kv else None
            rule = InjectRule(
                action=action,
                ranks=ranks,
                node=kv.get("node"),
                delay=float(kv.get("delay", 0)),
                after=float(kv.get("after", 0)),
                duration=float(kv["for"]) if "for" in kv else None,
                seq=int(kv["seq"]) if "seq" in kv else None,
                group=kv.get("group"),
                code=int(kv.get("code", 1)),
            )
        except ValueError as exc:
            raise InjectSpecError(f"{clause!r}: {exc}") from None
        if action == "slow" and rule.delay <= 0:
            raise InjectSpecError(f"{clause!r}: slow needs delay=SECONDS > 0")
        if action in ("stall", "exit", "crash") and rule.seq is None:
            raise InjectSpecError(f"{clause!r}: {action} needs seq=N")
        rules.append(rule)
    return rules


class Injector:
    """The rules that apply to one group of this rank, applied before each op is entered."""

    __slots__ = ("rules", "t0")

    def __init__(self, rules: list[InjectRule], t0: float) -> None:
        self.rules = rules
        self.t0 = t0

    @classmethod
    def for_group(
        cls, rules: list[InjectRule], rank: int, node: str, group: str, is_world: bool, t0: float
    ) -> Injector | None:
        mine = [
            r
            for r in rules
            if r.selects(rank, node) and (r.group == group or (r.group is None and (r.action == "slow" or is_world)))
        ]
        return cls(mine, t0) if mine else None

    def before(self, next_seq: int) -> None:
        """Called on the training thread before op ``next_seq`` of the group is entered."""
        for r in self.rules:
            if r.action == "slow":
                elapsed = time.monotonic() - self.t0
                if elapsed >= r.after and (r.duration is None or elapsed < r.after + r.duration):
                    time.sleep(r.delay)
            elif next_seq == r.seq:
                if r.action == "stall":
                    while True:
                        time.sleep(3600)
                elif r.action == "exit":
                    os._exit(r.code)
                elif r.action == "crash":
                    raise RuntimeError(f"rankwatch injected crash before op {next_seq}")
