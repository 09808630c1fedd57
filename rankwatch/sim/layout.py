"""Where ranks sit: data x tensor x pipeline parallel groups laid out on nodes of eight.

Ranks are numbered as Megatron-LM numbers them, tensor-parallel index fastest, then data
parallel, then pipeline stage: ``rank = t + tp * (d + dp * p)``. With ``tp <= 8`` a tensor-parallel
group sits inside one node (NVLink), data-parallel groups cross nodes, and pipeline stages talk
point-to-point across nodes. Group ids follow c10d's naming: ``"0"`` is the default group, then
groups are numbered in creation order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from rankwatch.wire import ranks_to_runs

__all__ = ["GroupSpec", "Layout", "node_name"]


def node_name(index: int) -> str:
    """The host name the simulator gives node ``index``."""
    return f"node{index:05d}"


@dataclass(frozen=True, slots=True)
class GroupSpec:
    """One process group: its c10d id, what it is for, and its members in group-rank order."""

    gid: str
    desc: str
    members: np.ndarray = field(repr=False)

    @property
    def size(self) -> int:
        return int(self.members.shape[0])

    def header_entry(self) -> dict[str, object]:
        return {"id": self.gid, "desc": self.desc, "ranks": ranks_to_runs(self.members.tolist()), "size": self.size}


@dataclass(frozen=True)
class Layout:
    """A job's parallelism and placement.

    Args:
        tp: tensor-parallel degree (groups inside a node when ``tp <= gpus_per_node``).
        pp: pipeline stages (point-to-point between neighbouring stages).
        dp: data-parallel degree.
        gpus_per_node: ranks per host.
        world_group: whether the default group (all ranks) is used (barriers at checkpoints).
    """

    tp: int = 1
    pp: int = 1
    dp: int = 8
    gpus_per_node: int = 8
    world_group: bool = True

    def __post_init__(self) -> None:
        if min(self.tp, self.pp, self.dp, self.gpus_per_node) < 1:
            raise ValueError("tp, pp, dp and gpus_per_node must be at least 1")

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def n_nodes(self) -> int:
        return -(-self.world // self.gpus_per_node)

    def rank(self, t: int, d: int, p: int) -> int:
        return t + self.tp * (d + self.dp * p)

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def node_of_ranks(self, ranks: np.ndarray) -> np.ndarray:
        return np.asarray(ranks) // self.gpus_per_node

    def ranks_on_node(self, node: int) -> list[int]:
        lo = node * self.gpus_per_node
        return list(range(lo, min(lo + self.gpus_per_node, self.world)))

    def stage_ranks(self, p: int) -> np.ndarray:
        """Ranks of pipeline stage ``p`` as a ``(dp, tp)`` array."""
        base = self.tp * self.dp * p
        return np.arange(base, base + self.tp * self.dp, dtype=np.int64).reshape(self.dp, self.tp)

    @cached_property
    def groups(self) -> list[GroupSpec]:
        """Every group, in creation order: world, tensor, data, pipeline (size-1 groups skipped)."""
        out: list[GroupSpec] = []
        n = 0

        def add(desc: str, members: np.ndarray) -> None:
            nonlocal n
            out.append(GroupSpec(str(n), desc, np.asarray(members, dtype=np.int64)))
            n += 1

        add("default_pg", np.arange(self.world, dtype=np.int64))
        if self.tp > 1:
            for p in range(self.pp):
                for row in self.stage_ranks(p):
                    add("tp", row)
        if self.dp > 1:
            for p in range(self.pp):
                for col in self.stage_ranks(p).T:
                    add("dp", col)
        if self.pp > 1:
            stages = np.stack([self.stage_ranks(p) for p in range(self.pp)])  # (pp, dp, tp)
            for d in range(self.dp):
                for t in range(self.tp):
                    add("pp", stages[:, d, t])
        return out

    @cached_property
    def group_index(self) -> dict[tuple[str, int, int], int]:
        """(kind, stage or other key, position) -> index into ``groups``; see ``tp_gidx`` and friends."""
        idx: dict[tuple[str, int, int], int] = {}
        k = 1
        if self.tp > 1:
            for p in range(self.pp):
                for d in range(self.dp):
                    idx[("tp", p, d)] = k
                    k += 1
        if self.dp > 1:
            for p in range(self.pp):
                for t in range(self.tp):
                    idx[("dp", p, t)] = k
                    k += 1
        if self.pp > 1:
            for d in range(self.dp):
                for t in range(self.tp):
                    idx[("pp", d, t)] = k
                    k += 1
        return idx

    def tp_gidx(self, p: int) -> np.ndarray:
        """Group index of each rank of stage ``p``'s tensor-parallel group, shape ``(dp, tp)``."""
        if self.tp == 1:
            return np.full((self.dp, self.tp), -1, np.int64)
        first = self.group_index[("tp", p, 0)]
        return np.repeat(np.arange(first, first + self.dp, dtype=np.int64)[:, None], self.tp, axis=1)

    def dp_gidx(self, p: int) -> np.ndarray:
        if self.dp == 1:
            return np.full((self.dp, self.tp), -1, np.int64)
        first = self.group_index[("dp", p, 0)]
        return np.repeat(np.arange(first, first + self.tp, dtype=np.int64)[None, :], self.dp, axis=0)

    def pp_gidx(self) -> np.ndarray:
        """Group index of each (d, t) pipeline group, shape ``(dp, tp)``."""
        if self.pp == 1:
            return np.full((self.dp, self.tp), -1, np.int64)
        first = self.group_index[("pp", 0, 0)]
        return np.arange(first, first + self.dp * self.tp, dtype=np.int64).reshape(self.dp, self.tp)

    @cached_property
    def rank_groups(self) -> list[list[int]]:
        """For every rank, the indices of the groups it belongs to (its header's group list)."""
        out: list[list[int]] = [[0] if self.world_group else [] for _ in range(self.world)]
        for gi, g in enumerate(self.groups):
            if gi == 0:
                continue
            for r in g.members.tolist():
                out[r].append(gi)
        return out

    def ring_edges(self, members: np.ndarray) -> np.ndarray:
        """The (a, b) rank pairs a ring collective over ``members`` uses, in group-rank order."""
        m = np.asarray(members, dtype=np.int64)
        if m.shape[0] < 2:
            return np.zeros((0, 2), np.int64)
        if m.shape[0] == 2:
            return m[None, :]
        return np.stack([m, np.roll(m, -1)], axis=1)
