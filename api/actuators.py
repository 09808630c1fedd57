"""Actuators: how rankwatch isolates a node and brings a job back, one small plug-in per scheduler.

Every actuator answers the same four requests — ``isolate`` a node, ``restart`` the job without
it, ``swap`` the faulty member for a standby while the rest keep training, ``release`` a node back
to service — and returns a ``StepResult`` saying what it ran and what came back. External commands
run as argv lists, never through a shell, with a timeout. ``dry_run`` describes the step without
doing it.

    slurm       scontrol: drain with a reason, requeue excluding the node, resume
    kubernetes  official client: cordon + taint the node, delete the job's worker pods on it
    torchrun    local: exclusion file + stop the node's torchrun agent; restart through the ranks'
                control channel (exit with a code, torchrun --max-restarts brings them back)
    torchft     live swap: kill the faulty replica group through its lighthouse
    command     a user's argv template ({node}, {job_id}, {reason}) for anything else
    none        refuses everything (the default: rankwatch observes and pages only)
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from rankwatch.errors import ConfigError

__all__ = [
    "ACTUATORS",
    "Actuator",
    "CommandActuator",
    "KubernetesActuator",
    "NoneActuator",
    "SlurmActuator",
    "StepResult",
    "Target",
    "TorchftActuator",
    "TorchrunActuator",
    "hosts_rendezvous",
    "make_actuator",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Target:
    """What an action acts on: one node of a job, and what the ranks there reported."""

    job_id: str
    node: str
    reason: str
    ranks: tuple[int, ...] = ()
    meta: dict[int, dict[str, Any]] = field(default_factory=dict)  # rank -> the hooks' meta
    standby: str | None = None
    all_ranks: tuple[int, ...] = ()

    def first(self, key: str) -> Any:
        """The first value any rank on the node reported for ``key``."""
        for r in self.ranks:
            v = self.meta.get(r, {}).get(key)
            if v not in (None, ""):
                return v
        return None


@dataclass
class StepResult:
    """What one actuator step did."""

    ok: bool
    output: str
    data: dict[str, Any] = field(default_factory=dict)
    refused: bool = False  # the actuator declined (it would break the job); nothing was done

    def public(self) -> dict[str, Any]:
        return {"ok": self.ok, "output": self.output[-4000:], **({"data": self.data} if self.data else {})}


RequestExit = Callable[[str, Sequence[int], int, str], list[str]]
"""(job_id, ranks, exit code, reason) -> command ids: tell ranks to exit over the control channel."""


class Actuator:
    """Base: every step unsupported until a plug-in says otherwise."""

    name: ClassVar[str] = "base"

    def isolate(self, t: Target, *, dry_run: bool = False) -> StepResult:
        return StepResult(False, f"the {self.name} actuator cannot isolate a node")

    def release(self, node: str, *, dry_run: bool = False) -> StepResult:
        return StepResult(False, f"the {self.name} actuator cannot release a node")

    def restart(self, t: Target, request_exit: RequestExit, *, dry_run: bool = False) -> StepResult:
        return StepResult(False, f"the {self.name} actuator cannot restart a job")

    def swap(self, t: Target, *, dry_run: bool = False) -> StepResult:
        return StepResult(False, f"the {self.name} actuator cannot swap a member for a standby")


class NoneActuator(Actuator):
    """The default: rankwatch reports and pages, and acts on nothing."""

    name = "none"


def _run(argv: Sequence[str], timeout: float, dry_run: bool) -> StepResult:
    shown = " ".join(_quote(a) for a in argv)
    if dry_run:
        return StepResult(True, f"would run: {shown}")
    try:
        p = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        return StepResult(False, f"$ {shown}\ncommand not found: {argv[0]}")
    except subprocess.TimeoutExpired:
        return StepResult(False, f"$ {shown}\ntimed out after {timeout:g}s")
    out = (p.stdout + p.stderr).strip()
    return StepResult(p.returncode == 0, f"$ {shown}\n{out}".rstrip() + f"\n(exit {p.returncode})")


def _quote(a: str) -> str:
    return a if a and all(c.isalnum() or c in "-_./=:@,+" for c in a) else json.dumps(a)


class SlurmActuator(Actuator):
    """Slurm through ``scontrol``: drain, requeue excluding the node, resume."""

    name = "slurm"

    def __init__(self, scontrol: str = "scontrol", squeue: str = "squeue", timeout: float = 30.0) -> None:
        self.scontrol, self.squeue, self.timeout = scontrol, squeue, timeout

    def isolate(self, t: Target, *, dry_run: bool = False) -> StepResult:
        reason = t.reason.replace("\n", " ")[:200] or "rankwatch"
        return _run(
            [self.scontrol, "update", f"NodeName={t.node}", "State=DRAIN", f"Reason={reason}"], self.timeout, dry_run
        )

    def release(self, node: str, *, dry_run: bool = False) -> StepResult:
        return _run([self.scontrol, "update", f"NodeName={node}", "State=RESUME"], self.timeout, dry_run)

    def restart(self, t: Target, request_exit: RequestExit, *, dry_run: bool = False) -> StepResult:
        job = t.first("slurm_job")
        if job is None:
            return StepResult(False, f"no rank of job {t.job_id} on {t.node} reported a SLURM_JOB_ID")
        steps = [_run([self.scontrol, "requeue", str(job)], self.timeout, dry_run)]
        if not steps[0].ok:
            return steps[0]
        if not dry_run and not self._wait_pending(str(job)):
            return StepResult(False, steps[0].output + f"\njob {job} did not become PENDING after requeue")
        # once pending: start now (a requeued job otherwise waits ~2 min) and never on the drained node
        steps.append(
            _run(
                [self.scontrol, "update", f"JobId={job}", "StartTime=now", f"ExcNodeList={t.node}", "NodeList="],
                self.timeout,
                dry_run,
            )
        )
        return StepResult(all(s.ok for s in steps), "\n".join(s.output for s in steps), {"slurm_job": str(job)})

    def _wait_pending(self, job: str, limit: float = 60.0) -> bool:
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            p = subprocess.run(
                [self.squeue, "-h", "-j", job, "-o", "%T"], capture_output=True, text=True, timeout=self.timeout
            )
            if p.stdout.strip() == "PENDING":
                return True
            time.sleep(0.5)
        return False


class CommandActuator(Actuator):
    """Anything else: argv templates with ``{node}``, ``{job_id}``, ``{reason}``, run without a shell."""

    name = "command"

    def __init__(self, templates: dict[str, list[str]], timeout: float = 60.0) -> None:
        self.templates, self.timeout = templates, timeout

    def _step(self, what: str, values: dict[str, str], dry_run: bool) -> StepResult:
        template = self.templates.get(what)
        if not template:
            return StepResult(False, f"no command configured for {what}")
        try:
            argv = [part.format(**values) for part in template]
        except (KeyError, IndexError) as exc:
            return StepResult(False, f"bad {what} template {template}: unknown field {exc}")
        return _run(argv, self.timeout, dry_run)

    def isolate(self, t: Target, *, dry_run: bool = False) -> StepResult:
        return self._step("isolate", {"node": t.node, "job_id": t.job_id, "reason": t.reason}, dry_run)

    def release(self, node: str, *, dry_run: bool = False) -> StepResult:
        return self._step("release", {"node": node, "job_id": "", "reason": "release"}, dry_run)

    def restart(self, t: Target, request_exit: RequestExit, *, dry_run: bool = False) -> StepResult:
        return self._step("restart", {"node": t.node, "job_id": t.job_id, "reason": t.reason}, dry_run)

    def swap(self, t: Target, *, dry_run: bool = False) -> StepResult:
        return self._step("swap", {"node": t.node, "job_id": t.job_id, "reason": t.reason}, dry_run)


class TorchrunActuator(Actuator):
    """One host or a few, torchrun only: an exclusion file, the node's agent, the control channel.

    Isolating writes the node into an exclusion file a launcher script reads before starting an
    agent, and stops that node's torchrun agent (its pid comes from the hooks); the other agents
    re-rendezvous without it. Restart tells every rank of the job to exit with ``exit_code`` over
    the control channel (honoured only by jobs run with ``RANKWATCH_CONTROL=1``), and torchrun's
    ``--max-restarts`` brings them back, resuming from their last checkpoint.
    """

    name = "torchrun"

    def __init__(
        self,
        exclusion_file: Path | None = None,
        exit_code: int = 3,
        stop_agent: bool = True,
        store_nodes: Sequence[str] = (),
    ) -> None:
        self.exclusion_file, self.exit_code, self.stop_agent = exclusion_file, exit_code, stop_agent
        self.store_nodes = tuple(store_nodes)

    @property
    def restarts_on_isolate(self) -> bool:
        """Stopping a node's agent is itself the restart: the other agents re-rendezvous without it."""
        return self.stop_agent

    def isolate(self, t: Target, *, dry_run: bool = False) -> StepResult:
        pids = sorted({int(p) for r in t.ranks if (p := t.meta.get(r, {}).get("agent_pid"))})
        store = [p for p in pids if hosts_rendezvous(p)]
        if t.node in self.store_nodes or store:
            how = f"agent pid {store[0]} listens on the rendezvous port" if store else "store_nodes names it"
            return StepResult(
                False,
                f"refused: {t.node} hosts the job's rendezvous store ({how}); stopping its agent would end "
                "the whole job, not shrink it. Restart the job with the rendezvous endpoint on another node.",
                {"agent_pids": pids},
                refused=True,
            )
        lines = []
        if self.exclusion_file is not None:
            lines.append(f"add {t.node} to {self.exclusion_file}")
            if not dry_run:
                self.exclusion_file.parent.mkdir(parents=True, exist_ok=True)
                with open(self.exclusion_file, "a") as f:
                    f.write(f"{t.node}\n")
        if self.stop_agent:
            if not pids:
                return StepResult(False, "\n".join([*lines, f"no rank on {t.node} reported its torchrun agent's pid"]))
            for pid in pids:
                lines.append(f"SIGTERM torchrun agent pid {pid} on {t.node}")
                if not dry_run:
                    try:
                        os.kill(pid, signal.SIGTERM)
                    except ProcessLookupError:
                        lines.append(f"  agent {pid} already gone")
                    except PermissionError as exc:
                        return StepResult(False, "\n".join([*lines, f"  cannot signal {pid}: {exc}"]))
        return StepResult(True, ("would: " if dry_run else "") + "\n".join(lines), {"agent_pids": pids})

    def release(self, node: str, *, dry_run: bool = False) -> StepResult:
        if self.exclusion_file is None or not self.exclusion_file.exists():
            return StepResult(True, f"{node} is not excluded")
        kept = [n for n in self.exclusion_file.read_text().split() if n != node]
        if not dry_run:
            self.exclusion_file.write_text("".join(f"{n}\n" for n in kept))
        return StepResult(True, f"{'would remove' if dry_run else 'removed'} {node} from {self.exclusion_file}")

    def restart(self, t: Target, request_exit: RequestExit, *, dry_run: bool = False) -> StepResult:
        ranks = list(t.all_ranks or t.ranks)
        if dry_run:
            return StepResult(True, f"would tell ranks {ranks} of {t.job_id} to exit with code {self.exit_code}")
        ids = request_exit(t.job_id, ranks, self.exit_code, t.reason)
        return StepResult(True, f"told ranks {ranks} to exit with code {self.exit_code}", {"commands": ids})


