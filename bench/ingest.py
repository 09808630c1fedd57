"""Ingest in raw mode: a real ``rankwatch serve`` on loopback, a load generator of rank streams.

Every simulated rank sends what a rank of a hybrid-parallel job sends: one batch per second of
100 op records (60 on its tensor-parallel group of 8, 36 on its data-parallel group, 4 on the
world group), encoded with ``rankwatch.wire``; every member of a group reports the same sequence
numbers. The server is pinned to one CPU and the load generator to another, so "per core" means
what it says; server CPU is read from /proc. Figures:

  throughput   records per second of server CPU, closed loop (64 connections), each request one
               rank's batch ("direct"), or eight ranks' batches in one multi-batch ("agent", as
               ``rankwatch agent`` sends them)
  latency      1,000 rank streams, each on its own kept-alive connection sending one batch a second
               at its own phase, open loop, after one round and the first write of the new ranks:
               p50 / p99 / max time from sending a batch to its reply
  growth       the same job at 1k, 2k, 5k, ... ranks: server CPU per record while ingesting, the
               background CPU (persist loop, leases, analysis) in the 5 s after, and memory: RSS
               grown since the idle server, per 1,000 ranks, overall and from the size before
               (the raw-record ring per job is bounded, so the marginal figure is the per-rank cost)

    python bench/ingest.py [--db postgresql://...] [--max-ranks 20000] [--latency-s 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rankwatch.multibatch import MULTI_CONTENT_TYPE, encode_multi
from rankwatch.wire import CONTENT_TYPE, MAGIC, WIRE_VERSION, OpKind, Records, encode_batch

PER_BATCH = {"tp": 60, "dp": 36, "world": 4}  # 100 ops per rank per second
TP = 8
BIN = Path(sys.executable).parent
TICK = os.sysconf("SC_CLK_TCK")


# -- the workload ---------------------------------------------------------------------------------
def _block(round_no: int) -> tuple[bytes, int, dict[str, int]]:
    """The column block every rank sends in one round (members of a group share sequence numbers),
    its record count and the 'entered' count per group."""
    rng = np.random.default_rng(round_no)
    kinds = {
        "tp": (OpKind.ALL_GATHER_INTO_TENSOR, 4 << 20),
        "dp": (OpKind.ALL_REDUCE, 25 << 20),
        "world": (OpKind.BARRIER, 0),
    }
    order = ["world", "tp", "dp"]
    rows = []
    t = 1_000_000_000 + round_no * 1_000_000_000
    for gi, name in enumerate(order):
        n = PER_BATCH[name]
        kind, size = kinds[name]
        for i in range(n):
            seq = round_no * n + i + 1
            dur = int(rng.lognormal(np.log(2e6), 0.5))
            rows.append((gi, int(kind), 4, -1, seq, size, t, t + 1000, t + 1000 + dur))
            t += 9_000_000
    rows.sort(key=lambda r: r[6])
    body = encode_batch({"job": "x"}, Records.from_rows(rows))
    prefix = struct.Struct("<4sHHII")
    _, _, flags, head_len, n = prefix.unpack_from(body)
    entered = {name: (round_no + 1) * PER_BATCH[name] for name in order}
    return body[prefix.size + head_len :], n, entered | {"_flags": flags}


def _body(job: str, rank: int, world: int, round_no: int, block: bytes, n: int, entered: dict[str, int]) -> bytes:
    tp0 = rank - rank % TP
    members = {"world": [[0, world, 1]], "tp": [[tp0, min(tp0 + TP, world), 1]], "dp": [[rank % TP, world, TP]]}
    ids = {"world": "0", "tp": f"tp{tp0 // TP}", "dp": f"dp{rank % TP}"}
    groups = [
        {"id": ids[g], "desc": g, "ranks": members[g], "entered": entered[g], "completed": entered[g]}
        for g in ("world", "tp", "dp")
    ]
    header = {
        "job": job,
        "rank": rank,
        "world": world,
        "node": f"node{rank // TP}",
        "incarnation": f"0-{rank}-bench",
        "restart": 0,
        "batch": round_no,
        "mono_ns": 10_000_000_000 + round_no * 1_000_000_000,
        "state": "running",
        "drops": 0,
        "pid": 10_000 + rank,
        "flush_s": 1.0,
        "groups": groups,
    }
    head = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<4sHHII", MAGIC, WIRE_VERSION, entered["_flags"], len(head), n) + head + block


def rounds(job: str, world: int, count: int, first: int = 0) -> list[list[bytes]]:
    """``count`` rounds of one batch per rank."""
    out = []
    for r in range(first, first + count):
        block, n, entered = _block(r)
        out.append([_body(job, rank, world, r, block, n, entered) for rank in range(world)])
    return out


# -- the server -----------------------------------------------------------------------------------
@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    port: int
    tmp: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.tmp, ignore_errors=True)


NICE = 0


def start_server(db: str | None, cpu: int | None) -> Server:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tmp = Path(tempfile.mkdtemp(prefix="rankwatch-bench-"))
    cmd = [str(BIN / "rankwatch"), "serve", "--port", str(port), "--data-dir", str(tmp), "--log-level", "warning"]
    if db:
        cmd += ["--db", db]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RANKWATCH")}

    def place() -> None:
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})
        if NICE:
            os.nice(NICE)

    proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=subprocess.DEVNULL, preexec_fn=place)
    server = Server(proc, port, tmp)
    deadline = time.monotonic() + 60
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("rankwatch serve did not start") from None
            time.sleep(0.1)
    return server


def _reset_db(db: str | None) -> None:
    """A PostgreSQL database is shared between runs: empty it so each run starts alike."""
    if not db or not db.startswith("postgresql"):
        return
    import psycopg

    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("DROP SCHEMA public CASCADE")
        conn.execute("CREATE SCHEMA public")


# -- the load generator ---------------------------------------------------------------------------
class Conn:
    """One kept-alive HTTP/1.1 connection, just enough client for this benchmark."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, body: bytes, ctype: str = CONTENT_TYPE) -> tuple[int, bytes]:
        try:
            return await self._post(body, ctype)
        except (asyncio.IncompleteReadError, ConnectionError):  # the server closed an idle connection
            self.close()
            self.writer = None
            return await self._post(body, ctype)

    async def _post(self, body: bytes, ctype: str) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        assert self.reader is not None
        head = f"POST /ingest HTTP/1.1\r\nHost: b\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n\r\n"
        self.writer.write(head.encode() + body)
        status_line = await self.reader.readuntil(b"\r\n")
        headers = await self.reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in headers.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        reply = await self.reader.readexactly(length)
        return int(status_line.split()[1]), reply

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


