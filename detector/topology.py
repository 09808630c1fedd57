"""Who is where: ranks, nodes, groups, and the places each group's transfers go through.

Every group becomes a *channel* whose members occupy consecutive *slots* (one per member, in
group-rank order), so per-member state lives in flat numpy arrays indexed by slot and per-group
reductions are ``reduceat`` over contiguous ranges. Point-to-point traffic becomes one two-slot
channel per (group, sender, receiver): slot 0 is the sender, slot 1 the receiver, and the
``k``-th send meets the ``k``-th receive, exactly like a two-member collective.

For localisation each channel *uses* places: the ring its transfers take in group-rank order
crosses, for every pair of neighbours on different nodes, both ranks' NICs (``rnic``), both nodes'
networks (``nic``) and the link between the two nodes; for neighbours on one node, both GPUs'
NVLink (``rnvl``) and the node's fabric (``nvl``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rankwatch.wire import runs_to_ranks

__all__ = ["PLACE_LEVEL", "Place", "Topology"]

Place = tuple[Any, ...]
"""``("rnic", rank)``, ``("rnvl", rank)``, ``("nic", node)``, ``("nvl", node)``, ``("link", node_a, node_b)``."""

PLACE_LEVEL = {"rnic": "rank", "rnvl": "rank", "nic": "node", "nvl": "node", "link": "link"}

_TABLE_MAX_SLOTS = 64  # per-rank lookup tables while no rank has more slots than this


class _Grow:
    """A numpy array that doubles when it fills."""

    def __init__(self, dtype: Any, fill: Any = 0) -> None:
        self.a = np.full(64, fill, dtype=dtype)
        self.n = 0
        self.fill = fill

    def extend(self, values: np.ndarray) -> None:
        k = values.shape[0]
        if self.n + k > self.a.shape[0]:
            new = np.full(max(2 * self.a.shape[0], self.n + k), self.fill, dtype=self.a.dtype)
            new[: self.n] = self.a[: self.n]
            self.a = new
        self.a[self.n : self.n + k] = values
        self.n += k

    @property
    def v(self) -> np.ndarray:
        return self.a[: self.n]


class Topology:
    """Ranks, nodes and channels of one job, growing as batches name them."""

    def __init__(self) -> None:
        self.world = 0
        self.node_of = np.full(0, -1, np.int64)  # node index per rank
        self.node_names: list[str] = []
        self._node_index: dict[str, int] = {}
        self.channel_id: dict[str, int] = {}
        self.ch_name: list[str] = []
        self.ch_desc: list[str] = []
        self.ch_members: list[np.ndarray] = []
        self._ch_size = _Grow(np.int64)
        self._ch_off = _Grow(np.int64)
        self._ch_block = _Grow(np.int64)
        self._ch_parent = _Grow(np.int64, -1)
        self._slot_rank = _Grow(np.int64)
        self._slot_ch = _Grow(np.int64)
        self._grank: list[dict[int, int] | None] = []
        self._pending: dict[str, dict[str, Any]] = {}
        self._p2p: dict[tuple[int, int, int], int] = {}
        self._places: dict[int, frozenset[Place]] = {}
        self._rank_slots: tuple[np.ndarray, np.ndarray] | None = None
        self._pipes: tuple[tuple[int, int], np.ndarray] | None = None
        self._parallel: tuple[tuple[int, int, int], np.ndarray, np.ndarray] | None = None
        self._slot_index: tuple[np.ndarray, np.ndarray] | None = None
        self._rank_table: tuple[np.ndarray, np.ndarray] | None = None
        self._table_world = -1  # the world the table was built for (-1: build it again)
        self._p2p_keys = np.zeros(0, np.int64)
        self._p2p_vals = np.zeros(0, np.int64)
        self.version = 0

    # -- sizes -------------------------------------------------------------------------------------
    @property
    def n_channels(self) -> int:
        return self._ch_size.n

    @property
    def n_slots(self) -> int:
        return self._slot_rank.n

    @property
    def ch_size(self) -> np.ndarray:
        return self._ch_size.v

    @property
    def ch_off(self) -> np.ndarray:
        return self._ch_off.v

    @property
    def ch_block(self) -> np.ndarray:
        return self._ch_block.v

    @property
    def ch_parent(self) -> np.ndarray:
        return self._ch_parent.v

    @property
    def slot_rank(self) -> np.ndarray:
        return self._slot_rank.v

    @property
    def slot_ch(self) -> np.ndarray:
        return self._slot_ch.v

    # -- ranks and nodes ---------------------------------------------------------------------------
    def ensure_world(self, world: int) -> None:
        if world > self.world:
            grown = np.full(world, -1, np.int64)
            grown[: self.world] = self.node_of
            self.node_of = grown
            self.world = world

    def set_node(self, rank: int, name: str) -> None:
        idx = self._node_index.get(name)
        if idx is None:
            idx = self._node_index[name] = len(self.node_names)
            self.node_names.append(name)
        if self.node_of[rank] != idx:
            self.node_of[rank] = idx
            self._places.clear()

    def node_name(self, rank: int) -> str:
        i = int(self.node_of[rank]) if 0 <= rank < self.world else -1
        return self.node_names[i] if i >= 0 else f"rank{rank}"

    def node_ranks(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for r, n in enumerate(self.node_of.tolist()):
            if n >= 0:
                out.setdefault(n, []).append(r)
        return out

    # -- channels ----------------------------------------------------------------------------------
    def _add_channel(self, name: str, desc: str, members: np.ndarray, parent: int = -1, block: int = 0) -> int:
        ch = self.n_channels
        self.channel_id[name] = ch
        self.ch_name.append(name)
        self.ch_desc.append(desc)
        self.ch_members.append(members)
        self._grank.append(None)
        self._ch_size.extend(np.array([members.shape[0]]))
        self._ch_off.extend(np.array([self.n_slots]))
        self._ch_block.extend(np.array([block]))
        self._ch_parent.extend(np.array([parent]))
        self._slot_rank.extend(members)
        self._slot_ch.extend(np.full(members.shape[0], ch, np.int64))
        self._rank_slots = None
        self._slot_index = None
        self._table_world = -1
        self.version += 1
        return ch

    def register_groups(self, entries: list[dict[str, Any]], rank: int) -> np.ndarray:
        """Channel index of each group entry of one rank's header (-1 while membership is unknown)."""
        out = np.full(len(entries), -1, np.int64)
        for i, e in enumerate(entries):
            gid = e.get("id")
            if not isinstance(gid, str):
                continue
            ch = self.channel_id.get(gid)
            if ch is None:
                ch = self._register(gid, e, rank)
            out[i] = -1 if ch is None else ch
        return out

    def _register(self, gid: str, e: dict[str, Any], rank: int) -> int | None:
        runs = e.get("ranks")
        if runs:
            members = np.asarray(runs_to_ranks(runs), dtype=np.int64)
            if members.size and int(members.max()) < max(self.world, 1) and len(set(members.tolist())) == members.size:
                return self._add_channel(gid, str(e.get("desc", "")), members)
            return None
        # membership not sent: learn it from who reports the group, and where
        size, grank = e.get("size"), e.get("group_rank")
        if not isinstance(size, int) or not isinstance(grank, int) or not 0 <= grank < size:
            return None
        pend = self._pending.setdefault(gid, {"size": size, "members": {}})
        pend["members"][grank] = rank
        if len(pend["members"]) == size:
            del self._pending[gid]
            members = np.array([pend["members"][k] for k in range(size)], dtype=np.int64)
            return self._add_channel(gid, str(e.get("desc", "")), members)
        return None

    def slot_of(self, ch: np.ndarray, ranks: np.ndarray) -> np.ndarray:
        """Slot of each (channel, global rank) pair; -1 where the rank is not a member."""
        ch, ranks = ch.astype(np.int64), ranks.astype(np.int64)
        table = self.rank_table()
        if table is not None:
            # a rank has a handful of slots: compare with its row rather than search all slots
            chs, sls = table
            if not chs.size:
                return np.full(ch.shape[0], -1, np.int64)
            ok = (ch >= 0) & (ranks >= 0) & (ranks < chs.shape[0])
            r = np.where(ok, ranks, 0)
            width = chs.shape[1]
            hit = np.flatnonzero((chs[r] == ch[:, None]).ravel())  # at most one per row
            row = hit // width
            out = np.full(ch.shape[0], -1, np.int64)
            out[row] = sls.ravel()[r[row] * width + hit % width]
            out[~ok] = -1
            return out
        if self._slot_index is None:
            key = self.slot_ch * (1 << 32) + self.slot_rank
            order = np.argsort(key, kind="stable")
            self._slot_index = (key[order], order)
        keys, order = self._slot_index
        ok = ch >= 0
        want = np.where(ok, ch, 0) * (1 << 32) + ranks
        pos = np.minimum(np.searchsorted(keys, want), max(0, keys.shape[0] - 1))
        hit = ok & (keys.shape[0] > 0) & (keys[pos] == want) if keys.shape[0] else np.zeros(ch.shape[0], bool)
        return np.where(hit, order[pos] if keys.shape[0] else -1, -1)

    def group_rank(self, ch: int, ranks: np.ndarray) -> np.ndarray:
        """Position of each global rank in channel ``ch`` (-1 if not a member)."""
        m = self._grank[ch]
        if m is None:
            m = self._grank[ch] = {int(r): i for i, r in enumerate(self.ch_members[ch].tolist())}
        return np.fromiter((m.get(int(r), -1) for r in ranks), dtype=np.int64, count=len(ranks))

    def p2p_channels(self, parent: np.ndarray, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """Channel of each (group, sender group rank, receiver group rank) point-to-point pair."""
        out = np.full(parent.shape[0], -1, np.int64)
        if not parent.shape[0]:
            return out
        key = (parent.astype(np.int64) << 40) | (src.astype(np.int64) << 20) | dst.astype(np.int64)
        if self._p2p_keys.shape[0]:
            # needles in order: a search through a large sorted array is several times faster
            order = np.argsort(key, kind="stable")
            pos = np.empty(key.shape[0], np.int64)
            pos[order] = np.searchsorted(self._p2p_keys, key[order])
            pos = np.minimum(pos, self._p2p_keys.shape[0] - 1)
            found = self._p2p_keys[pos] == key
            if found.all():
                return self._p2p_vals[pos]
        uniq, inv = np.unique(key, return_inverse=True)
        chans = np.empty(uniq.shape[0], np.int64)
        added = False
        for i, k in enumerate(uniq.tolist()):
            p, a, b = k >> 40, (k >> 20) & 0xFFFFF, k & 0xFFFFF
            ch = self._p2p.get((p, a, b))
            if ch is None:
                members = self.ch_members[p]
                if not (0 <= a < members.shape[0] and 0 <= b < members.shape[0]) or a == b:
                    chans[i] = -1
                    continue
                ch = self._add_channel(
                    f"{self.ch_name[p]}:{a}>{b}",
                    "p2p",
                    np.array([members[a], members[b]], dtype=np.int64),
                    parent=p,
                    block=0,
                )
                self._p2p[(p, a, b)] = ch
                added = True
            chans[i] = ch
        if added:
            items = sorted(((p << 40) | (a << 20) | b, c) for (p, a, b), c in self._p2p.items())
            self._p2p_keys = np.array([k for k, _ in items], np.int64)
            self._p2p_vals = np.array([c for _, c in items], np.int64)
        return chans[inv]

    def pipelines(self) -> np.ndarray:
        """Per rank: the lowest rank it is joined to through point-to-point groups (a pipeline's
        sends and receives): the ranks of one pipeline share it; a rank with none is its own."""
        if self._pipes is not None and self._pipes[0] == (self.version, self.world):
            return self._pipes[1]
        comp = np.arange(self.world, dtype=np.int64)
        p2p = np.flatnonzero(self.ch_parent >= 0)
        if p2p.shape[0]:
            # a point-to-point group's two members are its first and last slot
            a = self.slot_rank[self.ch_off[p2p]]
            b = self.slot_rank[self.ch_off[p2p] + self.ch_size[p2p] - 1]
            while True:  # each edge pulls both ends to the lower label until nothing moves
                lo = np.minimum(comp[a], comp[b])
                new = comp.copy()
                np.minimum.at(new, a, lo)
                np.minimum.at(new, b, lo)
                new = new[new]
                if np.array_equal(new, comp):
                    break
                comp = new
        self._pipes = ((self.version, self.world), comp)
        return comp

    def p2p_parallel(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Of the first ``n`` slots, the point-to-point ones whose ranks both have a collective
        group below the whole job's, and per such slot a key its parallel slots share: the same
        role (sender or receiver) between the same two groups (each rank's largest such group: a
        pipeline stage's tensor- or data-parallel group, whose members run the same schedule)."""
        tag = (self.version, self.world, n)
        if self._parallel is not None and self._parallel[0] == tag:
            return self._parallel[1], self._parallel[2]
        ch = self.slot_ch[:n]
        coll = (self.ch_parent[ch] < 0) & (self.ch_size[ch] < self.world)
        size = self.ch_size[ch]
        cs = np.flatnonzero(coll)
        order = cs[np.lexsort((-size[cs], self.slot_rank[cs]))]
        first = np.r_[True, self.slot_rank[order][1:] != self.slot_rank[order][:-1]] if order.shape[0] else order
        g = np.full(self.world, -1, np.int64)
        g[self.slot_rank[order[first]]] = ch[order[first]]
        ps = np.flatnonzero(self.ch_parent[ch] >= 0)
        off = self.ch_off[ch[ps]]
        role = ps - off
        peer = self.slot_rank[np.where(role == 0, off + 1, off)]
        ga, gb = g[self.slot_rank[ps]], g[peer]
        ok = (ga >= 0) & (gb >= 0)
        ps, key = ps[ok], (ga[ok] << 33) | (gb[ok] << 1) | role[ok]
        self._parallel = (tag, ps, key)
        return ps, key

    def ch_whole(self) -> np.ndarray:
        """Per channel: a collective group of every rank of the job (the default group, its copies)."""
        return (self.ch_size == self.world) & (self.ch_parent < 0)

    def ch_nodes(self) -> tuple[np.ndarray, np.ndarray]:
        """Per channel: the lowest and the highest node its members sit on (-1: one not known yet)."""
        n = self.slot_rank.shape[0]
        if not n or not self.n_channels:
            return np.zeros(self.n_channels, np.int64), np.zeros(self.n_channels, np.int64)
        node = self.node_of[self.slot_rank]
        return np.minimum.reduceat(node, self.ch_off), np.maximum.reduceat(node, self.ch_off)

    def ch_cross_node(self) -> np.ndarray:
        """Per channel: whether its members sit on more than one node."""
        lo, hi = self.ch_nodes()
        return lo != hi

    def set_block(self, ch: np.ndarray, block: np.ndarray) -> None:
        self._ch_block.a[ch] = block

    def slots_of_ranks(self, ranks: np.ndarray) -> np.ndarray:
        """All slots of the given ranks, concatenated."""
        r = np.asarray(ranks, dtype=np.int64)
        r = r[(r >= 0) & (r < self.world)]
        table = self.rank_table()
        if table is not None:
            got = table[1][r].ravel()
            return got[got >= 0]
        ptr, slots = self.rank_slots()
        lo, hi = ptr[r], ptr[r + 1]
        n = hi - lo
        if not n.sum():
            return np.zeros(0, np.int64)
        idx = np.repeat(lo - np.r_[0, np.cumsum(n)[:-1]], n) + np.arange(int(n.sum()))
        return slots[idx]

    def rank_slots(self) -> tuple[np.ndarray, np.ndarray]:
        """CSR of slots per rank: ``slots[ptr[r]:ptr[r+1]]`` are rank r's slots."""
        if self._rank_slots is None or self._rank_slots[0].shape[0] != self.world + 1:
            order = np.argsort(self.slot_rank, kind="stable")
            ptr = np.searchsorted(self.slot_rank[order], np.arange(self.world + 1))
            self._rank_slots = (ptr, order)
        return self._rank_slots

    def rank_table(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Per rank, its channels and their slots in slot order, padded with -1 to the widest rank.

        None when some rank has more than a table's worth of slots (then lookups search instead).
        """
        ptr, slots = self.rank_slots()
        if self._table_world != self.world:
            self._table_world = self.world
            cnt = np.diff(ptr)
            width = int(cnt.max()) if cnt.shape[0] else 0
            self._rank_table = None
            if width <= _TABLE_MAX_SLOTS:
                row = np.repeat(np.arange(self.world), cnt)
                col = np.arange(slots.shape[0]) - np.repeat(ptr[:-1], cnt)
                chs = np.full((self.world, width), -1, np.int64)
                sls = np.full((self.world, width), -1, np.int64)
                chs[row, col] = self.slot_ch[slots]
                sls[row, col] = slots
                self._rank_table = (chs, sls)
        return self._rank_table

    # -- places ------------------------------------------------------------------------------------
    def places(self, ch: int) -> frozenset[Place]:
        """The places channel ``ch``'s transfers go through."""
        got = self._places.get(ch)
        if got is not None:
            return got
        m = self.ch_members[ch]
        if m.shape[0] < 2:
            edges = np.zeros((0, 2), np.int64)
        elif m.shape[0] == 2:
            edges = m[None, :]
        else:
            edges = np.stack([m, np.roll(m, -1)], axis=1)
        na = self.node_of[edges[:, 0]] if edges.size else np.zeros(0, np.int64)
        nb = self.node_of[edges[:, 1]] if edges.size else np.zeros(0, np.int64)
        out: set[Place] = set()
        for (a, b), x, y in zip(edges.tolist(), na.tolist(), nb.tolist(), strict=True):
            if x < 0 or y < 0:
                continue
            if x != y:
                out.update({("rnic", a), ("rnic", b), ("nic", x), ("nic", y), ("link", min(x, y), max(x, y))})
            else:
                out.update({("rnvl", a), ("rnvl", b), ("nvl", x)})
        fs = frozenset(out)
        self._places[ch] = fs
        return fs

    def place_ranks(self, place: Place) -> list[int]:
        kind = place[0]
        if kind in ("rnic", "rnvl"):
            return [int(place[1])]
        if kind in ("nic", "nvl"):
            return np.flatnonzero(self.node_of == place[1]).tolist()
        return []

    def place_nodes(self, place: Place) -> list[int]:
        kind = place[0]
        if kind in ("rnic", "rnvl"):
            return [int(self.node_of[place[1]])]
        if kind in ("nic", "nvl"):
            return [int(place[1])]
        return [int(place[1]), int(place[2])]