class TorchftActuator(Actuator):
    """Live swap with torchft: kill the faulty replica group through its lighthouse.

    The replica id (with the uuid torchft appends) and the lighthouse address come from the hooks.
    The lighthouse answers 500 even when the kill worked (the replica exits before replying), so
    success is confirmed by the replica's process leaving, not by the status code.
    """

    name = "torchft"

    def __init__(self, lighthouse: str | None = None, timeout: float = 10.0) -> None:
        self.lighthouse, self.timeout = lighthouse, timeout

    def swap(self, t: Target, *, dry_run: bool = False) -> StepResult:
        replica = t.first("torchft_replica_id")
        lighthouse = self.lighthouse or t.first("torchft_lighthouse")
        if not replica or not lighthouse:
            return StepResult(False, f"no rank on {t.node} reported a torchft replica id and lighthouse")
        url = f"{str(lighthouse).rstrip('/')}/replica/{urllib.parse.quote(str(replica), safe=':')}/kill"
        if dry_run:
            return StepResult(True, f"would POST {url}")
        pids = sorted({int(p) for r in t.ranks if (p := t.meta.get(r, {}).get("pid"))})
        status: int | str
        try:
            req = urllib.request.Request(url, method="POST", data=b"")
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                status = resp.status
        except urllib.error.HTTPError as exc:
            status = exc.code
        except (urllib.error.URLError, OSError) as exc:
            return StepResult(False, f"POST {url}: {exc}")
        gone = _wait_gone(pids, 15.0)
        out = f"POST {url} -> {status}; replica processes {pids} {'exited' if gone else 'still running'}"
        return StepResult(gone, out, {"replica_id": replica, "status": status})


