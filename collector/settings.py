"""The service's settings: one pydantic-settings ``Settings``, environment prefix ``RANKWATCH_``.

``rankwatch serve --help`` shows the same settings as flags; a flag beats the variable, which
beats the default. Nothing here connects to anything.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from rankwatch.env import DEFAULT_PORT

__all__ = ["Settings", "is_loopback"]


def _split(value: object) -> object:
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return value


class Settings(BaseSettings):
    """Everything ``rankwatch serve`` can be told."""

    model_config = SettingsConfigDict(env_prefix="RANKWATCH_", extra="ignore")

    host: str = Field("127.0.0.1", description="Address to bind; loopback unless told otherwise.")
    port: int = Field(DEFAULT_PORT, ge=0, le=65535, description="TCP port.")
    data_dir: Path = Field(Path.home() / ".rankwatch", description="Where the SQLite database lives by default.")
    db: str | None = Field(
        None, description="Database URL (sqlite:///path or postgresql://...); default: SQLite in the data directory."
    )
    ingest_tokens: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Comma-separated tokens ranks may send batches with."
    )
    read_tokens: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Comma-separated tokens for reading (dashboards, /suspects)."
    )
    admin_tokens: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Comma-separated tokens for webhooks, actions, policies (may also read)."
    )
    tokens_file: Path | None = Field(
        None, description="File of 'scope token [job]' lines, re-read when it changes (tokens rotate without restart)."
    )
    webhook_allow: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Hosts/CIDRs webhooks may reach despite the SSRF guard."
    )
    webhook_timeout_s: float = Field(10.0, gt=0, description="Seconds one webhook attempt may take, all in.")
    webhook_max_attempts: int = Field(12, ge=1, description="Attempts before a webhook delivery is dead.")
    webhook_retry_base_s: float = Field(5.0, gt=0, description="First retry delay; doubles per attempt, jittered.")
    webhook_retry_cap_s: float = Field(3600.0, gt=0, description="Longest delay between two webhook attempts.")
    public_url: str | None = Field(
        None, description="This service's URL as people reach it, for links in pages (default: from host and port)."
    )
    policy: str = Field("observe", description="Default remediation policy for all jobs: observe, approve or auto.")
    actuator: str = Field(
        "none", description="Default actuator for all jobs: none, slurm, kubernetes, torchrun, torchft or command."
    )
    actuator_options: dict[str, Any] = Field(
        default_factory=dict, description="Options of the default actuator, as JSON (e.g. a command's templates)."
    )
    analysis_interval_s: float = Field(0.5, gt=0, description="Seconds between analysis passes over each job.")
    rank_dead_after_s: float = Field(
        0.0, ge=0, description="Heartbeat silence that makes a rank dead (0: adapt to each rank's flush interval)."
    )
    max_body_mb: float = Field(64.0, gt=0, description="Largest batch accepted, in MiB.")
    certfile: Path | None = Field(None, description="TLS certificate (PEM); serve HTTPS when given with keyfile.")
    keyfile: Path | None = Field(None, description="TLS private key (PEM).")
    log_level: str = Field("info", description="Log level of the service.")
    # -- storage, retention and running several processes (issue 4) --
    persist_interval_s: float = Field(
        2.0, gt=0, description="Seconds between writes of ranks, groups and summaries (what a kill -9 can lose)."
    )
    summary_window_s: float = Field(60.0, gt=0, description="Length of one per-group summary window, in seconds.")
    retention_summaries_days: float = Field(7.0, ge=0, description="Days per-group summaries are kept (0: forever).")
    retention_suspects_days: float = Field(
        90.0, ge=0, description="Days resolved suspects and their history are kept (0: forever)."
    )
    retention_actions_days: float = Field(90.0, ge=0, description="Days actions are kept (0: forever).")
    retention_events_days: float = Field(90.0, ge=0, description="Days outbox events are kept (0: forever).")
    cleanup_interval_s: float = Field(3600.0, gt=0, description="Seconds between two retention clean-ups.")
    advertise_url: str | None = Field(
        None,
        description="URL other rankwatch processes reach this one at, to forward batches of jobs it holds "
        "(default: from host and port).",
    )
    lease_ttl_s: float = Field(
        15.0, gt=0, description="A job's lease expires this long after its holder last renewed it."
    )
    job_idle_s: float = Field(
        900.0, gt=0, description="A job with no batch for this long is written out, its lease released, memory freed."
    )

    @field_validator("ingest_tokens", "read_tokens", "admin_tokens", "webhook_allow", mode="before")
    @classmethod
    def _comma_list(cls, value: object) -> object:
        return _split(value)

    @field_validator("actuator")
    @classmethod
    def _actuator(cls, value: str) -> str:
        known = ("none", "slurm", "kubernetes", "torchrun", "torchft", "command")
        if value not in known:
            raise ValueError(f"actuator must be one of {', '.join(known)}")
        return value

    @field_validator("policy")
    @classmethod
    def _policy(cls, value: str) -> str:
        if value not in ("observe", "approve", "auto"):
            raise ValueError("policy must be observe, approve or auto")
        return value

    @property
    def database_url(self) -> str:
        if self.db:
            url = self.db
            if url.startswith("postgresql://"):
                url = "postgresql+psycopg://" + url[len("postgresql://") :]
            return url
        return f"sqlite:///{self.data_dir / 'rankwatch.db'}"

    @property
    def peer_url(self) -> str:
        """Where other service processes reach this one (``advertise_url``, else host and port)."""
        if self.advertise_url:
            return self.advertise_url.rstrip("/")
        scheme = "https" if self.certfile else "http"
        host = self.host
        if host in ("0.0.0.0", "::", ""):
            import socket

            host = socket.getfqdn()
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"{scheme}://{host}:{self.port}"

    @property
    def tokens_configured(self) -> bool:
        return bool(self.ingest_tokens or self.read_tokens or self.admin_tokens or self.tokens_file)


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps the service reachable from this machine only."""
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
