"""Who this process is: job, rank, node, incarnation, and what actuators will need to act on it.

Job id precedence: ``RANKWATCH_JOB``, then ``SLURM_JOB_ID``, then (torchft) the lighthouse
address, then torchrun's run id (unless it is torchrun's default ``none``), then an id rank 0 makes
and shares through the default group's store.
Node: ``RANKWATCH_NODE``, then ``SLURMD_NODENAME``, then the host name.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Mapping
from typing import Any

from rankwatch.env import JOB_ENV, NODE_ENV

__all__ = ["JOB_STORE_KEY", "job_from_env", "make_incarnation", "node_name", "process_meta"]

JOB_STORE_KEY = "rankwatch/job_id"


def job_from_env(environ: Mapping[str, str] | None = None) -> str | None:
    """The job id the environment gives, or None when rank 0 must make one."""
    env = os.environ if environ is None else environ
    for name in (JOB_ENV, "SLURM_JOB_ID"):
        if env.get(name):
            return env[name]
    lighthouse = env.get("TORCHFT_LIGHTHOUSE", "")
    if lighthouse:  # torchft: one torchrun per replica group, one job across them
        host = lighthouse.split("://", 1)[-1].strip("/")
        return f"torchft-{host}"
    run_id = env.get("TORCHELASTIC_RUN_ID", "")
    if run_id and run_id != "none":
        return run_id
    return None


def node_name(environ: Mapping[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    return env.get(NODE_ENV) or env.get("SLURMD_NODENAME") or socket.gethostname()


def make_incarnation(environ: Mapping[str, str] | None = None) -> tuple[int, str]:
    """(restart count, incarnation id): torchrun's restart count plus a per-process id."""
    env = os.environ if environ is None else environ
    try:
        restart = int(env.get("TORCHELASTIC_RESTART_COUNT", "0"))
    except ValueError:
        restart = 0
    return restart, f"{restart}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def process_meta(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """What actuators need later: launcher pids, scheduler ids, pod, torchft replica."""
    env = os.environ if environ is None else environ
    meta: dict[str, Any] = {"hostname": socket.gethostname(), "pid": os.getpid()}
    if env.get("TORCHELASTIC_RUN_ID") is not None or env.get("TORCHELASTIC_RESTART_COUNT") is not None:
        meta["agent_pid"] = os.getppid()
        meta["torchrun_run_id"] = env.get("TORCHELASTIC_RUN_ID")
        meta["torchrun_max_restarts"] = _int(env.get("TORCHELASTIC_MAX_RESTARTS"))
    for key, name in (
        ("local_rank", "LOCAL_RANK"),
        ("group_rank", "GROUP_RANK"),
        ("slurm_job", "SLURM_JOB_ID"),
        ("slurm_node", "SLURMD_NODENAME"),
        ("slurm_step", "SLURM_STEP_ID"),
        ("torchft_replica_group", "REPLICA_GROUP_ID"),
        ("torchft_lighthouse", "TORCHFT_LIGHTHOUSE"),
    ):
        if env.get(name):
            meta[key] = env[name]
    if env.get("KUBERNETES_SERVICE_HOST"):
        meta["k8s_pod"] = env.get("POD_NAME") or socket.gethostname()
        ns = env.get("POD_NAMESPACE")
        if not ns:
            try:
                with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace") as f:
                    ns = f.read().strip()
            except OSError:
                ns = None
        if ns:
            meta["k8s_namespace"] = ns
    return meta


def _int(v: str | None) -> int | None:
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None