def hosts_rendezvous(pid: int) -> bool:
    """Whether torchrun agent ``pid`` (on this host) serves its job's rendezvous store.

    The agent that hosts the c10d (or static) rendezvous listens on the port its command line
    names (``--rdzv-endpoint``, else ``--master-port``); the others only connect to it.
    """
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    port = _rendezvous_port(argv)
    if port is None:
        return False
    inodes = set()
    for fd in fds:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    cols = line.split()
                    if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port and cols[9] in inodes:
                        return True
        except (OSError, StopIteration, IndexError, ValueError):
            continue
    return False


def _rendezvous_port(argv: Sequence[str]) -> int | None:
    def value(*names: str) -> str | None:
        for i, a in enumerate(argv):
            for n in names:
                if a == n and i + 1 < len(argv):
                    return argv[i + 1]
                if a.startswith(n + "="):
                    return a.split("=", 1)[1]
        return None

    endpoint = value("--rdzv-endpoint", "--rdzv_endpoint")
    try:
        if endpoint:
            return int(endpoint.rsplit(":", 1)[1]) if ":" in endpoint else 29400
        port = value("--master-port", "--master_port")
        return int(port) if port else None
    except ValueError:
        return None


def _wait_gone(pids: Sequence[int], limit: float) -> bool:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        alive = []
        for pid in pids:
            try:
                os.kill(pid, 0)
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                        alive.append(pid)
            except (ProcessLookupError, FileNotFoundError):
                pass
        if not alive:
            return True
        time.sleep(0.1)
    return False


