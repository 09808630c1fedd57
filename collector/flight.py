"""Flight Recorder dumps from the ranks of a stuck group, aligned by group and sequence number.

Every rank's dump lists the collectives its ring holds; lined up by (group, sequence number),
the first sequence number some members never reached names who the others are waiting for — the
same reading PyTorch's ``torchfrtrace`` gives, without collecting files from every host.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["align_dumps"]


def align_dumps(dumps: dict[int, str | None], members: dict[str, list[int]] | None = None) -> dict[str, Any]:
    """Align raw ``_dump_fr_trace_json`` outputs.

    Args:
        dumps: rank -> the JSON text its dump produced (None if it sent none).
        members: group id -> member ranks, when known (else: the ranks whose dumps mention it).

    Returns:
        ``{"ranks": [...], "groups": {gid: {"last_seq": {rank: n}, "first_unmatched": seq|None,
        "missing_ranks": [...], "collectives": [{"seq", "op", "ranks": {rank: state}}...]}}}``.
    """
    per_group: dict[str, dict[int, dict[int, dict[str, Any]]]] = {}
    errors: dict[str, str] = {}
    for rank, text in dumps.items():
        if not text:
            errors[str(rank)] = "no dump"
            continue
        try:
            trace = json.loads(text)
        except ValueError as exc:
            errors[str(rank)] = f"unreadable dump: {exc}"
            continue
        if "error" in trace:
            errors[str(rank)] = str(trace["error"])
        for e in trace.get("entries") or []:
            if e.get("is_p2p"):
                continue
            pg = e.get("process_group") or ["?"]
            gid = str(pg[0] if isinstance(pg, list) else pg)
            seq = int(e.get("collective_seq_id", 0))
            per_group.setdefault(gid, {}).setdefault(seq, {})[int(rank)] = {
                "op": str(e.get("profiling_name", "")),
                "state": e.get("state"),
                "input_sizes": e.get("input_sizes"),
            }
    groups: dict[str, Any] = {}
    for gid, seqs in sorted(per_group.items()):
        expected = sorted((members or {}).get(gid) or {r for by_rank in seqs.values() for r in by_rank if r in dumps})
        last = {r: max((s for s, by_rank in seqs.items() if r in by_rank), default=0) for r in expected}
        first_unmatched = None
        missing: list[int] = []
        for seq in sorted(seqs):
            have = set(seqs[seq])
            gone = [r for r in expected if r not in have and r in dumps and dumps[r]]
            if gone and first_unmatched is None:
                first_unmatched, missing = seq, gone
        groups[gid] = {
            "last_seq": {str(r): n for r, n in last.items()},
            "first_unmatched": first_unmatched,
            "missing_ranks": missing,
            "collectives": [
                {
                    "seq": seq,
                    "op": next(iter(by_rank.values()))["op"],
                    "ranks": {str(r): v["state"] for r, v in sorted(by_rank.items())},
                }
                for seq, by_rank in sorted(seqs.items())[-20:]
            ],
        }
    return {"ranks": sorted(int(r) for r in dumps), "groups": groups, "errors": errors}
