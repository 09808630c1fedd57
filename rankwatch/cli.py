"""The ``rankwatch`` command: run the service, watch a demo job, print the version.

The service and torch are imported only by the subcommands that need them, so ``rankwatch
--help`` and ``rankwatch version`` are instant.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from rankwatch import __version__

__all__ = ["main"]

EPILOG = """\
quick start:
  rankwatch serve                      # service on http://127.0.0.1:7433, SQLite in ~/.rankwatch
  RANKWATCH=http://127.0.0.1:7433 torchrun --nproc-per-node 8 train.py   # no change to train.py
  curl http://127.0.0.1:7433/jobs      # what the service sees

  rankwatch demo                       # all of the above on this machine, with one rank made slow
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="rankwatch",
        description="Find the rank, node or link that is slowing or hanging a distributed PyTorch job.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    serve = sub.add_parser(
        "serve",
        help="run the service (collector, detector, REST API)",
        description="Run the rankwatch service. Every flag can also be set by its RANKWATCH_* environment "
        "variable (e.g. --port / RANKWATCH_PORT); a flag beats the variable.",
    )
    _serve_flags(serve)

    demo = sub.add_parser(
        "demo",
        help="start the service and a small local torchrun job with one slow rank, and show what it sees",
        description="Start the service on SQLite, launch a small torchrun job over gloo on this machine "
        "with one rank made slow (RANKWATCH_INJECT), and print what the service sees of it.",
    )
    demo.add_argument("--ranks", type=int, default=4, help="ranks in the job (default 4)")
    demo.add_argument("--steps", type=int, default=150, help="training steps (default 150)")
    demo.add_argument("--slow-rank", type=int, default=2, help="the rank made slow (default 2; -1 for none)")
    demo.add_argument("--delay", type=float, default=0.05, help="seconds added before each collective (0.05)")
    demo.add_argument("--after", type=float, default=3.0, help="seconds into the job the slowdown starts (3)")
    demo.add_argument("--port", type=int, default=0, help="service port (default: a free one)")
    demo.add_argument("--data-dir", type=Path, default=None, help="where the demo's SQLite goes (default: temp)")
    demo.add_argument("--json", action="store_true", help="print the final job and suspects as JSON")

    agent = sub.add_parser(
        "agent",
        help="run a per-node agent that merges the batches of this host's ranks into one connection",
        description="Run a per-node agent: point the ranks of this host at it (RANKWATCH=http://127.0.0.1:7434) "
        "and it forwards their batches to the collector together, one request for many ranks, and hands each "
        "rank its own reply.",
    )
    agent.add_argument(
        "--upstream",
        help="the collector's URL, http(s)://[TOKEN@]host:port (default: $RANKWATCH_AGENT_UPSTREAM, else http://127.0.0.1:7433)",
    )
    agent.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    agent.add_argument("--port", type=int, default=None, help="port (default 7434)")
    agent.add_argument(
        "--linger-ms", type=float, default=1000.0, help="longest a batch waits for the ranks expected (1000)"
    )
    agent.add_argument("--max-batches", type=int, default=256, help="most batches in one request (256)")
    agent.add_argument(
        "--no-merge",
        action="store_true",
        help="frame block bodies side by side instead of merging them into one body per job",
    )
    agent.add_argument("--log-level", default="info", help="debug, info, warning, error (default info)")

    sim = sub.add_parser(
        "simulate",
        help="simulate a labelled job (with faults) and run it through the detector, or record or replay it",
        description="Simulate a job laid out as tensor x pipeline x data parallel groups on nodes, with faults "
        "injected, exactly as its ranks' hooks would send it. By default the batches go through the detector "
        "here and its findings are printed against what was injected; --out records them; --send replays them "
        "to a running service in real time.",
        epilog="Fault: comma-separated key=value, e.g. kind=slow_compute,where=rank,ranks=5,factor=1.5,onset=20 or "
        "kind=slow_comm,where=link,nodes=0+1,factor=3. kind: slow_compute, slow_comm, hang_compute, hang_comm, stop, "
        "crash; where: rank, node, nic, rnic, link, nvl; ranks/nodes: '+'-separated; also duration=, flap=ON+OFF, "
        "silent=1, kill_after=.",
    )
    sim.add_argument("--tp", type=int, default=4, help="tensor-parallel degree (4)")
    sim.add_argument("--pp", type=int, default=1, help="pipeline stages (1)")
    sim.add_argument("--dp", type=int, default=4, help="data-parallel degree (4)")
    sim.add_argument("--gpus-per-node", type=int, default=8, help="ranks per node (8)")
    sim.add_argument("--rate", type=float, default=100.0, help="collectives per rank per second (100)")
    sim.add_argument(
        "--profile",
        default="everything",
        help="jitter profile: quiet, cpu_noise, gc, first_step, checkpoint, data, everything (default: everything)",
    )
    sim.add_argument("--duration", type=float, default=60.0, help="simulated seconds (60)")
    sim.add_argument("--seed", type=int, default=0, help="random seed (0)")
    sim.add_argument("--fault", action="append", default=[], help="a fault to inject (repeatable; see below)")
    sim.add_argument("--out", type=Path, help="write the batches to this recording instead of detecting")
    sim.add_argument("--send", metavar="URL", help="replay the batches to this service in real time")
    sim.add_argument("--json", action="store_true", help="print the findings as JSON")

    ev = sub.add_parser(
        "evaluate",
        help="run the detector's labelled evaluation suite and print precision, recall and latency per class",
        description="Run the evaluation suite (rankwatch.sim.suite) through the real detector. 'tune' is what the "
        "thresholds were tuned on; 'heldout' uses layouts, jitter profiles, rates and seeds never used in tuning; "
        "'fresh' has heldout's parameters and new seeds; 'unseen' and then 'sealed' have seeds, layouts, rates and "
        "jitter profiles of their own ('sealed' is run only for the final tables).",
    )
    ev.add_argument(
        "--split",
        default="smoke",
        choices=("smoke", "tune", "heldout", "fresh", "unseen", "sealed"),
        help="which suite (smoke)",
    )
    ev.add_argument("--workers", type=int, default=1, help="processes to run scenarios in (1)")
    ev.add_argument("--only", help="only scenarios whose name contains this")
    ev.add_argument("--misses", action="store_true", help="list scenarios with a miss or a false suspect")

    sub.add_parser("version", help="print the version")

    args = parser.parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    if args.command == "agent":
        return _agent(args)
    if args.command == "demo":
        return _demo(args)
    if args.command == "simulate":
        return _simulate(args)
    if args.command == "evaluate":
        return _evaluate(args)
    if args.command == "version":
        print(f"rankwatch {__version__}")
        return 0
    parser.print_help()
    return 0