class KubernetesActuator(Actuator):
    """Kubernetes through the official client: cordon and taint, delete the job's pods on the node.

    The job controller (PyTorchJob, JobSet) recreates the deleted worker pods elsewhere. Release
    uncordons and removes the taint. This project's CI has no cluster: the tests run it against an
    HTTP stand-in for the API server that checks each request.
    """

    name = "kubernetes"
    TAINT_KEY = "rankwatch.io/faulty"

    def __init__(self, api_client: Any = None, namespace: str | None = None) -> None:
        try:
            from kubernetes import client, config
        except ImportError as exc:
            from rankwatch.errors import MissingExtraError

            raise MissingExtraError("the kubernetes actuator", "kubernetes") from exc
        if api_client is None:
            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
            api_client = client.ApiClient()
        self.v1 = client.CoreV1Api(api_client)
        self.namespace = namespace
        self._client = client

    def isolate(self, t: Target, *, dry_run: bool = False) -> StepResult:
        lines = [f"cordon {t.node}", f"taint {t.node} {self.TAINT_KEY}=true:NoExecute"]
        pods = sorted(
            {
                (str(p.get("k8s_namespace") or self.namespace or "default"), str(p["k8s_pod"]))
                for p in t.meta.values()
                if p.get("k8s_pod")
            }
        )
        lines += [f"delete pod {ns}/{name}" for ns, name in pods]
        if dry_run:
            return StepResult(True, "would: " + "; ".join(lines))
        try:
            node = self.v1.read_node(t.node)
            taints = [x for x in ((node.spec.taints if node.spec else None) or []) if x.key != self.TAINT_KEY]
            taints.append(self._client.V1Taint(key=self.TAINT_KEY, value="true", effect="NoExecute"))
            self.v1.patch_node(
                t.node,
                {
                    "spec": {"unschedulable": True, "taints": [x.to_dict() for x in taints]},
                    "metadata": {"annotations": {"rankwatch.io/reason": t.reason[:500]}},
                },
            )
            for ns, name in pods:
                self.v1.delete_namespaced_pod(name, ns, grace_period_seconds=0)
        except Exception as exc:  # the client raises ApiException and urllib3 errors
            return StepResult(False, "; ".join(lines) + f"\nfailed: {exc}")
        return StepResult(True, "; ".join(lines), {"pods": [f"{ns}/{n}" for ns, n in pods]})

    def release(self, node: str, *, dry_run: bool = False) -> StepResult:
        if dry_run:
            return StepResult(True, f"would uncordon {node} and remove taint {self.TAINT_KEY}")
        try:
            n = self.v1.read_node(node)
            taints = [x.to_dict() for x in ((n.spec.taints if n.spec else None) or []) if x.key != self.TAINT_KEY]
            self.v1.patch_node(node, {"spec": {"unschedulable": False, "taints": taints}})
        except Exception as exc:
            return StepResult(False, f"release {node} failed: {exc}")
        return StepResult(True, f"uncordoned {node}, removed taint {self.TAINT_KEY}")

    def restart(self, t: Target, request_exit: RequestExit, *, dry_run: bool = False) -> StepResult:
        return StepResult(True, "the job controller recreates the deleted pods; nothing more to do")


ACTUATORS: dict[str, type[Actuator]] = {
    a.name: a
    for a in (NoneActuator, SlurmActuator, KubernetesActuator, TorchrunActuator, TorchftActuator, CommandActuator)
}


def make_actuator(name: str, options: dict[str, Any] | None = None) -> Actuator:
    """Build an actuator by name with its options (from settings or a job's policy).

    Raises:
        ConfigError: unknown name or options it does not take.
    """
    cls = ACTUATORS.get(name)
    if cls is None:
        raise ConfigError(f"unknown actuator {name!r}; choose one of {', '.join(sorted(ACTUATORS))}")
    opts = dict(options or {})
    if cls is TorchrunActuator and "exclusion_file" in opts and opts["exclusion_file"] is not None:
        opts["exclusion_file"] = Path(opts["exclusion_file"])
    try:
        return cls(**opts)
    except TypeError as exc:
        raise ConfigError(f"actuator {name!r}: {exc}") from None