async def closed_loop(port: int, bodies: list[bytes], conns: int, ctype: str = CONTENT_TYPE) -> float:
    """Send every body, ``conns`` at a time; returns the wall time."""
    queue = list(reversed(bodies))

    async def worker() -> None:
        c = Conn(port)
        while queue:
            status, reply = await c.post(queue.pop(), ctype)
            if status != 200:
                raise RuntimeError(f"HTTP {status}: {reply[:200]!r}")
        c.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(conns)))
    return time.perf_counter() - t0


async def open_loop(
    port: int, warmup: list[bytes], per_stream: list[list[bytes]], period_s: float = 1.0
) -> list[float]:
    """One kept-alive connection per stream, opened and used once (``warmup``) before timing starts,
    as ranks keep theirs; then stream i sends its k-th batch at phase_i + k * period."""
    conns = [Conn(port) for _ in per_stream]
    for i in range(0, len(conns), 100):  # connect (and send round 0) a hundred at a time
        await asyncio.gather(*(c.post(b) for c, b in zip(conns[i : i + 100], warmup[i : i + 100], strict=True)))
    await asyncio.sleep(2.0)  # the steady state: the first write of the new ranks (a one-off pause) is over
    rng = np.random.default_rng(0)
    latencies: list[float] = []
    start = time.perf_counter() + 1.0

    async def stream(c: Conn, batches: list[bytes], phase: float) -> None:
        for k, body in enumerate(batches):
            due = start + phase + k * period_s
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            t = time.perf_counter()
            status, reply = await c.post(body)
            if status != 200:
                raise RuntimeError(f"HTTP {status}: {reply[:200]!r}")
            latencies.append(time.perf_counter() - t)
        c.close()

    await asyncio.gather(
        *(stream(c, b, float(rng.uniform(0, period_s))) for c, b in zip(conns, per_stream, strict=True))
    )
    return latencies