# -- serve ----------------------------------------------------------------------------------------
def _serve_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", help="address to bind (default 127.0.0.1; anything else needs tokens)")
    p.add_argument("--port", type=int, help="port (default 7433)")
    p.add_argument("--data-dir", type=Path, help="data directory (default ~/.rankwatch)")
    p.add_argument("--db", help="database URL: sqlite:///path or postgresql://user@host/db (default: SQLite)")
    p.add_argument("--ingest-tokens", help="comma-separated tokens ranks send batches with")
    p.add_argument("--read-tokens", help="comma-separated tokens for reading")
    p.add_argument("--admin-tokens", help="comma-separated tokens for changes (may also read)")
    p.add_argument("--tokens-file", type=Path, help="file of '<scope> <token> [job=<id>]' lines, re-read on change")
    p.add_argument("--certfile", type=Path, help="TLS certificate (PEM); with --keyfile, serve HTTPS")
    p.add_argument("--keyfile", type=Path, help="TLS private key (PEM)")
    p.add_argument("--webhook-allow", help="comma-separated hosts/CIDRs webhooks may reach despite the SSRF guard")
    p.add_argument("--public-url", help="this service's URL as people reach it, for links in pages")
    p.add_argument("--log-level", help="debug, info, warning, error (default info)")
    p.add_argument("--advertise-url", help="URL other rankwatch processes reach this one at (several processes)")


def _settings_from(args: argparse.Namespace) -> Any:
    from rankwatch.collector.settings import Settings

    keys = (
        "host",
        "port",
        "data_dir",
        "db",
        "ingest_tokens",
        "read_tokens",
        "admin_tokens",
        "tokens_file",
        "certfile",
        "keyfile",
        "webhook_allow",
        "public_url",
        "log_level",
        "advertise_url",
    )
    overrides = {k: getattr(args, k) for k in keys if getattr(args, k, None) is not None}
    for k in ("ingest_tokens", "read_tokens", "admin_tokens", "webhook_allow"):
        if k in overrides:
            overrides[k] = [t.strip() for t in overrides[k].split(",") if t.strip()]
    return Settings(**overrides)


