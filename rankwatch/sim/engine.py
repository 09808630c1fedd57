"""The timing model: every rank's ops, step by step, in true (server) seconds.

Collectives follow the one rule the detector relies on, and nothing more: a collective completes
a transfer time after its last member enters it, so the last to arrive spends the least time
inside. Ranks of one pipeline stage run the same program, so every op is computed for all ranks
of a stage at once as numpy arrays (``(dp, tp)`` shaped); stages meet only at point-to-point
sends and receives (blocking rendezvous) and at world barriers.

Transfers of a collective go round a ring in group-rank order; a slow or dead link, NIC or NVLink
slows or stops every collective whose ring crosses it. A hung or stopped rank's next op never
ends (``inf``), and everything that waits on it inherits ``inf``.
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from rankwatch.sim.faults import Fault
from rankwatch.sim.scenario import Scenario
from rankwatch.wire import OpKind

__all__ = ["Engine", "OpChunk", "channel_uses"]

_AR = int(OpKind.ALL_REDUCE)
_RS = int(OpKind.REDUCE_SCATTER_TENSOR)
_BARRIER = int(OpKind.BARRIER)
_SEND = int(OpKind.SEND)
_RECV = int(OpKind.RECV)
_BF16 = 4


@dataclass(slots=True)
class OpChunk:
    """Ops of many ranks as columns; times in true seconds (``t_end`` is ``inf`` for ops that never end)."""

    rank: np.ndarray
    gidx: np.ndarray
    kind: np.ndarray
    peer: np.ndarray
    seq: np.ndarray
    nbytes: np.ndarray
    t_enter: np.ndarray
    t_start: np.ndarray
    t_end: np.ndarray

    def __len__(self) -> int:
        return int(self.rank.shape[0])

    @classmethod
    def concat(cls, chunks: list[OpChunk]) -> OpChunk:
        if not chunks:
            z = np.zeros(0, np.int64)
            f = np.zeros(0, np.float64)
            return cls(z, z, z, z, z, z, f, f, f)
        return cls(*(np.concatenate([getattr(c, n) for c in chunks]) for n in cls.__slots__))  # type: ignore[attr-defined]

    def take(self, idx: np.ndarray) -> OpChunk:
        return OpChunk(*(getattr(self, n)[idx] for n in self.__slots__))  # type: ignore[attr-defined]


def channel_uses(fault: Fault, edges: np.ndarray, gpus_per_node: int) -> bool:
    """Whether a channel whose transfers use the rank pairs ``edges`` goes through the fault's place."""
    if edges.shape[0] == 0:
        return False
    a, b = edges[:, 0], edges[:, 1]
    na, nb = a // gpus_per_node, b // gpus_per_node
    inter = na != nb
    if fault.where == "rnic":
        rs = np.asarray(fault.ranks)
        return bool((inter & (np.isin(a, rs) | np.isin(b, rs))).any())
    if fault.where == "nic":
        n = fault.nodes[0]
        return bool((inter & ((na == n) | (nb == n))).any())
    if fault.where == "link":
        x, y = fault.nodes
        return bool((inter & (((na == x) & (nb == y)) | ((na == y) & (nb == x)))).any())
    if fault.where == "nvl":
        return bool(((~inter) & (na == fault.nodes[0])).any())
    return False