def _loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        return uvloop.new_event_loop()  # type: ignore[no-any-return]
    except ImportError:
        return asyncio.new_event_loop()


def run(coro: object) -> object:
    loop = _loop()
    try:
        return loop.run_until_complete(coro)  # type: ignore[arg-type]
    finally:
        loop.close()


# -- the measurements -----------------------------------------------------------------------------
def throughput(db: str | None, cpus: tuple[int | None, int | None], ranks: int = 1000, n_rounds: int = 8) -> None:
    data = rounds("tput", ranks, n_rounds)
    records = 100 * ranks
    for mode in ("direct", "agent"):
        _reset_db(db)
        srv = start_server(db, cpus[0])
        try:
            run(closed_loop(srv.port, data[0], 64))  # the job's first round: ranks and lease come into being
            c0, w = srv.cpu_s(), 0.0
            for batch in data[1:]:
                if mode == "direct":
                    w += float(run(closed_loop(srv.port, batch, 64)))  # type: ignore[arg-type]
                else:
                    multis = [encode_multi(batch[i : i + TP]) for i in range(0, len(batch), TP)]
                    w += float(run(closed_loop(srv.port, multis, 16, MULTI_CONTENT_TYPE)))  # type: ignore[arg-type]
            cpu = srv.cpu_s() - c0
            n = records * (n_rounds - 1)
            per_req = "1 batch" if mode == "direct" else f"{TP} batches"
            print(
                f"  {mode:<6} ({per_req:>9} per request): {n / cpu:>9,.0f} records/s per core of server CPU "
                f"({n / w:,.0f}/s wall, server {100 * cpu / w:.0f}% of its core)"
            )
        finally:
            srv.stop()


def latency(db: str | None, cpus: tuple[int | None, int | None], streams: int, seconds: int) -> None:
    _reset_db(db)
    data = rounds("lat", streams, seconds + 1)
    srv = start_server(db, cpus[0])
    try:
        per_stream = [[data[r][s] for r in range(1, seconds + 1)] for s in range(streams)]
        c0 = srv.cpu_s()
        lat = np.array(run(open_loop(srv.port, data[0], per_stream))) * 1000
        cpu, wall = srv.cpu_s() - c0, seconds + 3.0
        p50, p99, mx = np.percentile(lat, 50), np.percentile(lat, 99), lat.max()
        print(
            f"  {streams:,} streams x 1 batch/s for {seconds} s ({len(lat):,} batches, {100 * streams:,} records/s): "
            f"p50 {p50:.1f} ms  p99 {p99:.1f} ms  max {mx:.1f} ms; server CPU {100 * cpu / wall:.0f}% of its core"
        )
    finally:
        srv.stop()


