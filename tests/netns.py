"""Test hosts in network namespaces, joined by a bridge, with real slow NICs and links (tbf/htb).

Checked on this project's machines: ``netem`` is not available, ``tbf`` and ``htb`` are. Each host
is a namespace with one veth to a bridge in the root namespace; the bridge has an address, so a
service in the root namespace is reachable from every host. A slow NIC throttles both ends of a
host's veth; a slow link adds htb classes that throttle only traffic between two hosts.
Addresses 10.213.0.0/24 belong to these test hosts only. Needs root.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from dataclasses import dataclass, field

__all__ = ["Hosts", "can_make_hosts"]

SUBNET = "10.213.0"
BRIDGE_IP = f"{SUBNET}.254"


def _sh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), check=check, capture_output=True, text=True)


def can_make_hosts() -> bool:
    if os.geteuid() != 0:
        return False
    name = f"rwchk{uuid.uuid4().hex[:6]}"
    ok = _sh("ip", "netns", "add", name, check=False).returncode == 0
    if ok:
        _sh("ip", "netns", "del", name, check=False)
    return ok


@dataclass
class Hosts:
    """``n`` hosts h0..h{n-1} at 10.213.0.1..n, bridged to the root namespace at 10.213.0.254."""

    n: int
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:4])
    throttled: list[str] = field(default_factory=list)

    def ns(self, i: int) -> str:
        return f"rw{self.tag}h{i}"

    def ip(self, i: int) -> str:
        return f"{SUBNET}.{i + 1}"

    def veth_host(self, i: int) -> str:
        return f"rw{self.tag}v{i}"  # inside the host namespace

    def veth_bridge(self, i: int) -> str:
        return f"rw{self.tag}b{i}"  # in the root namespace, on the bridge

    @property
    def bridge(self) -> str:
        return f"rw{self.tag}br"

    def __enter__(self) -> Hosts:
        _sh("ip", "link", "add", self.bridge, "type", "bridge")
        _sh("ip", "addr", "add", f"{BRIDGE_IP}/24", "dev", self.bridge)
        _sh("ip", "link", "set", self.bridge, "up")
        for i in range(self.n):
            ns = self.ns(i)
            _sh("ip", "netns", "add", ns)
            _sh("ip", "link", "add", self.veth_host(i), "type", "veth", "peer", "name", self.veth_bridge(i))
            _sh("ip", "link", "set", self.veth_host(i), "netns", ns)
            _sh("ip", "link", "set", self.veth_bridge(i), "master", self.bridge)
            _sh("ip", "link", "set", self.veth_bridge(i), "up")
            _sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{self.ip(i)}/24", "dev", self.veth_host(i))
            _sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
            _sh("ip", "netns", "exec", ns, "ip", "link", "set", self.veth_host(i), "up")
        return self

    def __exit__(self, *exc: object) -> None:
        for i in range(self.n):
            _sh("ip", "netns", "del", self.ns(i), check=False)
            _sh("ip", "link", "del", self.veth_bridge(i), check=False)
        _sh("ip", "link", "del", self.bridge, check=False)

    def prefix(self, i: int) -> list[str]:
        """Run a command as host ``i``: ``[*hosts.prefix(i), "python", ...]``."""
        return ["ip", "netns", "exec", self.ns(i)]

    def slow_nic(self, i: int, rate: str = "50mbit") -> None:
        """Throttle everything host ``i`` sends and receives."""
        for dev, ns in ((self.veth_host(i), self.ns(i)), (self.veth_bridge(i), None)):
            cmd = [
                "tc",
                "qdisc",
                "replace",
                "dev",
                dev,
                "root",
                "tbf",
                "rate",
                rate,
                "burst",
                "64kbit",
                "latency",
                "400ms",
            ]
            _sh(*(["ip", "netns", "exec", ns] if ns else []), *cmd)

    def slow_link(self, a: int, b: int, rate: str = "50mbit") -> None:
        """Throttle only the traffic between hosts ``a`` and ``b`` (both directions)."""
        for src, dst in ((a, b), (b, a)):
            ns, dev = self.ns(src), self.veth_host(src)
            ex = ["ip", "netns", "exec", ns]
            _sh(*ex, "tc", "qdisc", "replace", "dev", dev, "root", "handle", "1:", "htb", "default", "10")
            _sh(*ex, "tc", "class", "replace", "dev", dev, "parent", "1:", "classid", "1:10", "htb", "rate", "10gbit")
            _sh(
                *ex,
                "tc",
                "class",
                "replace",
                "dev",
                dev,
                "parent",
                "1:",
                "classid",
                "1:20",
                "htb",
                "rate",
                rate,
                "ceil",
                rate,
            )
            _sh(
                *ex, "tc", "filter", "replace", "dev", dev, "protocol", "ip", "parent", "1:", "prio", "1",
                "u32", "match", "ip", "dst", f"{self.ip(dst)}/32", "flowid", "1:20",
            )  # fmt: skip

    def clear(self, i: int) -> None:
        for dev, ns in ((self.veth_host(i), self.ns(i)), (self.veth_bridge(i), None)):
            _sh(*(["ip", "netns", "exec", ns] if ns else []), "tc", "qdisc", "del", "dev", dev, "root", check=False)