class Engine:
    """Runs a scenario's ranks step by step; ``steps()`` yields one ``OpChunk`` per step."""

    def __init__(self, sc: Scenario) -> None:
        self.sc = sc
        lay = self.lay = sc.layout
        self.wl = sc.workload
        prof = self.prof = sc.profile
        self.rng = np.random.default_rng(np.random.SeedSequence([sc.seed, 1]))
        world = lay.world
        self.t_free = self.rng.uniform(0.0, 0.3, world)  # processes start a little apart
        self.last_enter = np.full(world, -np.inf)
        self.hetero = np.exp(self.rng.normal(0.0, prof.hetero_sigma, world))
        self.step = 0
        self.seq: dict[tuple[object, ...], int] = {}
        self.first_done: set[tuple[object, ...]] = set()
        # when each rank stops executing (hang, SIGSTOP, crash, killed by the launcher)
        self.t_stop = np.full(world, np.inf)
        for f in sc.faults:
            if f.kind in ("hang_compute", "stop", "crash"):
                hit = np.asarray(f.hit_ranks(lay.gpus_per_node, world), dtype=np.int64)
                self.t_stop[hit] = np.minimum(self.t_stop[hit], f.onset)
        for f in sc.faults:
            if f.kind == "crash" and f.kill_after is not None:
                others = np.ones(world, bool)
                others[list(f.hit_ranks(lay.gpus_per_node, world))] = False
                self.t_stop[others] = np.minimum(self.t_stop[others], f.onset + f.kill_after)
        self.slow_compute = [f for f in sc.faults if f.kind == "slow_compute"]
        self.comm_faults = [f for f in sc.faults if f.kind in ("slow_comm", "hang_comm")]
        self._build_costs()
        self._build_channel_masks()
        self.programs = [self._program(p) for p in range(lay.pp)]
        # per stage: its ranks and group indices, and which ranks each straggler fault hits
        self.st_ranks = [lay.stage_ranks(p) for p in range(lay.pp)]
        self.st_flat = [r.ravel() for r in self.st_ranks]
        self.st_tp = [lay.tp_gidx(p) for p in range(lay.pp)]
        self.st_dp = [lay.dp_gidx(p) for p in range(lay.pp)]
        self.pp_g = lay.pp_gidx()
        self.slow_hit = {
            id(f): np.isin(np.arange(world), f.hit_ranks(lay.gpus_per_node, world)) for f in self.slow_compute
        }
        self.step_ends: list[float] = []

    # -- set-up ------------------------------------------------------------------------------------
    def _build_costs(self) -> None:
        lay, wl = self.lay, self.wl
        m, lt = wl.microbatches, wl.tp_ops
        compute = (1.0 - wl.comm_share) * wl.step_s
        weights = {"tp": 0.5 if lay.tp > 1 else 0.0, "dp": 0.3 if lay.dp > 1 else 0.0, "pp": 0.2 if lay.pp > 1 else 0.0}
        total_w = sum(weights.values()) or 1.0
        comm = wl.comm_share * wl.step_s
        self.c_data = 0.03 * compute
        self.c_opt = 0.05 * compute
        per_pass = 0.92 * compute / (3.0 * m * lt)
        self.c_fwd = per_pass
        self.c_bwd = 2.0 * per_pass
        self.t_tp = comm * weights["tp"] / total_w / max(1, 2 * m * lt)
        self.t_dp = comm * weights["dp"] / total_w / max(1, wl.dp_ops)
        self.t_pp = comm * weights["pp"] / total_w / max(1, 2 * m)
        self.t_world = 0.002

    def _build_channel_masks(self) -> None:
        """For every comm fault: which channels (groups, p2p pairs) its place lies on."""
        lay = self.lay
        gpn = lay.gpus_per_node
        self.tp_mask: list[list[np.ndarray]] = []
        self.dp_mask: list[list[np.ndarray]] = []
        self.pp_mask: list[list[np.ndarray]] = []
        self.world_mask: list[bool] = []
        for f in self.comm_faults:
            tpm, dpm, ppm = [], [], []
            for p in range(lay.pp):
                st = lay.stage_ranks(p)
                tpm.append(np.array([channel_uses(f, lay.ring_edges(row), gpn) for row in st], dtype=bool))
                dpm.append(np.array([channel_uses(f, lay.ring_edges(col), gpn) for col in st.T], dtype=bool))
                if p + 1 < lay.pp:
                    nxt = lay.stage_ranks(p + 1)
                    ppm.append(
                        np.array(
                            [
                                [channel_uses(f, np.array([[a, b]]), gpn) for a, b in zip(r1, r2, strict=True)]
                                for r1, r2 in zip(st, nxt, strict=True)
                            ],
                            dtype=bool,
                        )
                    )
            self.tp_mask.append(tpm)
            self.dp_mask.append(dpm)
            self.pp_mask.append(ppm)
            self.world_mask.append(channel_uses(f, lay.ring_edges(np.arange(lay.world)), gpn))

    def _program(self, p: int) -> list[tuple[str, ...]]:
        lay, wl = self.lay, self.wl
        prog: list[tuple[str, ...]] = [("compute", "data")]
        for _ in range(wl.microbatches):
            if p > 0:
                prog.append(("recv", "f"))
            for _ in range(wl.tp_ops):
                prog.append(("compute", "fwd"))
                if lay.tp > 1:
                    prog.append(("tp",))
            if p < lay.pp - 1:
                prog.append(("send", "f"))
        for _ in range(wl.microbatches):
            if p < lay.pp - 1:
                prog.append(("recv", "b"))
            for _ in range(wl.tp_ops):
                prog.append(("compute", "bwd"))
                if lay.tp > 1:
                    prog.append(("tp",))
            if p > 0:
                prog.append(("send", "b"))
        if lay.dp > 1:
            prog.extend([("dp",)] * wl.dp_ops)
        prog.append(("compute", "opt"))
        return prog

    # -- running -----------------------------------------------------------------------------------
    def frontier(self) -> float:
        """Every op that starts before this time has been simulated."""
        return float(self.t_free.min())

    def steps(self, until: float) -> Iterator[OpChunk]:
        """Simulate whole steps until every rank is past ``until`` (or stopped for good)."""
        while self.frontier() < until:
            yield self._run_step()
            self.step += 1

    def _run_step(self) -> OpChunk:
        lay, prof = self.lay, self.prof
        self.out: list[OpChunk] = []
        world = lay.world
        self.step_factor = float(np.exp(self.rng.normal(0.0, prof.step_sigma))) if prof.step_sigma else 1.0
        self.rank_factor = np.exp(self.rng.normal(0.0, prof.rank_step_sigma, world)) if prof.rank_step_sigma else None
        if self.step == 0 and prof.first_step_x > 1.0:
            extra = prof.first_step_x * (1.0 + 0.5 * self.rng.uniform(0, 1, world))
            self.rank_factor = extra if self.rank_factor is None else self.rank_factor * extra
        pcs = [0] * lay.pp
        progs = self.programs
        ckpt = prof.ckpt_every > 0 and self.step > 0 and self.step % prof.ckpt_every == 0
        while True:
            progressed = False
            for p in range(lay.pp):
                prog = progs[p]
                while pcs[p] < len(prog):
                    ins = prog[pcs[p]]
                    op = ins[0]
                    if op == "compute":
                        self._compute(p, ins[1])
                    elif op == "tp":
                        self._tp(p)
                    elif op == "dp":
                        self._dp(p)
                    else:
                        q = p + 1 if (op, ins[1]) in (("send", "f"), ("recv", "b")) else p - 1
                        if pcs[q] >= len(progs[q]):
                            raise RuntimeError("pipeline schedule deadlocked")
                        other = progs[q][pcs[q]]
                        want = ("recv" if op == "send" else "send", ins[1])
                        if other != want:
                            break
                        src, dst = (p, q) if op == "send" else (q, p)
                        self._p2p(src, dst, ins[1])
                        pcs[q] += 1
                    pcs[p] += 1
                    progressed = True
            if all(pcs[p] >= len(progs[p]) for p in range(lay.pp)):
                break
            if not progressed:
                raise RuntimeError("pipeline schedule deadlocked")
        if ckpt:
            self._checkpoint()
        fin = self.t_free[np.isfinite(self.t_free)]
        if fin.size:
            self.step_ends.append(float(fin.max()))
        return OpChunk.concat(self.out)

    # -- ops ---------------------------------------------------------------------------------------
    def _stop(self, ranks: np.ndarray, end: np.ndarray) -> np.ndarray:
        return np.where(end > self.t_stop[ranks], np.inf, end)

    def _compute(self, p: int, what: str) -> None:
        ranks = self.st_flat[p]
        base = {"data": self.c_data, "fwd": self.c_fwd, "bwd": self.c_bwd, "opt": self.c_opt}[what]
        self._compute_ranks(ranks, base)

    def _compute_ranks(self, ranks: np.ndarray, base: float | np.ndarray) -> None:
        prof = self.prof
        n = ranks.shape[0]
        start = self.t_free[ranks]
        dur = base * self.hetero[ranks] * self.step_factor
        if prof.cpu_sigma:
            dur = dur * np.exp(self.rng.normal(0.0, prof.cpu_sigma, n))
        if self.rank_factor is not None:
            dur = dur * self.rank_factor[ranks]
        for f in self.slow_compute:
            hit = self.slow_hit[id(f)][ranks]
            if hit.any():
                dur = np.where(hit & f.active_mask(start), dur * f.factor, dur)
        if prof.gc_rate:
            pause = self.rng.uniform(0, 1, n) < prof.gc_rate * dur
            if pause.any():
                dur = dur + pause * self.rng.lognormal(np.log(prof.gc_s), 0.5, n)
        self.t_free[ranks] = self._stop(ranks, start + dur)

    def _transfer(self, base: float, n: int, key: tuple[object, ...]) -> np.ndarray:
        prof = self.prof
        t = np.full(n, base)
        if prof.net_sigma:
            t = t * np.exp(self.rng.normal(0.0, prof.net_sigma, n))
        if prof.net_spike_p:
            spike = self.rng.uniform(0, 1, n) < prof.net_spike_p
            t = np.where(spike, t * prof.net_spike_x, t)
        if self.step == 0 and prof.init_s and key not in self.first_done and key[0] != "pp":
            self.first_done.add(key)
            t = t + prof.init_s * (1.0 + 0.5 * self.rng.uniform(0, 1, n))
        return t

    def _comm_factor(self, masks: list[np.ndarray], when: np.ndarray) -> np.ndarray:
        factor = np.ones(when.shape)
        for f, m in zip(self.comm_faults, masks, strict=True):
            if not m.any():
                continue
            act = m & f.active_mask(when)
            if f.kind == "hang_comm":
                factor = np.where(act, np.inf, factor)
            else:
                factor = np.where(act, np.maximum(factor, f.factor), factor)
        return factor

    def _next_seq(self, key: tuple[object, ...]) -> int:
        s = self.seq.get(key, 0) + 1
        self.seq[key] = s
        return s

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
        n = ranks.shape[0]
        if self.wl.backend == "nccl":
            enter = np.maximum(self.last_enter[ranks], start - self.rng.uniform(0.0, 0.002, n))
            enter = np.where(np.isfinite(start), enter, np.inf)
        else:
            enter = start
        fin = np.isfinite(enter)
        self.last_enter[ranks[fin]] = enter[fin]
        self.out.append(
            OpChunk(
                ranks.astype(np.int64),
                gidx.astype(np.int64),
                np.full(n, kind, np.int64),
                np.broadcast_to(np.asarray(peer, np.int64), (n,)).copy(),
                np.full(n, seq, np.int64),
                np.full(n, nbytes, np.int64),
                enter,
                start,
                end,
            )
        )

    def _collective(
        self,
        ranks2d: np.ndarray,
        axis: int,
        gidx2d: np.ndarray,
        kind: int,
        nbytes: int,
        base: float,
        masks: list[np.ndarray],
        key: tuple[object, ...],
    ) -> None:
        """One collective in every group of a stage: groups lie along ``axis`` of ``ranks2d``."""
        start = self.t_free[ranks2d]
        last = start.max(axis=axis)
        n_groups = last.shape[0]
        transfer = self._transfer(base, n_groups, key) * self._comm_factor(masks, last)
        end_g = last + transfer
        end = np.expand_dims(end_g, axis) + np.zeros_like(start)
        flat_r = ranks2d.ravel()
        end_flat = end.ravel()
        seq = self._next_seq(key)
        self._emit(flat_r, gidx2d.ravel(), kind, -1, seq, nbytes, start.ravel(), end_flat)
        self.t_free[flat_r] = self._stop(flat_r, end_flat)

    def _tp(self, p: int) -> None:
        masks = [m[p] for m in self.tp_mask]
        self._collective(self.st_ranks[p], 1, self.st_tp[p], _AR, self.wl.tp_bytes, self.t_tp, masks, ("tp", p))

    def _dp(self, p: int) -> None:
        masks = [m[p] for m in self.dp_mask]
        self._collective(self.st_ranks[p], 0, self.st_dp[p], _RS, self.wl.dp_bytes, self.t_dp, masks, ("dp", p))

    def _p2p(self, src: int, dst: int, direction: str) -> None:
        a = self.st_ranks[src]
        b = self.st_ranks[dst]
        sa, sb = self.t_free[a], self.t_free[b]
        last = np.maximum(sa, sb)
        boundary = min(src, dst)
        masks = [m[boundary] for m in self.pp_mask]
        t = self._transfer(self.t_pp, last.size, ("pp", boundary, direction)).reshape(last.shape)
        end = last + t * self._comm_factor(masks, last)
        gidx = self.pp_g
        seq = self._next_seq(("p2p", src, dst))
        self._emit(a.ravel(), gidx.ravel(), _SEND, dst, seq, self.wl.pp_bytes, sa.ravel(), end.ravel())
        self._emit(b.ravel(), gidx.ravel(), _RECV, src, seq, self.wl.pp_bytes, sb.ravel(), end.ravel())
        self.t_free[a.ravel()] = self._stop(a.ravel(), end.ravel())
        self.t_free[b.ravel()] = self._stop(b.ravel(), end.ravel())

    def _checkpoint(self) -> None:
        """Every rank writes its shard (skewed), then all meet in a barrier of the default group."""
        lay, prof = self.lay, self.prof
        ranks = np.arange(lay.world, dtype=np.int64)
        base = prof.ckpt_s + prof.ckpt_skew_s * self.rng.uniform(-0.5, 0.5, lay.world)
        saved = self.rank_factor
        self.rank_factor = None
        self._compute_ranks(ranks, np.maximum(base, 0.1) / (self.hetero * self.step_factor))
        self.rank_factor = saved
        if not lay.world_group:
            return
        start = self.t_free[ranks]
        last = start.max()
        factor = self._comm_factor([np.array(w) for w in self.world_mask], np.array(last))
        end = np.full(lay.world, last + self.t_world * float(factor))
        seq = self._next_seq(("world",))
        self._emit(ranks, np.zeros(lay.world, np.int64), _BARRIER, -1, seq, 0, start, end)
        self.t_free[ranks] = self._stop(ranks, end)


def save_after(sc: Scenario, t: float) -> tuple[float, float]:
    """Start and end (true time) of the first checkpoint save of ``sc`` that starts at ``t`` or later.

    A save ends every ``ckpt_every``-th step: it starts about one step after the step before it
    ended (the median step so far, saves left out) and ends when that step does. Faults that start
    after the save's start do not move it; the scenario's own are left out here.
    """
    eng = Engine(dataclasses.replace(sc, faults=()))
    every = sc.profile.ckpt_every
    if every <= 0:
        raise ValueError(f"profile {sc.profile.name!r} does not save")
    for _ in eng.steps(sc.duration):
        ends = eng.step_ends
        k = len(ends) - 1
        if k >= 2 and k % every == 0:
            steps = [b - a for i, (a, b) in enumerate(itertools.pairwise(ends)) if (i + 1) % every]
            start = ends[k - 1] + statistics.median(steps)
            if start >= t:
                return start, ends[k]
    raise ValueError(f"no save starts after {t:.1f} s in {sc.duration:.0f} s")