def growth(db: str | None, cpus: tuple[int | None, int | None], sizes: list[int], n_rounds: int = 3) -> None:
    cols = ("ranks", "us/record", "records/s/core", "background CPU", "RSS MB", "MB/1k ranks", "marginal")
    print("  " + " ".join(f"{c:>{w}}" for c, w in zip(cols, (7, 10, 15, 15, 8, 12, 9), strict=True)))
    prev: tuple[int, float] | None = None
    points: list[tuple[int, float]] = []
    for ranks in sizes:
        _reset_db(db)
        data = rounds("grow", ranks, n_rounds)
        srv = start_server(db, cpus[0])
        try:
            time.sleep(1.0)
            idle = srv.rss_mb()
            run(closed_loop(srv.port, data[0], 64))
            c0 = srv.cpu_s()
            for batch in data[1:]:
                run(closed_loop(srv.port, batch, 64))
            cpu = srv.cpu_s() - c0
            n = 100 * ranks * (n_rounds - 1)
            b0 = srv.cpu_s()
            time.sleep(5.0)  # persist passes (every 2 s), lease renewal, analysis passes
            bg = (srv.cpu_s() - b0) / 5.0
            grown = srv.rss_mb() - idle
            marginal = "" if prev is None else f"{(grown - prev[1]) / ((ranks - prev[0]) / 1000):.1f}"
            prev = (ranks, grown)
            points.append((ranks, grown))
            print(
                f"  {ranks:>7,} {1e6 * cpu / n:>10.2f} {n / cpu:>15,.0f} {100 * bg:>14.0f}% {idle + grown:>8.0f} "
                f"{grown / (ranks / 1000):>12.1f} {marginal:>9}"
            )
        finally:
            srv.stop()
    if len(points) > 2:
        x, y = np.array(points, dtype=float).T
        slope = np.polyfit(x / 1000, y, 1)[0]
        print(
            f"  memory: {points[0][1]:.0f} MB for the first {points[0][0]:,} ranks (the per-job raw-record ring, "
            f"bounded, included), {slope:.1f} MB per further 1,000 ranks (least-squares slope)"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", help="database URL for the server (default: SQLite in a temp dir); it is emptied")
    ap.add_argument("--max-ranks", type=int, default=20_000, help="largest job in the growth series (20000)")
    ap.add_argument("--sizes", help="job sizes of the growth series, comma-separated (default 1000 up to --max-ranks)")
    ap.add_argument("--latency-s", type=int, default=20, help="seconds of the 1,000-stream latency run (20)")
    ap.add_argument("--streams", type=int, default=1000, help="rank streams in the latency run (1000)")
    ap.add_argument("--only", choices=("throughput", "latency", "growth"), help="run one measurement")
    ap.add_argument("--no-pin", action="store_true", help="leave the server and the load generator unpinned")
    ap.add_argument(
        "--nice",
        type=int,
        default=0,
        help="run the server at this niceness (e.g. -10, as root) so other work on a shared machine does not "
        "preempt it, as it would not on a collector host of its own",
    )
    args = ap.parse_args()
    global NICE
    NICE = args.nice
    cpus = sorted(os.sched_getaffinity(0))
    pins: tuple[int | None, int | None] = (cpus[-1], cpus[0]) if len(cpus) > 1 and not args.no_pin else (None, None)
    if pins[1] is not None:
        os.sched_setaffinity(0, {pins[1]})
    where = f"server pinned to CPU {pins[0]}, load generator to CPU {pins[1]}" if pins[0] is not None else "unpinned"
    where += f", server niceness {NICE}" if NICE else ""
    db = "SQLite" if not args.db else "PostgreSQL at " + args.db.rsplit("@", 1)[-1]  # never print a password
    print(f"rankwatch ingest benchmark, raw mode, 100 records per rank per second ({where}; {db})")
    if args.only in (None, "throughput"):
        print("throughput (1,000 ranks, closed loop):")
        throughput(args.db, pins)
    if args.only in (None, "latency"):
        print("latency:")
        latency(args.db, pins, args.streams, args.latency_s)
    if args.only in (None, "growth"):
        print("growth (one job, 3 rounds of one batch per rank; memory counted from the idle server):")
        sizes = [s for s in (1000, 2000, 5000, 10_000, 20_000, 50_000, 100_000) if s <= args.max_ranks]
        if args.sizes:
            sizes = [int(v) for v in args.sizes.split(",")]
        growth(args.db, pins, sizes)


if __name__ == "__main__":
    main()
