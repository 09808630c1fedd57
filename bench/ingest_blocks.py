"""Ingest in block mode, next to raw mode: a real ``rankwatch serve`` on loopback.

The load is a simulated hybrid-parallel job (``rankwatch.sim``: tensor parallel 8 per node,
pipeline 8, data parallel the rest) at 100 collectives per rank per second, its ranks summarising
their ops into sequence-aligned blocks of at most 64 sequence numbers (``rankwatch.sim.stream``,
a block spanning about ``--block-s``), encoded with ``rankwatch.blockwire`` and POSTed to
``/ingest``. Every body goes through the whole service path: decode and checks, membership,
the job's ranks, groups and summaries, ``detector.observe_blocks``, and the analysis loop
(``evaluate``) and persist loop in the background. The server is pinned to one CPU, the load
generator to another; "per core" is op records (what the blocks stand for) per second of the
server process's CPU time, all its threads, read from /proc.

  block, aggregated   one body per 1,024 ranks per second (a rack-level aggregator's batch)
  block, per rank     one body per rank per second, as each rank's shipper sends it
  block, agent        eight ranks' bodies per request in a multi-batch, as ``rankwatch agent``
                      sent them before it merged (``--no-merge`` still does)
  block, agent merged K ranks' own bodies merged into one body, as ``rankwatch agent`` sends them
                      now: K = 8 (one agent per node of 8 ranks), 64 and 512 (a rack-level agent
                      that ranks of many nodes point at; raise its ``--max-batches`` to match)
  raw                 ``bench/ingest.py``'s throughput run (the same server, raw records)

The merged rows send the exact bytes the agent sends, not a live agent process: each second's
per-rank bodies are cut into runs of K ranks and packed by ``rankwatch.blockmerge.pack``, the
function the agent calls at each flush (a live agent would add its linger, not change the bytes or
the server's work). Their requests carry one merged body each, as the agent sends one job's
bodies under one token. "agent CPU" is what that packing cost here, per rank body (decode, checks,
merge and re-encode): the agent's side, spread over the nodes, not the server's.

Measured on the 2-core development machine (server pinned to one core, shared with other sessions;
closed loop, 15 s of training after 5 s), op records per second of server-process CPU. The same
load swings these figures by a fifth from run to run and more from hour to hour, so before/after
pairs were run back to back. Since the detector folds held batches together at its analysis pass
(not one small batch at a time), merged 8 ranks (one agent per node) went 0.83M -> 1.16M, per rank
145k -> 257k, aggregated 1,024 ranks 7.3M -> 9.5M; in process 1.52M -> 1.95M. Three runs since (the
last two on the final code) gave merged 8 at 1.16M, 0.97M and 0.97M: about the 1,000,000 records/s per core target
through the whole server (HTTP, background loops), 1.7-1.9M through decode, checks, bookkeeping
and the detector's update alone. A merged 8-rank body (~840 records) costs ~0.85 ms: the ingest
path ~60% (decode and checks half of it), uvicorn and the ASGI glue ~20%, background loops the rest.
Merged 64 ranks: 2.9M. The README's "Ingest performance in block mode" has one run's full output.

    python bench/ingest_blocks.py [--seconds 20] [--merge 8,64,512] [--growth 1024,8192,98304] [--no-raw]
                                  [--no-per-rank]

``--agent-linger 200,1000`` measures instead what a live ``rankwatch agent`` merges: 8 shipper
threads (one node's ranks) post their own block bodies through a real agent, started with each
``--linger-ms``, to a real server, each one ``--flush-s`` after its previous answer as the hooks'
shipper does, starting at random phases; it prints ranks per request and how much longer a batch
took through the agent than straight to the server (the agent's wait).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ingest import BIN, closed_loop, run, start_server, throughput

from rankwatch.blockmerge import pack
from rankwatch.blockwire import BLOCK_CONTENT_TYPE, encode_blocks
from rankwatch.multibatch import MULTI_CONTENT_TYPE, encode_multi
from rankwatch.sim import PROFILES, Layout, Scenario, Workload
from rankwatch.sim.blocks import BlockBatch
from rankwatch.sim.layout import node_name
from rankwatch.sim.stream import stream_blocks

RATE = 100.0


def layout_for(ranks: int) -> Layout:
    """tp=8 per node, 8 pipeline stages (2 below 512 ranks), data parallel the rest."""
    pp = 8 if ranks >= 512 else 2
    return Layout(tp=8, pp=pp, dp=max(1, ranks // (8 * pp)))


def _per_rank(bb: BlockBatch) -> list[BlockBatch]:
    """Split an aggregator's batch into what each rank's shipper sends (its own groups only)."""
    out = []
    tables = {}
    for name in ("progress", "p2p", "blocks"):
        rows = getattr(bb, name)
        rows = rows[np.argsort(rows["rank"], kind="stable")]
        bounds = np.searchsorted(rows["rank"], np.r_[bb.ranks["rank"], np.iinfo(np.int32).max])
        tables[name] = (rows, bounds)
    remap = np.full(len(bb.groups), -1, np.int64)
    for i in range(bb.ranks.shape[0]):
        parts = {name: rows[bounds[i] : bounds[i + 1]].copy() for name, (rows, bounds) in tables.items()}
        used = np.unique(parts["progress"]["group"])
        remap[used] = np.arange(used.shape[0])
        for rows in parts.values():
            rows["group"] = remap[rows["group"].astype(np.int64)]
        out.append(
            BlockBatch(
                groups=[bb.groups[g] for g in used.tolist()],
                ranks=bb.ranks[i : i + 1],
                progress=parts["progress"],
                p2p=parts["p2p"],
                blocks=parts["blocks"],
                nodes={},
            )
        )
    return out


def workload(ranks: int, seconds: float, block_s: float, per_rank: bool) -> tuple[int, list[list[bytes]], list[int]]:
    """Bodies per simulated second, and the op records each second's bodies stand for."""
    lay = layout_for(ranks)
    sc = Scenario(
        "bench",
        layout=lay,
        workload=Workload.for_rate(RATE, lay),
        profile=PROFILES["quiet"],
        duration=seconds,
        seed=7,
    )
    gpn = lay.gpus_per_node
    rounds: list[list[bytes]] = []
    records: list[int] = []
    second = -1
    for d in stream_blocks(sc, agent_ranks=1024, block_s=block_s):
        k = int(d.received_at)
        if k != second:
            rounds.append([])
            records.append(0)
            second = k
        bb = d.batch
        records[-1] += int(bb.blocks["count"].sum())
        pieces = _per_rank(bb) if per_rank else [bb]
        for piece in pieces:
            infos = [
                {"rank": r, "node": node_name(r // gpn), "incarnation": f"0-{r}-bench", "batch": k, "pid": 10_000 + r}
                for r in piece.ranks["rank"].tolist()
            ]
            rounds[-1].append(encode_blocks("blocks", lay.world, piece, infos))
    return lay.world, rounds, records


def merged(rounds: list[list[bytes]], ranks: int) -> tuple[list[list[bytes]], float]:
    """Each second's per-rank bodies as ``rankwatch agent`` sends them: runs of ``ranks`` rank
    bodies packed into one merged body each; and the packing's CPU per rank body (seconds)."""
    out: list[list[bytes]] = []
    t0 = time.process_time()
    for r in rounds:
        out.append([])
        for i in range(0, len(r), ranks):
            items = pack(r[i : i + ranks], max_ranks=ranks)
            if len(items) != 1 or not items[0].merged:
                raise RuntimeError(f"{ranks} rank bodies did not pack into one merged body")
            out[-1].append(items[0].body)
    return out, (time.process_time() - t0) / max(1, sum(len(r) for r in rounds))


def in_process(rounds: list[list[bytes]], records: list[int], warm: int) -> float:
    """Records per second of CPU through ``Collector.ingest`` alone (decode, checks, the job's
    bookkeeping, ``detector.observe_blocks``), in this process: no HTTP, no background loops."""
    from rankwatch.collector.db import open_database
    from rankwatch.collector.service import Collector
    from rankwatch.collector.settings import Settings
    from rankwatch.detector import DetectorConfig, JobDetector

    with tempfile.TemporaryDirectory(prefix="rankwatch-bench-") as tmp:
        settings = Settings(data_dir=Path(tmp))
        db = open_database(settings.database_url)
        collector = Collector(settings, db, detector_factory=lambda _job: JobDetector(DetectorConfig()))
        for r in rounds[:warm]:
            for body in r:
                collector.ingest(body)
        t0 = time.process_time()
        for r in rounds[warm:]:
            for i, body in enumerate(r):
                collector.ingest(body)
                if i in (len(r) // 2, len(r) - 1):  # the analysis loop folds what came, twice a second
                    for job in collector.jobs.values():
                        job.detector.ready(0.0)
        cpu = time.process_time() - t0
        db.close()
    return sum(records[warm:]) / cpu


def measure(
    label: str,
    cpu_pin: int | None,
    rounds: list[list[bytes]],
    records: list[int],
    warm: int,
    multi: int = 0,
    paced: bool = False,
) -> float:
    """Send every round; server CPU per record over the rounds after ``warm``.

    Closed loop sends each round as fast as the server takes it; ``paced`` sends one round (one
    second of training) per second, as the job would, so the background loops (persist every
    2 s, analysis every 0.5 s) run as often per second of training as they would live.
    """
    srv = start_server(None, cpu_pin)
    try:
        ctype = BLOCK_CONTENT_TYPE
        if multi:
            rounds = [[encode_multi(r[i : i + multi]) for i in range(0, len(r), multi)] for r in rounds]
            ctype = MULTI_CONTENT_TYPE
        conns = 16 if len(rounds[0]) > 16 else max(1, len(rounds[0]))
        for r in rounds[:warm]:
            run(closed_loop(srv.port, r, conns, ctype))
        time.sleep(1.0)  # the first write of the new ranks and groups is behind us
        c0, w, late = srv.cpu_s(), 0.0, 0
        t_next = time.perf_counter()
        for r in rounds[warm:]:
            w += float(run(closed_loop(srv.port, r, conns, ctype)))  # type: ignore[arg-type]
            if paced:
                t_next += 1.0
                wait = t_next - time.perf_counter()
                late += wait < 0
                time.sleep(max(0.0, wait))
        if paced:
            w = time.perf_counter() - t_next + len(rounds[warm:])
        cpu = srv.cpu_s() - c0
        job = httpx.get(f"http://127.0.0.1:{srv.port}/jobs/blocks", timeout=30).json()
        if job["ops"] != sum(records):
            raise RuntimeError(f"the server counted {job['ops']} op records of the {sum(records)} sent")
        n = sum(records[warm:])
        bodies = sum(len(r) for r in rounds[warm:])
        mb = sum(len(b) for r in rounds[warm:] for b in r) / 1e6
        print(
            f"  {label:<26} {n / cpu:>11,.0f} records/s per core of server CPU  "
            f"({bodies / cpu:,.0f} requests/s; {n / w:,.0f} records/s wall, server {100 * cpu / w:.0f}% of its core; "
            f"{mb / len(rounds[warm:]):.2f} MB per second of training"
            + (f"; {late} of {len(rounds[warm:])} seconds sent late)" if paced else ")"),
            flush=True,
        )
        return n / cpu
    finally:
        srv.stop()


def agent_linger(lingers: list[int], seconds: float, flush_s: float, cpu: int | None, seed: int = 0) -> None:
    """Ranks per request and the added wait per batch through a live agent, 8 ranks at random phases."""
    _, rounds, _ = workload(16, seconds + 2, 0.64, per_rank=True)
    node = [r[:8] for r in rounds]  # the first node's 8 ranks, one body each per second
    headers = {"Content-Type": BLOCK_CONTENT_TYPE}
    server = start_server(None, cpu)
    base = f"http://127.0.0.1:{server.port}"
    try:
        with httpx.Client() as client:  # the same bodies straight to the server: the baseline
            direct = []
            for r in node[:3]:
                for b in r:
                    t0 = time.perf_counter()
                    client.post(base + "/ingest", content=b, headers=headers).raise_for_status()
                    direct.append(time.perf_counter() - t0)
        print(f"  straight to the server: {1000 * float(np.mean(direct)):.1f} ms per batch")
        for linger in lingers:
            port = server.port + 1 + lingers.index(linger)
            cmd = [str(BIN / "rankwatch"), "agent", "--port", str(port), "--upstream", base, "--linger-ms", str(linger)]
            agent = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            url = f"http://127.0.0.1:{port}"
            while True:
                try:
                    httpx.get(url + "/healthz").raise_for_status()
                    break
                except httpx.HTTPError:
                    time.sleep(0.1)
            phases = np.random.default_rng(seed).uniform(0, flush_s, 8).tolist()
            waits: list[float] = []
            end = time.monotonic() + seconds

            def ship(rank: int, url: str, end: float, phase: float, waits: list[float]) -> None:
                time.sleep(phase)
                with httpx.Client(timeout=30) as client:
                    for k in range(len(node)):
                        if time.monotonic() >= end:
                            return
                        t0 = time.perf_counter()
                        client.post(url + "/ingest", content=node[k][rank], headers=headers).raise_for_status()
                        waits.append(time.perf_counter() - t0)
                        time.sleep(flush_s)

            threads = [threading.Thread(target=ship, args=(r, url, end, phases[r], waits)) for r in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            health = httpx.get(url + "/healthz").json()
            agent.terminate()
            agent.wait(timeout=20)
            print(
                f"  agent --linger-ms {linger}: {health['batches'] / health['requests']:.2f} ranks per request "
                f"({health['batches']} batches, {health['requests']} requests, {health['merged']} merged), "
                f"added wait {1000 * (float(np.mean(waits)) - float(np.mean(direct))):.0f} ms per batch on average "
                f"(median {1000 * (float(np.median(waits)) - float(np.mean(direct))):.0f} ms)",
                flush=True,
            )
    finally:
        server.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--seconds", type=int, default=20, help="simulated seconds sent, the first --warm not counted")
    ap.add_argument("--warm", type=int, default=5)
    ap.add_argument("--block-s", type=float, default=0.64, help="about how long a block spans (0.64: 64 ops at 100/s)")
    ap.add_argument("--growth", help="job sizes for the growth series (aggregated bodies), e.g. 1024,8192,98304")
    ap.add_argument("--no-raw", action="store_true", help="skip the raw-mode figures")
    ap.add_argument("--no-per-rank", action="store_true", help="skip the per-rank and agent block figures")
    ap.add_argument("--merge", default="8,64,512", help="ranks per merged body for the merged-agent rows")
    ap.add_argument("--agent-linger", help="only measure a live agent with these --linger-ms, e.g. 200,1000")
    ap.add_argument("--flush-s", type=float, default=1.0, help="the shippers' period in --agent-linger (1.0)")
    args = ap.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    pins: tuple[int | None, int | None] = (cpus[-1], cpus[0]) if len(cpus) > 1 else (None, None)
    if pins[1] is not None:
        os.sched_setaffinity(0, {pins[1]})
    where = f"server pinned to CPU {pins[0]}, load generator to CPU {pins[1]}" if pins[0] is not None else "unpinned"
    if args.agent_linger:
        print(f"a live agent, 8 ranks flushing every {args.flush_s} s at random phases, {args.seconds} s ({where}):")
        agent_linger([int(x) for x in args.agent_linger.split(",")], args.seconds, args.flush_s, pins[0])
        return
    print(
        f"rankwatch ingest benchmark, block mode vs raw, {RATE:.0f} collectives per rank per second, "
        f"blocks of at most 64 sequence numbers ({where}; SQLite)"
    )
    print(
        f"throughput ({args.ranks:,} ranks, {args.seconds - args.warm} s of training after {args.warm} s, closed loop):"
    )
    world, rounds, records = workload(args.ranks, args.seconds, args.block_s, per_rank=False)
    rows = sum(
        int(np.frombuffer(b[24:28], "<u4")[0]) for r in rounds[args.warm :] for b in r
    )  # block rows, from each body's prefix
    print(
        f"  (job of {world:,} ranks: {sum(records[args.warm :]) / (args.seconds - args.warm):,.0f} op records/s "
        f"as {rows / (args.seconds - args.warm):,.0f} block rows/s, "
        f"{sum(records[args.warm :]) / max(rows, 1):.1f} records per row)"
    )
    measure("block, aggregated (1,024)", pins[0], rounds, records, args.warm)
    if not args.no_per_rank:
        _, rounds, records = workload(args.ranks, args.seconds, args.block_s, per_rank=True)
        measure("block, per rank", pins[0], rounds, records, args.warm)
        measure("block, agent (8 per req.)", pins[0], rounds, records, args.warm, multi=8)
        for k in [int(x) for x in args.merge.split(",") if x]:
            packed, cost = merged(rounds, k)
            measure(f"block, agent merged ({k})", pins[0], packed, records, args.warm)
            alone = in_process(packed, records, args.warm)
            print(
                f"    (agent CPU packing them: {cost * 1e6:.0f} us per rank body; Collector.ingest alone, "
                f"in process: {alone:,.0f} records/s per core)",
                flush=True,
            )
    del rounds
    if not args.no_raw:
        print("raw mode, the same server (bench/ingest.py's throughput run, 1,000 ranks):")
        throughput(None, pins)
    if args.growth:
        print("growth (aggregated block bodies, 1,024 ranks each, one second of training per second):")
        for n in [int(x) for x in args.growth.split(",")]:
            t0 = time.perf_counter()
            world, rounds, records = workload(n, args.seconds, args.block_s, per_rank=False)
            gen = time.perf_counter() - t0
            measure(f"{world:,} ranks", pins[0], rounds, records, args.warm, paced=True)
            print(f"    (simulating and encoding it took {gen:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
