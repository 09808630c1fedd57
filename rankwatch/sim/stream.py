"""Block summaries of large simulated jobs, straight from the timing model, without per-op records.

A 100,000-rank job at 100 collectives per rank per second makes ten million op records per
second; as real hooks would at that scale, the simulated ranks summarise their ops into
sequence-aligned blocks (``rankwatch.sim.blocks``) as they go, and per-node agents (or larger
aggregators) ship one ``BlockBatch`` per flush period for all their ranks. Each group's block
size is a power of two (at most 64) chosen so a block spans about ``block_s`` seconds.

This path covers running jobs — healthy or slowed by stragglers and slow links — which is what
scale costs are about; hangs, deaths and crashes are simulated with raw batches
(``rankwatch.sim.ship``), whose block form is ``blocks.from_batch``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from rankwatch.sim.blocks import BLOCK_DTYPE, BLOCK_SEQS, P2P_DTYPE, PROGRESS_DTYPE, RANK_DTYPE, BlockBatch
from rankwatch.sim.engine import Engine
from rankwatch.sim.layout import node_name
from rankwatch.sim.scenario import Scenario
from rankwatch.wire import P2P_KINDS

__all__ = ["BlockDelivery", "stream_blocks"]


@dataclass(frozen=True, slots=True)
class BlockDelivery:
    received_at: float
    batch: BlockBatch


class _Site:
    """Running block sums for one op of the program (one instruction, all its ranks)."""

    __slots__ = (
        "B",
        "block",
        "cnt",
        "first",
        "gidx",
        "kind",
        "last",
        "mn",
        "mx",
        "nbytes",
        "peer",
        "ranks",
        "seq_hi",
        "sm",
        "t_ready",
    )

    def __init__(self, ranks: np.ndarray, gidx: np.ndarray, kind: int, peer: np.ndarray, nbytes: int, B: int) -> None:
        n = ranks.shape[0]
        self.ranks, self.gidx, self.kind, self.peer, self.nbytes, self.B = ranks, gidx, kind, peer, nbytes, B
        self.block = -1
        self.cnt = np.zeros(n, np.int64)
        self.sm = np.zeros(n, np.int64)
        self.mn = np.zeros(n, np.int64)
        self.mx = np.zeros(n, np.int64)
        self.first = np.zeros(n, np.int64)
        self.last = np.zeros(n, np.int64)
        self.seq_hi = 0
        self.t_ready = 0.0


class _Streamer:
    def __init__(self, sc: Scenario, block_s: float, agent_ranks: int) -> None:
        self.sc = sc
        self.eng = Engine(sc)
        self.eng._emit = self._emit  # type: ignore[method-assign]
        lay = sc.layout
        self.world = lay.world
        rng = np.random.default_rng(np.random.SeedSequence([sc.seed, 3]))
        self.offset_ns = (rng.uniform(1e3, 1e6, self.world) * 1e9).astype(np.int64)
        self.phase = rng.uniform(0.0, sc.flush_s, max(1, -(-self.world // agent_ranks)))
        self.agent_ranks = agent_ranks
        self.block_s = block_s
        self.sites: dict[tuple[int, int, int, int], _Site] = {}
        self.ready: list[tuple[float, np.ndarray]] = []
        self.hello: set[int] = set()
        groups = lay.groups
        self.groups = groups
        self.static = [g.header_entry() for g in groups]
        rg = lay.rank_groups
        width = max(len(g) for g in rg)
        self.rg = np.full((self.world, width), -1, np.int64)
        for r, gs in enumerate(rg):
            self.rg[r, : len(gs)] = gs
        self.done_seq = np.zeros((self.world, width), np.int64)
        wl = sc.workload
        ops = wl.ops_per_step(lay)
        self.rate = ops / wl.step_s  # collectives per rank per second, roughly

    def _block_size(self, kind: int, per_step: int) -> int:
        rate = per_step / self.sc.workload.step_s
        want = rate * self.block_s
        return int(min(BLOCK_SEQS, 2 ** max(0, int(np.floor(np.log2(max(want, 1.0)))))))

    def _emit(
        self,
        ranks: np.ndarray,
        gidx: np.ndarray,
        kind: int,
        peer: np.ndarray | int,
        seq: int,
        nbytes: int,
        start: np.ndarray,
        end: np.ndarray,
    ) -> None:
        peer_arr = np.broadcast_to(np.asarray(peer, np.int64), ranks.shape)
        key = (kind, int(ranks[0]), int(ranks.shape[0]), int(peer_arr[0]))
        site = self.sites.get(key)
        if site is None:
            wl = self.sc.workload
            per_step = {1: 2 * wl.microbatches * wl.tp_ops}.get(kind, wl.dp_ops)
            if kind in P2P_KINDS:
                per_step = wl.microbatches
            site = self.sites[key] = _Site(
                ranks.copy(), gidx.copy(), kind, peer_arr.copy(), nbytes, self._block_size(kind, per_step)
            )
        block = (seq - 1) // site.B
        if block != site.block:
            self._flush_site(site)
            site.block = block
            site.cnt[:] = 0
        fin = np.isfinite(end)
        if not fin.all():
            return  # a stopped op: this path simulates running jobs only
        off = self.offset_ns[ranks]
        d = np.round((end - start) * 1e9).astype(np.int64)
        te = np.round(start * 1e9).astype(np.int64) + off
        fresh = site.cnt == 0
        site.sm = np.where(fresh, d, site.sm + d)
        site.mn = np.where(fresh, d, np.minimum(site.mn, d))
        site.mx = np.where(fresh, d, np.maximum(site.mx, d))
        site.first = np.where(fresh, te, site.first)
        site.last = te
        site.cnt += 1
        site.seq_hi = seq
        site.t_ready = float(end.max())
        lgi = np.argmax(self.rg[ranks] == gidx[:, None], axis=1)
        self.done_seq[ranks, lgi] = seq

    def _flush_site(self, site: _Site) -> None:
        if site.block < 0 or not site.cnt.any():
            return
        n = site.ranks.shape[0]
        rows = np.zeros(n, BLOCK_DTYPE)
        rows["rank"] = site.ranks
        rows["group"] = site.gidx
        rows["kind"] = site.kind
        rows["peer"] = site.peer if site.kind in P2P_KINDS else -1
        rows["nbytes"] = site.nbytes
        rows["block"] = site.block
        rows["block_seqs"] = site.B
        rows["seq_hi"] = site.seq_hi
        rows["count"] = site.cnt
        rows["sum_ns"] = site.sm
        rows["min_ns"] = site.mn
        rows["max_ns"] = site.mx
        rows["first_enter_ns"] = site.first
        rows["last_enter_ns"] = site.last
        self.ready.append((site.t_ready, rows))

    def batches(self, until: float) -> Iterator[BlockDelivery]:
        sc = self.sc
        flush = sc.flush_s
        k = 1
        steps = self.eng.steps(until + flush)
        while k * flush <= until:
            t_round = k * flush
            while self.eng.frontier() < t_round + flush:
                if next(steps, None) is None:
                    break
            due = [rows for t, rows in self.ready if t <= t_round]
            self.ready = [(t, rows) for t, rows in self.ready if t > t_round]
            rows = np.concatenate(due) if due else np.zeros(0, BLOCK_DTYPE)
            yield from self._agents(t_round, rows)
            k += 1

    def _agents(self, t: float, rows: np.ndarray) -> Iterator[BlockDelivery]:
        """One BlockBatch per agent (a contiguous range of ranks)."""
        sc = self.sc
        a = self.agent_ranks
        order = np.argsort(rows["rank"], kind="stable")
        rows = rows[order]
        bounds = np.searchsorted(rows["rank"], np.arange(0, self.world + a, a))
        for i in range(len(self.phase)):
            lo, hi = i * a, min(self.world, (i + 1) * a)
            if lo >= hi:
                break
            mine = rows[bounds[i] : bounds[i + 1]]
            ranks = np.arange(lo, hi, dtype=np.int64)
            gl = self.rg[lo:hi]
            used = np.unique(gl[gl >= 0])
            remap = np.full(len(self.groups), -1, np.int64)
            remap[used] = np.arange(used.shape[0])
            blocks = mine.copy()
            blocks["group"] = remap[mine["group"].astype(np.int64)]
            rr = np.zeros(hi - lo, RANK_DTYPE)
            rr["rank"] = ranks
            rr["world"] = self.world
            when = t + self.phase[i] * 0.0
            rr["mono_ns"] = np.round(when * 1e9).astype(np.int64) + self.offset_ns[lo:hi]
            rr["flush_s"] = sc.flush_s
            m = gl >= 0
            pr = np.zeros(int(m.sum()), PROGRESS_DTYPE)
            pr["rank"] = np.repeat(ranks, m.sum(axis=1))
            pr["group"] = remap[gl[m]]
            pr["entered"] = self.done_seq[lo:hi][m]
            pr["completed"] = self.done_seq[lo:hi][m]
            pr["inflight_since_ns"] = -1
            gpn = sc.layout.gpus_per_node
            # an agent names its ranks' nodes once, in its first batch
            nodes = {int(r): node_name(int(r) // gpn) for r in range(lo, hi)} if i not in self.hello else {}
            self.hello.add(i)
            yield BlockDelivery(
                received_at=when + 0.002,
                batch=BlockBatch(
                    groups=[self.static[g] for g in used.tolist()],
                    ranks=rr,
                    progress=pr,
                    p2p=np.zeros(0, P2P_DTYPE),
                    blocks=blocks,
                    nodes=nodes,
                ),
            )


def stream_blocks(sc: Scenario, *, block_s: float = 0.5, agent_ranks: int = 1024) -> Iterator[BlockDelivery]:
    """Block batches of a running job, one per agent per flush period, in arrival order.

    Args:
        sc: the scenario (faults other than slow compute and slow transfers are ignored).
        block_s: about how long one block spans.
        agent_ranks: ranks per shipped batch (8: one per node; more: a rack-level aggregator).
    """
    yield from _Streamer(sc, block_s, agent_ranks).batches(sc.duration)
