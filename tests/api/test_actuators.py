"""Actuators against the real thing where this machine can run it, a checking stand-in where not.

Slurm: a real three-node Slurm (``scripts/slurm.sh``). Kubernetes: no cluster can run here, so the
official client talks to an HTTP stand-in for the API server that records and checks every
request. torchrun: real processes standing in for agents. command: real commands, no shell.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from rankwatch.api.actuators import (
    CommandActuator,
    KubernetesActuator,
    SlurmActuator,
    Target,
    TorchrunActuator,
    make_actuator,
)
from rankwatch.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def _target(**kw: Any) -> Target:
    base: dict[str, Any] = {
        "job_id": "j1",
        "node": "n1",
        "reason": "rankwatch: noncomm_slow rank 1 1.40x",
        "ranks": (1,),
    }
    base.update(kw)
    return Target(**base)


# -- slurm ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def slurm() -> Iterator[None]:
    import os

    if os.geteuid() != 0:
        pytest.skip("a real Slurm needs root (the test command runs as root)")
    subprocess.run(["bash", str(ROOT / "scripts" / "slurm.sh"), "start"], check=True, capture_output=True)
    yield
    for n in ("n1", "n2", "n3"):
        subprocess.run(["scontrol", "update", f"NodeName={n}", "State=RESUME"], capture_output=True)


def _node_state(node: str) -> tuple[str, str]:
    out = subprocess.run(["scontrol", "show", "node", node], capture_output=True, text=True, check=True).stdout
    fields = dict(kv.split("=", 1) for kv in out.replace("\n", " ").split() if "=" in kv)
    reason = out.split("Reason=", 1)[1].split(" [", 1)[0].strip() if "Reason=" in out else ""
    return fields.get("State", ""), reason


def test_slurm_drain_and_resume(slurm: None) -> None:
    act = SlurmActuator()
    dry = act.isolate(_target(node="n2"), dry_run=True)
    assert dry.ok and "would run: scontrol update NodeName=n2 State=DRAIN" in dry.output
    assert "DRAIN" not in _node_state("n2")[0]  # dry run changed nothing
    r = act.isolate(_target(node="n2"))
    assert r.ok, r.output
    state, reason = _node_state("n2")
    assert "DRAIN" in state and reason == "rankwatch: noncomm_slow rank 1 1.40x"
    sinfo = subprocess.run(["sinfo", "-R", "-h", "-o", "%n %E"], capture_output=True, text=True).stdout
    assert "n2 rankwatch: noncomm_slow rank 1 1.40x" in sinfo
    assert act.release("n2").ok
    deadline = time.monotonic() + 10
    while "DRAIN" in _node_state("n2")[0] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "DRAIN" not in _node_state("n2")[0]


def test_slurm_requeue_excludes_the_node(slurm: None, tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n#SBATCH --open-mode=append\necho start on $SLURMD_NODENAME\nsleep 120\n")
    job = subprocess.run(
        ["sbatch", "--parsable", "-w", "n1", "-o", str(tmp_path / "out.txt"), str(script)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    try:
        deadline = time.monotonic() + 20
        while (
            subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True).stdout.strip()
            != "RUNNING"
        ):
            assert time.monotonic() < deadline
            time.sleep(0.2)
        act = SlurmActuator()
        t = _target(node="n1", meta={1: {"slurm_job": job}})
        assert act.isolate(t).ok
        r = act.restart(t, lambda *a: [])
        assert r.ok, r.output
        deadline = time.monotonic() + 30
        node = ""
        while time.monotonic() < deadline:
            out = subprocess.run(
                ["squeue", "-h", "-j", job, "-o", "%T %N"], capture_output=True, text=True
            ).stdout.split()
            if len(out) == 2 and out[0] == "RUNNING":
                node = out[1]
                break
            time.sleep(0.3)
        assert node in ("n2", "n3"), node  # back, and not on the drained node
    finally:
        subprocess.run(["scancel", job], capture_output=True)
        subprocess.run(["scontrol", "update", "NodeName=n1", "State=RESUME"], capture_output=True)


def test_slurm_restart_needs_the_job_id() -> None:
    r = SlurmActuator().restart(_target(), lambda *a: [])
    assert not r.ok and "SLURM_JOB_ID" in r.output


# -- command ----------------------------------------------------------------------------------------
def test_command_templates_run_without_a_shell(tmp_path: Path) -> None:
    log = tmp_path / "log.txt"
    act = CommandActuator(
        {
            "isolate": [
                sys.executable,
                "-c",
                f"open({str(log)!r}, 'a').write(__import__('sys').argv[1])",
                "{node}:{reason}",
            ]
        }
    )
    evil = _target(node="n1; rm -rf /", reason="$(touch pwned)")
    r = act.isolate(evil)
    assert r.ok, r.output
    assert log.read_text() == "n1; rm -rf /:$(touch pwned)"  # passed verbatim as one argument
    assert not (tmp_path / "pwned").exists()
    assert not act.restart(_target(), lambda *a: []).ok  # nothing configured for it
    slow = CommandActuator({"isolate": ["sleep", "5"]}, timeout=0.5).isolate(_target())
    assert not slow.ok and "timed out" in slow.output


# -- torchrun ---------------------------------------------------------------------------------------
def test_torchrun_isolate_stops_the_nodes_agent_and_excludes_it(tmp_path: Path) -> None:
    agent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        excl = tmp_path / "excluded"
        act = TorchrunActuator(exclusion_file=excl)
        t = _target(node="nodeB", ranks=(2, 3), meta={2: {"agent_pid": agent.pid}, 3: {"agent_pid": agent.pid}})
        assert act.isolate(t, dry_run=True).ok and agent.poll() is None and not excl.exists()
        r = act.isolate(t)
        assert r.ok, r.output
        assert agent.wait(timeout=10) == -15  # SIGTERM
        assert excl.read_text().split() == ["nodeB"]
        assert act.release("nodeB").ok and excl.read_text().split() == []
    finally:
        agent.kill()
    assert not TorchrunActuator().isolate(_target(meta={})).ok  # no agent pid reported: refuse


def test_torchrun_refuses_the_agent_that_hosts_the_rendezvous_store(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # stands for an agent: its command line names the rendezvous endpoint and it listens there
    code = (
        "import socket, sys, time; s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[-1].rsplit(':', 1)[1]))); "
        "s.listen(); print('up', flush=True); time.sleep(60)"
    )
    host = subprocess.Popen(
        [sys.executable, "-c", code, "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}"],
        stdout=subprocess.PIPE,
    )
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", f"--rdzv-endpoint=127.0.0.1:{port}"])
    try:
        assert host.stdout is not None and host.stdout.readline() == b"up\n"
        act = TorchrunActuator()
        r = act.isolate(_target(node="nodeA", ranks=(0,), meta={0: {"agent_pid": host.pid}}))
        assert r.refused and not r.ok and "nodeA hosts the job's rendezvous store" in r.output, r.output
        assert host.poll() is None  # not signalled
        r = TorchrunActuator(store_nodes=["nodeB"]).isolate(_target(node="nodeB", meta={1: {"agent_pid": other.pid}}))
        assert r.refused and "store_nodes" in r.output and other.poll() is None
        r = act.isolate(_target(node="nodeB", ranks=(1,), meta={1: {"agent_pid": other.pid}}))
        assert r.ok and not r.refused and other.wait(timeout=10) == -15  # a plain member is stopped
    finally:
        host.kill()
        other.kill()


def test_torchrun_restart_goes_through_the_control_channel() -> None:
    asked: list[Any] = []
    act = TorchrunActuator(exit_code=3)
    r = act.restart(_target(all_ranks=(0, 1, 2, 3)), lambda *a: asked.append(a) or ["c1"])
    assert r.ok and asked == [("j1", [0, 1, 2, 3], 3, "rankwatch: noncomm_slow rank 1 1.40x")]


# -- kubernetes -------------------------------------------------------------------------------------
class _FakeApiServer:
    """Just enough of the Kubernetes API for cordon, taint and pod deletion, recording requests."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, Any]] = []
        self.node: dict[str, Any] = {
            "kind": "Node",
            "apiVersion": "v1",
            "metadata": {"name": "gpu7"},
            "spec": {"taints": [{"key": "other", "value": "x", "effect": "NoSchedule"}]},
        }
        outer = self

        class H(BaseHTTPRequestHandler):
            def _body(self) -> Any:
                n = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(n)) if n else None

            def _send(self, code: int, obj: Any) -> None:
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                outer.requests.append(("GET", self.path, None))
                if self.path == "/api/v1/nodes/gpu7":
                    self._send(200, outer.node)
                else:
                    self._send(404, {"kind": "Status", "code": 404})

            def do_PATCH(self) -> None:
                body = self._body()
                outer.requests.append(("PATCH", self.path, (self.headers.get("Content-Type"), body)))
                outer.node["spec"].update(body.get("spec", {}))
                self._send(200, outer.node)

            def do_DELETE(self) -> None:
                outer.requests.append(("DELETE", self.path, self._body()))
                self._send(200, {"kind": "Pod", "apiVersion": "v1", "metadata": {"name": self.path.rsplit("/", 1)[1]}})

            def log_message(self, *a: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


def test_kubernetes_cordon_taint_delete_and_release() -> None:
    pytest.importorskip("kubernetes")  # the dev extra installs it
    from kubernetes import client

    api = _FakeApiServer()
    cfg = client.Configuration()
    cfg.host = api.url
    act = KubernetesActuator(api_client=client.ApiClient(cfg))
    t = _target(
        node="gpu7",
        ranks=(4, 5),
        meta={
            4: {"k8s_pod": "job-worker-2", "k8s_namespace": "train"},
            5: {"k8s_pod": "job-worker-2", "k8s_namespace": "train"},
        },
    )
    assert act.isolate(t, dry_run=True).ok and api.requests == []
    r = act.isolate(t)
    assert r.ok, r.output
    methods = [(m, p) for m, p, _ in api.requests]
    assert methods == [
        ("GET", "/api/v1/nodes/gpu7"),
        ("PATCH", "/api/v1/nodes/gpu7"),
        ("DELETE", "/api/v1/namespaces/train/pods/job-worker-2?gracePeriodSeconds=0"),
    ]
    ctype, patch = api.requests[1][2]
    assert "merge-patch" in ctype
    assert patch["spec"]["unschedulable"] is True
    keys = {(x["key"], x["effect"]) for x in patch["spec"]["taints"]}
    assert keys == {("other", "NoSchedule"), ("rankwatch.io/faulty", "NoExecute")}  # the user's taint kept
    assert patch["metadata"]["annotations"]["rankwatch.io/reason"].startswith("rankwatch:")
    api.requests.clear()
    assert act.release("gpu7").ok
    patch = api.requests[1][2][1]
    assert patch["spec"]["unschedulable"] is False
    assert {x["key"] for x in patch["spec"]["taints"]} == {"other"}


def test_unknown_actuator() -> None:
    with pytest.raises(ConfigError, match="unknown actuator"):
        make_actuator("ssh")
    with pytest.raises(ConfigError):
        make_actuator("slurm", {"nonsense": 1})
    assert make_actuator("none").isolate(_target()).ok is False