def _serve(args: argparse.Namespace) -> int:
    import logging

    import uvicorn

    from rankwatch.api.app import create_app
    from rankwatch.collector.settings import is_loopback

    settings = _settings_from(args)
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per forwarded batch otherwise
    if not is_loopback(settings.host) and not settings.tokens_configured:
        print(
            f"rankwatch: refusing to bind {settings.host}: with no tokens configured every route is open, so the "
            "service only binds to loopback. Set RANKWATCH_INGEST_TOKENS, RANKWATCH_READ_TOKENS and "
            "RANKWATCH_ADMIN_TOKENS (or --tokens-file) first.",
            file=sys.stderr,
        )
        return 2
    if bool(settings.certfile) != bool(settings.keyfile):
        print("rankwatch: --certfile and --keyfile go together", file=sys.stderr)
        return 2
    app = create_app(settings)
    sys.setswitchinterval(0.001)  # the event loop gets the GIL back within 1 ms of a background pass
    import gc

    gc.freeze()  # the modules' objects never die: full collections need not walk them again and again
    scheme = "https" if settings.certfile else "http"
    print(f"rankwatch {__version__} serving on {scheme}://{settings.host}:{settings.port} ({_db_label(settings)})")
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
        ssl_certfile=str(settings.certfile) if settings.certfile else None,
        ssl_keyfile=str(settings.keyfile) if settings.keyfile else None,
        access_log=False,
    )
    return 0


def _agent(args: argparse.Namespace) -> int:
    import logging

    import uvicorn

    from rankwatch.collector.agent import DEFAULT_AGENT_PORT, UPSTREAM_ENV, Agent, agent_app
    from rankwatch.collector.settings import is_loopback
    from rankwatch.env import DEFAULT_URL, parse_collector_url
    from rankwatch.errors import ConfigError

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request to the collector otherwise
    try:
        upstream = parse_collector_url(args.upstream or os.environ.get(UPSTREAM_ENV) or DEFAULT_URL)
    except ConfigError as exc:
        print(f"rankwatch agent: {exc}", file=sys.stderr)
        return 2
    if upstream is None:
        print("rankwatch agent: --upstream must be the collector's URL", file=sys.stderr)
        return 2
    if not is_loopback(args.host):
        print(
            "rankwatch agent: binding a non-loopback address relays anyone's batches; ranks reach the agent "
            "over loopback",
            file=sys.stderr,
        )
    port = DEFAULT_AGENT_PORT if args.port is None else args.port
    agent = Agent(upstream, linger_s=args.linger_ms / 1000.0, max_batches=args.max_batches, merge=not args.no_merge)
    print(f"rankwatch agent {__version__} on http://{args.host}:{port}, forwarding to {upstream.base}")
    uvicorn.run(agent_app(agent), host=args.host, port=port, log_level=args.log_level.lower(), access_log=False)
    return 0


def _db_label(settings: Any) -> str:
    url = settings.database_url
    if url.startswith("sqlite"):
        return f"SQLite at {url.split('///', 1)[-1]}"
    return url.split("@")[-1] if "@" in url else url.split("://")[0]


# -- demo -----------------------------------------------------------------------------------------
class _BackgroundServer:
    """The service in a thread of this process, on a free port."""

    def __init__(self, settings: Any) -> None:
        import uvicorn

        from rankwatch.api.app import create_app

        self.app = create_app(settings)
        config = uvicorn.Config(self.app, host="127.0.0.1", port=settings.port, log_level="warning", access_log=False)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the service did not start")
            time.sleep(0.05)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)


def _demo(args: argparse.Namespace) -> int:
    import subprocess

    try:
        import torch  # noqa: F401
    except ImportError:
        print("rankwatch demo needs torch: pip install 'rankwatch[torch]'", file=sys.stderr)
        return 2
    from rankwatch.collector.settings import Settings

    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="rankwatch-demo-"))
    settings = Settings(data_dir=data_dir, port=args.port, host="127.0.0.1")
    server = _BackgroundServer(settings)
    url = server.start()
    collector = server.app.state.collector
    job_id = f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    env = dict(os.environ)
    env.update(
        RANKWATCH=url,
        RANKWATCH_JOB=job_id,
        RANKWATCH_CONTROL="1",
        OMP_NUM_THREADS="1",
    )
    env.pop("RANKWATCH_INJECT", None)
    slow = ""
    if args.slow_rank >= 0:
        env["RANKWATCH_INJECT"] = f"slow:rank={args.slow_rank},delay={args.delay},after={args.after}"
        slow = f"; rank {args.slow_rank} made slow by {args.delay * 1000:.0f} ms per collective from t={args.after:g}s"
    print(f"rankwatch demo: service on {url} (SQLite in {data_dir})")
    print(f"rankwatch demo: job {job_id}: torchrun, {args.ranks} ranks over gloo, {args.steps} steps{slow}")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={args.ranks}",
        "-m",
        "rankwatch.hooks.demo_train",
        "--steps",
        str(args.steps),
    ]
    workdir = tempfile.mkdtemp(prefix="rankwatch-demo-run-")
    proc = subprocess.Popen(cmd, env=env, cwd=workdir)
    t0 = time.monotonic()
    shown: set[str] = set()
    try:
        while proc.poll() is None:
            time.sleep(1.0)
            _demo_status(collector, job_id, time.monotonic() - t0, shown)
        time.sleep(1.5)  # the ranks' last batches
        _demo_status(collector, job_id, time.monotonic() - t0, shown)
    except KeyboardInterrupt:
        proc.terminate()
    finally:
        rc = proc.wait()
        collector.tick()
        job = collector.get_job(job_id)
        suspects = _suspects(collector, job_id)
        server.stop()
    _demo_report(job, suspects, args.json)
    print(f"rankwatch demo: torchrun exited with {rc}; the service's database is in {data_dir}")
    return 0 if rc == 0 else 1


