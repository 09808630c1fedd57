"""The shipper: a daemon thread that turns the ring into batches, sends them, and obeys replies.

Every ``flush_s`` it drains the ring, adds the heartbeat (per-group entered/completed sequence
numbers, what is in flight and since when, the training thread's stack when something is stuck),
and POSTs one batch to ``/ingest``. A collector that is down, hangs or answers garbage costs
this thread timeouts and backoff; training never waits on it, and records pile up in the bounded
ring meanwhile (the overflow is counted and reported when the collector is back).

Large jobs ship block summaries instead of raw records (``blockmode.py``): same header, same
replies, the records summarised per group and block of sequence numbers.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import logging
import random
import sys
import threading
import time
import traceback
import urllib.parse
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rankwatch import __version__
from rankwatch.blockwire import BLOCK_CONTENT_TYPE, rank_body
from rankwatch.hooks.blockmode import BlockShaper
from rankwatch.wire import CONTENT_TYPE, KIND_NAMES, Records, encode_batch, ranks_to_runs

if TYPE_CHECKING:
    from rankwatch.hooks.recorder import Recorder

__all__ = ["HttpTransport", "Shipper", "Transport"]

logger = logging.getLogger(__name__)

Transport = Callable[[bytes, dict[str, str], float], tuple[int, bytes]]
"""(body, headers, timeout) -> (HTTP status, response body); raises OSError when unreachable."""

MAX_RECORDS_PER_BATCH = 250_000
MAX_BACKOFF_S = 30.0
_perf = time.perf_counter_ns


class HttpTransport:
    """POST to ``<base>/ingest`` over one kept-alive ``http.client`` connection."""

    def __init__(self, base: str) -> None:
        parts = urllib.parse.urlsplit(base)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port
        self._path = (parts.path or "") + "/ingest"
        self._conn: http.client.HTTPConnection | None = None

    def __call__(self, body: bytes, headers: dict[str, str], timeout: float) -> tuple[int, bytes]:
        for attempt in (0, 1):
            conn = self._conn
            if conn is None:
                cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
                conn = self._conn = cls(self._host, self._port, timeout=timeout)
            conn.timeout = timeout
            if conn.sock is not None:
                conn.sock.settimeout(timeout)
            try:
                conn.request("POST", self._path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read(1 << 20)
                if resp.getheader("connection", "").lower() == "close":
                    self.close()
                return resp.status, data
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self.close()
                if attempt:  # a kept-alive connection the server closed: retry once fresh
                    raise
            except BaseException:
                self.close()
                raise
        raise OSError("unreachable")  # pragma: no cover

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:
                pass
            self._conn = None


class Shipper:
    """Builds batches from the recorder and ships them; one per process."""

    def __init__(self, recorder: Recorder, *, transport: Transport | None = None) -> None:
        self.rec = recorder
        cfg = recorder.config
        self.transport: Transport = transport or HttpTransport(cfg.collector.base)
        self.headers = {"Content-Type": CONTENT_TYPE, "User-Agent": f"rankwatch-hooks/{__version__}"}
        if cfg.collector.token:
            self.headers["Authorization"] = f"Bearer {cfg.collector.token}"
        self.batch_no = 0
        self._pending: bytes | None = None
        self._pending_records = 0
        self._send_lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.failures = 0
        self.next_try = 0.0
        self.sent_batches = 0
        self.rejected_batches = 0
        self.shipped_records = 0
        self.last_error: str | None = None
        self._typical_ns: dict[int, float] = {}
        self._attachments: dict[str, Any] = {}
        self._done_commands: list[str] = []
        self._ignored_commands: list[str] = []
        self.ignored_total = 0
        self._seen_commands: set[str] = set()
        self._exit_lock = threading.Lock()
        self._job_tries = 0
        self.shaper = BlockShaper(flush_s=cfg.flush_s, block_s=cfg.block_s, max_held=cfg.ring_records)
        self.blocks_refused = False  # the collector does not take block batches: raw from then on
        self._pending_blocks = False

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="rankwatch-shipper", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def _run(self) -> None:
        flush_s = self.rec.config.flush_s
        while not self.rec.halted:
            self._wake.wait(flush_s)
            self._wake.clear()
            try:
                if time.monotonic() >= self.next_try:
                    self.flush()
            except Exception:
                self.rec.errors += 1
                logger.debug("rankwatch: shipper error", exc_info=True)

    # -- building ---------------------------------------------------------------------------------
    def flush(self, *, final: bool = False, timeout: float | None = None) -> bool:
        """Send the pending batch, or build and send a new one. Returns True when delivered."""
        limit = self.rec.config.timeout_s if timeout is None else timeout
        if not self._send_lock.acquire(timeout=limit if final else -1):
            return False
        try:
            if final and self.failures >= 3:
                return False  # a collector that keeps failing must not delay the process's exit
            if self._pending is None:
                with self.rec.torch_section() as allowed:
                    body = self._build(final) if allowed else None
                if body is None:
                    return False
                self._pending = body
            return self._send(self._pending, limit)
        finally:
            self._send_lock.release()

    def _identity(self) -> tuple[str, int, int] | None:
        rec = self.rec
        if rec.rank is None or rec.world is None:
            rank, world = _env_int("RANK"), _env_int("WORLD_SIZE")
            if rank is None or world is None:
                return None
            rec.rank, rec.world = rank, world
        if rec.job is None:
            rec.job = self._shared_job_id()
        return rec.job, rec.rank, rec.world

    def _shared_job_id(self) -> str:
        """Rank 0's id, shared through the default group's store (first writer wins)."""
        import os

        try:
            store = self.rec.world_store()
            if store is not None:
                from rankwatch.hooks.identity import JOB_STORE_KEY

                mine = f"job-{uuid.uuid4().hex[:12]}"
                got = store.compare_set(JOB_STORE_KEY, "", mine)
                value = got.decode() if isinstance(got, bytes) else str(got)
                if value:
                    return value
        except Exception:
            logger.debug("rankwatch: could not share a job id through the store", exc_info=True)
        addr = os.environ.get("MASTER_ADDR", "local")
        port = os.environ.get("MASTER_PORT", "0")
        return f"unnamed-{addr}-{port}"

    def _build(self, final: bool) -> bytes | None:
        ident = self._identity()
        if ident is None:
            return None
        job, rank, world = ident
        rec = self.rec
        now = _perf()
        self._sweep(now)
        rows = rec.ring.drain(MAX_RECORDS_PER_BATCH)
        records = _records(rows)
        self._learn_durations(records)
        blocks = not self.blocks_refused and rec.config.blocks_for(world)
        sizes: dict[int, int] = {}
        wants: dict[int, int] = {}
        if blocks:
            keys = [st.key for st in list(rec.groups)]
            records, sizes, wants = self.shaper.shape(records, keys, now, final=final)
        referenced = {int(g) for g in set(records.group.tolist())} if len(records) else set()
        if blocks and len(self.shaper.held):
            referenced |= {int(g) for g in set(self.shaper.held.group.tolist())}
        groups, position, stuck = self._groups(now, world, referenced)
        if len(records):
            import numpy as np

            lut = np.zeros(len(self.rec.groups), dtype=np.uint16)
            for gidx, pos in position.items():
                lut[gidx] = pos
            records = dataclasses.replace(records, group=lut[records.group.astype(np.int64)])
        header: dict[str, Any] = {
            "job": job,
            "rank": rank,
            "world": world,
            "node": rec.node,
            "incarnation": rec.incarnation,
            "restart": rec.restart,
            "batch": self.batch_no,
            "mono_ns": now,
            "wall_ns": time.time_ns(),
            "flush_s": rec.config.flush_s,
            "state": rec.state if final or rec.state != "running" else "running",
            "drops": rec.drops(),
            "pid": rec.meta.get("pid"),
            "meta": rec.meta,
            "groups": groups,
            "control": {
                "allowed": rec.config.control,
                "done": self._done_commands[:],
                "ignored": self._ignored_commands[:],
                "ignored_total": self.ignored_total,
            },
            "stats": {
                "errors": rec.errors,
                "failures": self.failures,
                "rejected": self.rejected_batches,
            },
        }
        if rec.end_reason:
            header["end_reason"] = rec.end_reason
        if stuck or (final and rec.state == "crashed"):
            header["stack"] = _main_stack()
        if self._attachments:
            header["attachments"] = self._attachments
            self._attachments = {}
        self._done_commands.clear()
        self._ignored_commands.clear()
        self.batch_no += 1
        self._pending_records = len(records)
        self._pending_blocks = blocks
        if blocks:
            return self._block_body(header, records, position, sizes, wants)
        return encode_batch(header, records)

    def _block_body(
        self,
        header: dict[str, Any],
        records: Records,
        position: dict[int, int],
        sizes: dict[int, int],
        wants: dict[int, int],
    ) -> bytes:
        """The batch as block summaries: each group entry says the block size its rows use, or
        proposes one while the collector has not settled it."""
        import numpy as np

        from rankwatch.sim.blocks import summarise

        groups = header["groups"]
        bs = np.ones(max(1, len(groups)), np.int64)
        known = self.shaper.sizes
        for st in list(self.rec.groups):
            pos = position.get(st.gidx)
            if pos is None:
                continue
            b = sizes.get(st.gidx) or known.get(st.key)
            if b:
                groups[pos]["block_seqs"] = bs[pos] = b
            elif st.gidx in wants:
                groups[pos]["block_want"] = wants[st.gidx]
        header["drops"] = int(header.get("drops", 0)) + self.shaper.dropped
        return rank_body(header, summarise(records, int(header["rank"]), bs))

    def _groups(self, now: int, world: int, referenced: set[int]) -> tuple[list[dict[str, Any]], dict[int, int], bool]:
        """Header entries for live groups (and retired ones this batch has records of)."""
        import torch.distributed.distributed_c10d as c10d

        out: list[dict[str, Any]] = []
        position: dict[int, int] = {}
        stuck = False
        stack_after = int(self.rec.config.stack_after_s * 1e9)
        last_enter = 0
        for st in list(self.rec.groups):
            if st.retired and st.gidx not in referenced:
                continue
            position[st.gidx] = len(out)
            pg = st.pg_ref()
            entry: dict[str, Any] = {"id": st.key, "desc": st.desc, "entered": st.seq}
            members = st.members
            if pg is not None and members is None:
                mapping = c10d._world.pg_group_ranks.get(pg)
                if mapping:
                    members = sorted(mapping, key=mapping.__getitem__)
            if st.retired:
                entry["retired"] = True
            if members and max(members) < world:
                entry["ranks"] = ranks_to_runs(members)
            if pg is not None:
                try:
                    entry["size"] = int(pg.size())
                    entry["group_rank"] = int(pg.rank())
                    entry["backend"] = str(pg._get_backend_name())
                except Exception:
                    pass
            inflight = list(st.inflight.values())
            cur = st.current
            if cur is not None:  # the synchronous op timed inline
                inflight.append([cur, None, st.current_kind, 0, -1, st.seq, 0])
            coll = [i for i in inflight if i[2] not in (13, 14)]
            completed = st.seq
            if coll:
                oldest = min(coll, key=lambda i: i[5])
                completed = oldest[5] - 1
                entry["inflight_since_ns"] = oldest[0]
                entry["inflight_kind"] = KIND_NAMES.get(oldest[2], "unknown")
                age = now - oldest[0]
                typical = self._typical_ns.get(st.gidx, 0.0)
                if age > max(stack_after, 10 * typical):
                    stuck = True
            entry["completed"] = max(0, min(completed, st.seq))
            p2p = [i for i in inflight if i[2] in (13, 14)]
            if p2p:
                entry["p2p_inflight"] = [
                    [KIND_NAMES.get(i[2], "?"), i[4], i[5], i[0]] for i in sorted(p2p, key=lambda i: i[0])[:16]
                ]
                if now - min(i[0] for i in p2p) > stack_after:
                    stuck = True
            last_enter = max(last_enter, st.last_enter_ns)
            out.append(entry)
        if last_enter and now - last_enter > stack_after:
            stuck = True  # not entering anything: stuck (or busy) outside collectives
        return out, position, stuck

    def _sweep(self, now: int) -> None:
        """Close async ops nobody waited on once their work reports completion (stamped late)."""
        from rankwatch.hooks.process_group import finish

        for st in self.rec.groups:
            if not st.inflight or st.cuda_default:
                continue
            for op, info in list(st.inflight.items()):
                work = info[1]
                if work is not None and now - info[0] > 1_000_000_000:
                    try:
                        if work.is_completed():
                            finish(st, op, now)
                    except Exception:
                        pass

    def _learn_durations(self, records: Records) -> None:
        if not len(records):
            return
        import numpy as np

        dur = (records.t_end - records.t_enter).astype(np.float64)
        for g in np.unique(records.group):
            m = float(dur[records.group == g].max())
            prev = self._typical_ns.get(int(g), 0.0)
            self._typical_ns[int(g)] = max(0.9 * prev, m)

    # -- sending ----------------------------------------------------------------------------------
    def _send(self, body: bytes, timeout: float) -> bool:
        headers = self.headers
        if self._pending_blocks:
            headers = headers | {"Content-Type": BLOCK_CONTENT_TYPE}
        try:
            status, data = self.transport(body, headers, timeout)
        except Exception as exc:
            self._failed(f"{type(exc).__name__}: {exc}")
            return False
        if 200 <= status < 300:
            self._pending = None
            self.failures = 0
            self.next_try = 0.0
            self.sent_batches += 1
            self.shipped_records += self._pending_records
            self._handle_reply(data)
            return True
        if status in (408, 429) or status >= 500:
            self._failed(f"HTTP {status}")
            return False
        # 4xx: the collector will never take this batch; drop it, say so once, go on
        self.rejected_batches += 1
        self._pending = None
        if status == 415 and self._pending_blocks and not self.blocks_refused:
            self.blocks_refused = True  # a collector older than block mode: raw batches from now on
            logger.warning("rankwatch: the collector does not take block summaries; sending raw records")
        msg = data[:300].decode("utf-8", "replace")
        if self.rejected_batches <= 3:
            logger.warning("rankwatch: collector rejected a batch (HTTP %s): %s", status, msg)
        return False

    def _failed(self, why: str) -> None:
        self.failures += 1
        self.last_error = why
        backoff = min(MAX_BACKOFF_S, self.rec.config.flush_s * (2 ** min(self.failures - 1, 6)))
        self.next_try = time.monotonic() + backoff * random.uniform(0.8, 1.2)
        if self.failures in (1, 10) or self.failures % 100 == 0:
            logger.info("rankwatch: collector unreachable (%s); retrying with backoff", why)

    def _handle_reply(self, data: bytes) -> None:
        try:
            reply = json.loads(data) if data else {}
        except (ValueError, UnicodeDecodeError):
            return  # garbage: ignore
        if not isinstance(reply, dict):
            return
        self.shaper.learn(reply.get("block_seqs"))
        commands = reply.get("commands")
        if not isinstance(commands, list):
            return
        for cmd in commands[:32]:
            if isinstance(cmd, dict):
                try:
                    self._command(cmd)
                except Exception:
                    logger.debug("rankwatch: command failed", exc_info=True)

    def _command(self, cmd: dict[str, Any]) -> None:
        cid = str(cmd.get("id", ""))
        if not cid or cid in self._seen_commands:
            return
        self._seen_commands.add(cid)
        kind = cmd.get("type")
        if kind == "dump_flight_recorder":
            with self.rec.torch_section() as allowed:
                trace = _dump_flight_recorder() if allowed else None
            self._attachments["flight_recorder"] = {"command": cid, "trace": trace}
            self._done_commands.append(cid)
            self.wake()
        elif kind == "exit":
            if not self.rec.config.control:
                self.ignored_total += 1
                self._ignored_commands.append(cid)
                logger.warning("rankwatch: ignoring the collector's exit command (set RANKWATCH_CONTROL=1 to allow it)")
                return
            code = int(cmd.get("code", 1))
            reason = str(cmd.get("reason", ""))
            self._done_commands.append(cid)
            at_seq, group = cmd.get("at_seq"), cmd.get("group")
            if isinstance(at_seq, int) and isinstance(group, str) and self._plan_exit(group, at_seq, code, reason, cmd):
                return
            threading.Thread(target=self._exit, args=(code, reason, True), daemon=True).start()
        else:
            self._ignored_commands.append(cid)

    def _plan_exit(self, group: str, at_seq: int, code: int, reason: str, cmd: dict[str, Any]) -> bool:
        """Exit on the training thread right before op ``at_seq`` of ``group``, the same point on
        every rank, so that on_restart callbacks may checkpoint collectively. A rank that does not
        get there within ``timeout_s`` (stuck) exits from this thread instead, without callbacks."""
        for st in self.rec.groups:
            if st.key == group and not st.retired and st.seq < at_seq:
                st.inject = ExitPlan(self, at_seq, code, reason, st.inject)
                limit = float(cmd.get("timeout_s", 60.0))
                timer = threading.Timer(limit, self._exit, args=(code, reason + " (deadline)", False))
                timer.daemon = True
                timer.start()
                return True
        return False

    def _exit(self, code: int, reason: str, callbacks: bool) -> None:
        import os

        rec = self.rec
        with self._exit_lock:
            if callbacks:
                rec.run_restart_callbacks()
            rec.state = "terminating"
            rec.end_reason = f"exit {code} by collector command" + (f": {reason}" if reason else "")
            self._pending = None
            rec.final_batch(timeout=2.0)
            logging.shutdown()
            os._exit(code)


class ExitPlan:
    """The 'before' hook of a group that exits the process when a given op is about to be entered."""

    __slots__ = ("at_seq", "code", "fired", "reason", "shipper", "then")

    def __init__(self, shipper: Shipper, at_seq: int, code: int, reason: str, then: Any) -> None:
        self.shipper, self.at_seq, self.code, self.reason, self.then = shipper, at_seq, code, reason, then
        self.fired = False

    def before(self, next_seq: int) -> None:
        if self.then is not None:
            self.then.before(next_seq)
        if next_seq >= self.at_seq and not self.fired:
            self.fired = True  # the callbacks' own collectives come through here again: let them pass
            self.shipper._exit(self.code, self.reason, True)


def _records(rows: list[Any]) -> Records:
    """Columns from ring records ``(t_enter, t_end, kind, dtype, peer, seq, nbytes, gidx[, t_start])``."""
    if not rows:
        return Records.empty()
    import numpy as np

    if any(len(r) == 9 for r in rows):
        a = np.array([r if len(r) == 9 else (*r, r[0]) for r in rows], dtype=np.int64)
        t_start = np.ascontiguousarray(a[:, 8])
    else:
        a = np.array(rows, dtype=np.int64)
        t_start = np.ascontiguousarray(a[:, 0])
    return Records(
        group=a[:, 7].astype(np.uint16),
        kind=a[:, 2].astype(np.uint8),
        dtype=a[:, 3].astype(np.uint8),
        peer=a[:, 4].astype(np.int32),
        seq=np.ascontiguousarray(a[:, 5]),
        nbytes=np.ascontiguousarray(a[:, 6]),
        t_enter=np.ascontiguousarray(a[:, 0]),
        t_start=t_start,
        t_end=np.ascontiguousarray(a[:, 1]),
    )


# NCCL groups record into the CUDA Flight Recorder (``_dump_nccl_trace_json``, CUDA builds only),
# CPU groups such as gloo into the generic one (``_dump_fr_trace_json``); on torch 2.11 with an H200
# the generic dump of an NCCL job held no entries at all. A job may use both kinds of group.
_FR_DUMPS = ("_dump_nccl_trace_json", "_dump_fr_trace_json")
_FR_ENTRY_KEY = ("process_group", "collective_seq_id", "p2p_seq_id", "profiling_name", "time_created_ns")


def _dump_flight_recorder() -> str | None:
    """This process's Flight Recorder entries, from every recorder torch has, as one JSON trace."""
    try:
        import torch._C._distributed_c10d as c

        traces = []
        for name in _FR_DUMPS:
            dump = getattr(c, name, None)
            if dump is not None:
                raw = dump(True, False)
                traces.append(json.loads(raw.decode() if isinstance(raw, bytes) else str(raw)))
        if not traces:
            return None
        return json.dumps(_merge_traces(traces))
    except Exception as exc:
        return json.dumps({"error": f"{type(exc).__name__}: {exc}"})


def _merge_traces(traces: list[dict[str, Any]]) -> dict[str, Any]:
    """One trace of several recorders' dumps: entries concatenated (the same entry once, should two
    names reach one recorder), the other keys of the first dump that has them."""
    out: dict[str, Any] = {}
    entries: list[Any] = []
    seen: set[tuple[str, ...]] = set()
    for trace in traces:
        for key, value in trace.items():
            if key != "entries":
                out.setdefault(key, value)
        for e in trace.get("entries") or []:
            ident = tuple(str(e.get(k)) for k in _FR_ENTRY_KEY)
            if ident not in seen:
                seen.add(ident)
                entries.append(e)
    out["entries"] = entries
    return out


def _main_stack() -> str | None:
    try:
        frame = sys._current_frames().get(threading.main_thread().ident or -1)
        if frame is None:
            return None
        return "".join(traceback.format_stack(frame, limit=40))[-16000:]
    except Exception:
        return None


def _env_int(name: str) -> int | None:
    import os

    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None
