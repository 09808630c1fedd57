"""Test support: a real ``rankwatch serve`` process, and real ``torchrun`` jobs pointed at it.

Tests run against the *installed* package (the test command installs it), and every child
process runs in a temporary directory so the repository's ``rankwatch/`` folder never shadows it.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx

TESTS = Path(__file__).parent
SCRIPTS = TESTS / "hooks" / "scripts"
BIN = Path(sys.executable).parent
BENCH = TESTS.parent / "bench"


def load_bench(name: str) -> ModuleType:
    """A script of ``bench/`` (not a package) as a module, for the tests of its functions."""
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def clean_env(**extra: str) -> dict[str, str]:
    """The environment for a child: no inherited rankwatch settings, quiet, one thread."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RANKWATCH") and not k.startswith("TORCHELASTIC")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONWARNINGS="ignore", GLOO_SOCKET_IFNAME="lo")
    env.update(extra)
    return env


@dataclass
class Service:
    """A real ``rankwatch serve`` process on loopback."""

    url: str
    data_dir: Path
    proc: subprocess.Popen[bytes]
    log: Path
    token: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def get(self, path: str, **params: Any) -> Any:
        r = httpx.get(self.url + path, params=params, headers=self.headers, timeout=30)
        r.raise_for_status()
        return r.json()

    def job(self, job_id: str) -> dict[str, Any] | None:
        r = httpx.get(f"{self.url}/jobs/{job_id}", headers=self.headers, timeout=30)
        return r.json() if r.status_code == 200 else None

    def wait_job(self, job_id: str, pred: Any = None, timeout: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        job = None
        while time.monotonic() < deadline:
            job = self.job(job_id)
            if job is not None and (pred is None or pred(job)):
                return job
            time.sleep(0.25)
        raise AssertionError(f"job {job_id} did not reach the expected state in {timeout}s; last seen: {job}")

    def ops(self, job_id: str, **params: Any) -> list[dict[str, Any]]:
        return list(self.get(f"/jobs/{job_id}/ops", limit=100_000, **params))

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_service(
    tmp: Path, *args: str, env: dict[str, str] | None = None, port: int | None = None, url_host: str = "127.0.0.1"
) -> Service:
    port = port or free_port()
    data_dir = tmp / "data"
    log = tmp / f"service-{port}.log"
    cmd = [str(BIN / "rankwatch"), "serve", "--port", str(port), "--data-dir", str(data_dir), *args]
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, cwd=tmp, env=env or clean_env(), stdout=out, stderr=subprocess.STDOUT)
    url = f"http://{url_host}:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"rankwatch serve exited with {proc.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                return Service(url=url, data_dir=data_dir, proc=proc, log=log)
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"rankwatch serve did not come up:\n{log.read_text()}")


@dataclass
class Agent:
    """A real ``rankwatch agent`` process on loopback."""

    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def health(self) -> dict[str, Any]:
        return dict(httpx.get(self.url + "/healthz", timeout=10).json())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_agent(tmp: Path, upstream: str, *args: str) -> Agent:
    """``rankwatch agent --upstream <upstream>`` on a free port, once its ``/healthz`` answers."""
    port = free_port()
    log = tmp / f"agent-{port}.log"
    cmd = [str(BIN / "rankwatch"), "agent", "--port", str(port), "--upstream", upstream, *args]
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, cwd=tmp, env=clean_env(), stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"rankwatch agent exited with {proc.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                return Agent(url=url, proc=proc, log=log)
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"rankwatch agent did not come up:\n{log.read_text()}")
        time.sleep(0.1)


@dataclass
class Run:
    returncode: int
    output: str
    outdir: Path


def torchrun(
    tmp: Path,
    script: str | Path,
    *script_args: str,
    nproc: int = 2,
    env: dict[str, str] | None = None,
    timeout: float = 240,
    launcher_args: tuple[str, ...] = ("--standalone",),
) -> Run:
    """Run ``script`` under a real torchrun in ``tmp``; the script's last argument is an output dir."""
    outdir = tmp / "out"
    outdir.mkdir(exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *launcher_args,
        f"--nproc-per-node={nproc}",
        str(script),
        *script_args,
    ]
    proc = subprocess.Popen(cmd, cwd=tmp, env=env or clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        raise
    return Run(proc.returncode, out.decode(errors="replace"), outdir)


def make_header(
    job: str = "job-a",
    rank: int = 0,
    world: int = 2,
    batch: int = 0,
    incarnation: str = "0-100-aaaa",
    entered: int = 3,
    **extra: Any,
) -> dict[str, Any]:
    """A batch header as a real rank would send it (one world group)."""
    header: dict[str, Any] = {
        "job": job,
        "rank": rank,
        "world": world,
        "node": f"node{rank // 8}",
        "incarnation": incarnation,
        "restart": 0,
        "batch": batch,
        "mono_ns": 10_000_000_000,
        "state": "running",
        "drops": 0,
        "pid": 1000 + rank,
        "flush_s": 1.0,
        "groups": [
            {"id": "0", "desc": "default_pg", "ranks": [[0, world, 1]], "entered": entered, "completed": entered}
        ],
    }
    header.update(extra)
    return header


def make_body(header: dict[str, Any] | None = None, n: int = 3, first_seq: int = 1) -> bytes:
    """An encoded batch with ``n`` all_reduce records on group 0."""
    from rankwatch.wire import OpKind, Records, encode_batch

    header = header or make_header(entered=first_seq + n - 1)
    rows = [
        (0, int(OpKind.ALL_REDUCE), 1, -1, first_seq + i, 64, 1_000_000 * i, 1_000_000 * i, 1_000_000 * i + 50_000)
        for i in range(n)
    ]
    return encode_batch(header, Records.from_rows(rows))


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (torchrun's workers may sit in sessions of their own)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL a launcher and everything it started, then reap it."""
    if proc.poll() is None:
        for pid in [*descendants(proc.pid), proc.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    proc.wait(timeout=30)