def _suspects(collector: Any, job_id: str) -> list[dict[str, Any]]:
    return list(reversed(collector.suspects.list(job_id=job_id)))


def _demo_status(collector: Any, job_id: str, elapsed: float, shown: set[str]) -> None:
    job = collector.get_job(job_id)
    if job is None:
        print(f"  t={elapsed:4.0f}s  waiting for the first batch...")
        return
    live = sum(1 for r in job["ranks"] if r["state"] == "running")
    ops, groups = job["ops"], len(job["groups"])
    print(f"  t={elapsed:4.0f}s  ranks reporting {live}/{job['world']}  ops recorded {ops:,}  groups {groups}")
    for s in _suspects(collector, job_id):
        sid = str(s.get("id"))
        if sid in shown or s.get("status") != "active":
            continue
        shown.add(sid)
        print(f"  >>> SUSPECT {_suspect_line(s)}")


def _suspect_line(s: dict[str, Any]) -> str:
    level = s.get("level")
    if level == "link" and s.get("link"):
        where = "link " + "-".join(s["link"])
    elif level == "node":
        where = "node " + ",".join(s.get("nodes") or []) + f" (ranks {s.get('ranks')})"
    else:
        where = f"rank {','.join(str(r) for r in s.get('ranks') or [])} on {','.join(s.get('nodes') or [])}"
    slow = s.get("slowdown")
    how = f"job {slow:.2f}x slower" if isinstance(slow, (int, float)) else "job stopped"
    return f"{s.get('kind')} at {where}: {how} (score {s.get('score', 0):.2f})"


def _demo_report(job: dict[str, Any] | None, suspects: list[dict[str, Any]], as_json: bool) -> None:
    if job is None:
        print("rankwatch demo: the service never heard from the job")
        return
    if as_json:
        print(json.dumps({"job": job, "suspects": suspects}, indent=2, default=str))
        return
    print()
    print(f"job {job['id']}: {job['world']} ranks on {job['nodes']} node(s), {job['ops']:,} ops, state {job['state']}")
    print(f"  {'rank':>4}  {'node':<16} {'pid':>7}  {'state':<9} {'ops':>7} {'drops':>5}")
    for r in job["ranks"]:
        print(f"  {r['rank']:>4}  {r['node']:<16} {r['pid'] or '-':>7}  {r['state']:<9} {r['ops']:>7} {r['drops']:>5}")
    for g in job["groups"]:
        counts = ", ".join(f"{k} {v}" for k, v in g["op_counts"].items())
        print(f"  group {g['id']} ranks {g['ranks']}: last seq {g['last_seq']}; {counts}")
    from rankwatch.api.payloads import next_step

    if not suspects:
        print("suspects: none")
    for s in suspects:
        print(f"suspect #{s.get('id')} [{s.get('status')}] {_suspect_line(s)}")
        if step := next_step(s):
            print(f"  next step: {step}")
        print("  evidence: " + json.dumps(s.get("evidence"), default=str)[:800])


if __name__ == "__main__":
    sys.exit(main())


