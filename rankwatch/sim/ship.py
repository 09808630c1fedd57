"""What the hooks of every simulated rank send: one ``wire.Batch`` per rank per flush period.

It mirrors ``rankwatch.hooks.shipper``: records of ops completed since the last batch (on the
rank's own monotonic clock, in completion order), and a header with the rank's identity, its
state and, per group, the last sequence number entered and completed, what is in flight and since
when, and the training thread's stack when something has been stuck for a while. A stopped rank
sends nothing more; a crashed rank sends a last batch saying so; ranks the launcher terminates send
a last batch saying ``terminating``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from rankwatch.sim.engine import Engine, OpChunk
from rankwatch.sim.layout import node_name
from rankwatch.sim.scenario import Scenario
from rankwatch.wire import KIND_NAMES, P2P_KINDS, Batch, Records

__all__ = ["Delivery", "RankShippers", "STACK_COLLECTIVE", "STACK_DATALOADER", "STACK_SAVE"]

STACK_AFTER_S = 2.0

STACK_DATALOADER = (
    '  File "train.py", line 212, in <module>\n    main()\n'
    '  File "train.py", line 188, in main\n    batch = next(loader_iter)\n'
    '  File "torch/utils/data/dataloader.py", line 733, in __next__\n    data = self._next_data()\n'
    '  File "torch/utils/data/dataloader.py", line 1471, in _next_data\n    idx, data = self._get_data()\n'
)
STACK_COLLECTIVE = (
    '  File "train.py", line 212, in <module>\n    main()\n'
    '  File "train.py", line 196, in main\n    loss.backward()\n'
    '  File "torch/distributed/distributed_c10d.py", line 2806, in all_reduce\n    work.wait()\n'
)
STACK_SAVE = (
    '  File "train.py", line 212, in <module>\n    main()\n'
    '  File "train.py", line 201, in main\n    dcp.save(state, checkpoint_id=path)\n'
    '  File "torch/distributed/checkpoint/filesystem.py", line 478, in write_data\n    f.write(buf)\n'
)


@dataclass(frozen=True, slots=True)
class Delivery:
    """One batch arriving at the collector."""

    received_at: float
    batch: Batch


class RankShippers:
    """The shipper threads of every rank of one simulated job."""

    def __init__(self, sc: Scenario, engine: Engine) -> None:
        self.sc = sc
        self.engine = engine
        lay = sc.layout
        world = lay.world
        self.world = world
        rng = self.rng = np.random.default_rng(np.random.SeedSequence([sc.seed, 2]))
        self.flush = sc.flush_s
        self.offset = rng.uniform(1e3, 1e6, world).round(3)  # each rank's monotonic clock is its own
        self.t0 = engine.t_free.copy() + rng.uniform(0.0, sc.flush_s, world)
        self.k = 0
        # per-rank group lists (the header's order) and each group's static header part
        groups = lay.groups
        rank_groups = lay.rank_groups
        width = max(len(g) for g in rank_groups)
        self.rg = np.full((world, width), -1, np.int64)
        for r, gs in enumerate(rank_groups):
            self.rg[r, : len(gs)] = gs
        self.static = [g.header_entry() for g in groups]
        self.grank: list[dict[int, int]] = [{} for _ in range(world)]
        for gi, g in enumerate(groups):
            for pos, r in enumerate(g.members.tolist()):
                self.grank[r][gi] = pos
        self.entered = np.zeros((world, width), np.int64)
        self.last_enter = np.full(world, -np.inf)
        # endings
        self.hb_stop = np.full(world, np.inf)  # no batch at or after this time
        self.final_at = np.full(world, np.inf)
        self.final_state: dict[int, tuple[str, str]] = {}
        self.hung = np.full(world, np.inf)  # ranks stuck outside collectives (their stack says where)
        for f in sc.faults:
            hit = list(f.hit_ranks(lay.gpus_per_node, world))
            if f.kind == "stop" or (f.kind == "crash" and f.silent):
                self.hb_stop[hit] = np.minimum(self.hb_stop[hit], f.onset)
            elif f.kind == "crash":
                for r in hit:
                    if f.onset < self.final_at[r]:
                        self.final_at[r] = f.onset + 0.02
                        self.final_state[r] = (
                            "crashed",
                            "RuntimeError: CUDA error: an illegal memory access was encountered",
                        )
            elif f.kind == "hang_compute":
                self.hung[hit] = np.minimum(self.hung[hit], f.onset)
            if f.kind == "crash" and f.kill_after is not None:
                kill = f.onset + f.kill_after
                for r in range(world):
                    if r not in hit and kill < self.final_at[r] and kill < self.hb_stop[r]:
                        self.final_at[r] = kill
                        self.final_state[r] = ("terminating", "SIGTERM from the launcher")
        if sc.goodbye:
            end = sc.duration
            for r in range(world):
                if end < self.final_at[r] and end < self.hb_stop[r]:
                    self.final_at[r] = end
                    self.final_state[r] = ("goodbye", "destroy_process_group")
        self.done = np.zeros(world, bool)
        self.batch_no = np.zeros(world, np.int64)
        self.arrived = np.full(world, -np.inf)  # when each rank's latest batch reached the collector
        self.buf = OpChunk.concat([])
        self.buf_lgi = np.zeros(0, np.int64)

    def add(self, chunk: OpChunk) -> None:
        """Ops the engine has simulated (any order); they ship once completed."""
        if not len(chunk):
            return
        lgi = np.argmax(self.rg[chunk.rank] == chunk.gidx[:, None], axis=1)
        self.buf = OpChunk.concat([self.buf, chunk])
        self.buf_lgi = np.concatenate([self.buf_lgi, lgi])

    def next_round_time(self) -> float:
        """The latest send time of the next round: the engine must have simulated past it."""
        ts = np.minimum(self.t0 + self.k * self.flush, self.final_at)
        live = ~self.done
        return float(ts[live].max()) if live.any() else np.inf

    def round(self) -> list[Delivery]:
        """Every live rank sends its next batch."""
        world = self.world
        ts = self.t0 + self.k * self.flush
        final = (ts >= self.final_at) & ~self.done
        ts = np.where(final, self.final_at, ts)
        self.k += 1
        live = ~self.done & (ts < self.hb_stop)
        self.done |= final | (ts >= self.hb_stop)
        b = self.buf
        ts_row = ts[b.rank]
        live_row = live[b.rank]
        entered = (b.t_enter <= ts_row) & live_row
        shipped = (b.t_end <= ts_row) & live_row
        inflight = entered & ~shipped
        coll = ~np.isin(b.kind, P2P_KINDS)
        ent = entered & coll
        np.maximum.at(self.entered, (b.rank[ent], self.buf_lgi[ent]), b.seq[ent])
        np.maximum.at(self.last_enter, b.rank[entered], b.t_enter[entered])
        inf_idx = np.flatnonzero(inflight)
        out: list[Delivery] = []
        order = np.flatnonzero(shipped)
        order = order[np.lexsort((b.t_end[order], b.rank[order]))]
        bounds = np.searchsorted(b.rank[order], np.arange(world + 1))
        inflight_by_rank: dict[int, list[int]] = {}
        for i in inf_idx.tolist():
            inflight_by_rank.setdefault(int(b.rank[i]), []).append(i)
        for r in np.flatnonzero(live).tolist():
            rows = order[bounds[r] : bounds[r + 1]]
            out.append(self._batch(r, float(ts[r]), rows, inflight_by_rank.get(r, []), bool(final[r])))
        keep = ~shipped & ~self.done[b.rank]
        self.buf = b.take(np.flatnonzero(keep))
        self.buf_lgi = self.buf_lgi[keep]
        return out

    def _ns(self, r: int, t: np.ndarray | float) -> np.ndarray:
        return np.round((np.asarray(t, dtype=np.float64) + self.offset[r]) * 1e9).astype(np.int64)

    def _batch(self, r: int, ts: float, rows: np.ndarray, inflight: list[int], final: bool) -> Delivery:
        sc, b = self.sc, self.buf
        gl = self.rg[r]
        lgi = self.buf_lgi[rows]
        records = Records(
            group=lgi.astype(np.uint16),
            kind=b.kind[rows].astype(np.uint8),
            dtype=np.full(rows.shape[0], 4, np.uint8),
            peer=b.peer[rows].astype(np.int32),
            seq=b.seq[rows].astype(np.int64),
            nbytes=b.nbytes[rows].astype(np.int64),
            t_enter=self._ns(r, b.t_enter[rows]),
            t_start=self._ns(r, b.t_start[rows]),
            t_end=self._ns(r, b.t_end[rows]),
        )
        groups = []
        stuck = False
        by_group: dict[int, list[int]] = {}
        for i in inflight:
            by_group.setdefault(int(self.buf_lgi[i]), []).append(i)
        for j, gi in enumerate(gl.tolist()):
            if gi < 0:
                break
            e = dict(self.static[gi])
            e["group_rank"] = self.grank[r][gi]
            ent = int(self.entered[r, j])
            e["entered"] = ent
            e["completed"] = ent
            mine = by_group.get(j, [])
            coll = [i for i in mine if int(b.kind[i]) not in P2P_KINDS]
            if coll:
                oldest = min(coll, key=lambda i: int(b.seq[i]))
                e["completed"] = max(0, int(b.seq[oldest]) - 1)
                e["inflight_since_ns"] = int(self._ns(r, b.t_enter[oldest]))
                e["inflight_kind"] = KIND_NAMES[int(b.kind[oldest])]
                if ts - float(b.t_enter[oldest]) > STACK_AFTER_S:
                    stuck = True
            p2p = sorted((i for i in mine if int(b.kind[i]) in P2P_KINDS), key=lambda i: float(b.t_enter[i]))
            if p2p:
                e["p2p_inflight"] = [
                    [KIND_NAMES[int(b.kind[i])], int(b.peer[i]), int(b.seq[i]), int(self._ns(r, b.t_enter[i]))]
                    for i in p2p[:16]
                ]
                if ts - float(b.t_enter[p2p[0]]) > STACK_AFTER_S:
                    stuck = True
            groups.append(e)
        idle = ts - self.last_enter[r] > STACK_AFTER_S and np.isfinite(self.last_enter[r])
        header: dict[str, object] = {
            "job": sc.job,
            "rank": r,
            "world": self.world,
            "node": node_name(r // sc.layout.gpus_per_node),
            "incarnation": f"{sc.seed:x}-{r}",
            "restart": 0,
            "batch": int(self.batch_no[r]),
            "mono_ns": int(self._ns(r, ts)),
            "flush_s": self.flush,
            "state": "running",
            "drops": 0,
            "pid": 10_000 + r,
            "groups": groups,
        }
        self.batch_no[r] += 1
        if final:
            state, reason = self.final_state[r]
            header["state"] = state
            header["end_reason"] = reason
        if stuck or idle or (final and header["state"] == "crashed"):
            if ts >= self.hung[r]:
                header["stack"] = STACK_DATALOADER
            elif stuck:
                header["stack"] = STACK_COLLECTIVE
            else:
                header["stack"] = STACK_SAVE
        latency = sc.profile.net_latency_s * float(self.rng.lognormal(0.0, 0.5))
        # a rank ships its batches one at a time, in order (``hooks.shipper``: one send lock), so
        # one sent while the one before is still on its way leaves once that one has arrived.
        # Drawn apart, a last batch sent a few ms after a regular one could come in first: the
        # regular one then set the rank running again, and its silence named it dead (a crashed
        # rank 5 s late, not at once: fresh-crash-000; a rank the launcher killed, beside the
        # crash: ``bench/probe_classes.py`` seed 61206, crash-002). The collector would have
        # dropped the overtaken batch as a retry (``JobState.is_duplicate``)
        at = max(ts, float(self.arrived[r])) + latency
        self.arrived[r] = at
        return Delivery(at, Batch(header=header, records=records))


def deliveries(sc: Scenario, step_ends: list[float] | None = None) -> Iterator[Delivery]:
    """Every batch of a scenario, in the order the collector receives them.

    Args:
        sc: the scenario.
        step_ends: if given, receives the server time each training step ended (for ground truth).
    """
    engine = Engine(sc)
    if step_ends is not None:
        engine.step_ends = step_ends
    ship = RankShippers(sc, engine)
    steps = engine.steps(sc.duration + 1.0)
    pending: list[Delivery] = []
    while True:
        need = ship.next_round_time()
        if need > sc.duration:
            break
        while engine.frontier() < need + 0.01:
            chunk = next(steps, None)
            if chunk is None:
                break
            ship.add(chunk)
        got = ship.round()
        pending.extend(got)
        pending.sort(key=lambda d: d.received_at)
        horizon = need - 2 * sc.flush_s
        cut = 0
        while cut < len(pending) and pending[cut].received_at <= horizon:
            cut += 1
        yield from pending[:cut]
        del pending[:cut]
    pending.sort(key=lambda d: d.received_at)
    yield from (d for d in pending if d.received_at <= sc.duration + 1.0)