# -- simulate / evaluate --------------------------------------------------------------------------
def _parse_fault(spec: str) -> Any:
    from rankwatch.sim import Fault

    kw: dict[str, Any] = {}
    for part in spec.split(","):
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or not key:
            raise SystemExit(f"rankwatch simulate: --fault {spec!r}: expected key=value pairs, got {part!r}")
        if key in ("ranks", "nodes"):
            kw[key] = tuple(int(x) for x in value.split("+") if x)
        elif key == "flap":
            on, _, off = value.partition("+")
            kw[key] = (float(on), float(off))
        elif key in ("factor", "onset", "duration", "kill_after"):
            kw[key] = float(value)
        elif key == "silent":
            kw[key] = value.lower() in ("1", "true", "yes")
        elif key in ("kind", "where"):
            kw[key] = value
        else:
            raise SystemExit(f"rankwatch simulate: --fault {spec!r}: unknown key {key!r}")
    try:
        return Fault(**kw)
    except (TypeError, ValueError) as e:
        raise SystemExit(f"rankwatch simulate: --fault {spec!r}: {e}") from None


def _simulate(args: argparse.Namespace) -> int:
    from rankwatch.sim import PROFILES, Layout, Scenario, Workload

    if args.profile not in PROFILES:
        raise SystemExit(f"rankwatch simulate: unknown profile {args.profile!r}; one of {', '.join(PROFILES)}")
    lay = Layout(tp=args.tp, pp=args.pp, dp=args.dp, gpus_per_node=args.gpus_per_node)
    faults = tuple(_parse_fault(f) for f in args.fault)
    sc = Scenario(
        name="cli",
        layout=lay,
        workload=Workload.for_rate(args.rate, lay),
        profile=PROFILES[args.profile],
        faults=faults,
        duration=args.duration,
        seed=args.seed,
    )
    if args.out is not None:
        from rankwatch.sim.record import simulate

        summary = simulate(sc, args.out)
        print(
            f"wrote {summary.batches} batches ({summary.records} op records, {summary.bytes} bytes) "
            f"of {summary.ranks} ranks over {summary.duration:g} s to {summary.path}"
        )
        return 0
    if args.send:
        return _replay(sc, args.send)
    from rankwatch.detector.evaluate import run_scenario

    res = run_scenario(sc, keep_findings=True)
    if args.json:
        print(json.dumps(dataclasses.asdict(res), indent=2, default=str))
        return 0
    print(
        f"{lay.world} ranks on {lay.n_nodes} nodes, {res.coll_per_s:.0f} collectives/s per rank, "
        f"{sc.duration:g} s simulated in {res.cpu_s:.1f} s of CPU"
    )
    for i, e in enumerate(res.expected):
        lat = res.latency[i]
        got = "MISSED" if lat is None else f"found after {lat:.1f} s"
        where = e.link or e.nodes if e.level != "rank" else e.ranks
        print(f"  injected {e.kind} at {e.level} {where}: {got}")
    for r in res.reported:
        tag = "right" if r.match >= 0 else "FALSE"
        link = "" if r.link is None else f" link={r.link[0]}-{r.link[1]}"
        print(
            f"  reported [{tag}] {r.kind} {r.level} ranks={r.ranks[:16]} nodes={r.nodes[:8]}{link} at {r.first:.1f} s"
        )
    if not res.reported:
        print("  reported: nothing")
    ok = all(x is not None for x in res.latency) and not res.false_suspects
    return 0 if ok else 1


def _replay(sc: Any, url: str) -> int:
    """Send a scenario's batches to a service as its ranks would, in real time."""
    import urllib.error
    import urllib.request

    from rankwatch.env import parse_collector_url
    from rankwatch.sim import deliveries
    from rankwatch.wire import CONTENT_TYPE, encode_batch

    target = parse_collector_url(url)
    if target is None:
        raise SystemExit("rankwatch simulate: --send needs a service URL, e.g. http://127.0.0.1:7433")
    headers = {"Content-Type": CONTENT_TYPE}
    if target.token:
        headers["Authorization"] = f"Bearer {target.token}"
    t0 = time.monotonic()
    sent = failed = 0
    for d in deliveries(sc):
        wait = d.received_at - (time.monotonic() - t0)
        if wait > 0:
            time.sleep(wait)
        body = encode_batch(d.batch.header, d.batch.records)
        req = urllib.request.Request(target.base + "/ingest", data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                resp.read()
            sent += 1
        except (urllib.error.URLError, OSError) as e:
            failed += 1
            if failed <= 3:
                print(f"rankwatch simulate: a batch was refused: {e}", file=sys.stderr)
    print(f"sent {sent} batches of job {sc.job} ({failed} refused)")
    return 0 if failed == 0 else 1


def _evaluate(args: argparse.Namespace) -> int:
    from rankwatch.detector.evaluate import evaluate_suite

    rep = evaluate_suite(args.split, workers=args.workers, only=args.only)
    print(rep.table())
    if args.misses:
        print(rep.misses())
    return 0
