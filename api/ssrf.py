"""The SSRF guard: webhooks may not reach this machine or the networks behind it.

A webhook URL is a request the service makes on a stranger's behalf, from inside the cluster. So a
URL whose host resolves to a loopback, link-local, private, shared (CGNAT), reserved, multicast or
unspecified address is refused — IPv4 and IPv6 alike, including IPv4 addresses embedded in IPv6
(``::ffff:127.0.0.1``, 6to4, NAT64) — unless ``RANKWATCH_WEBHOOK_ALLOW`` names the host or a
network that holds the address. The check runs when a subscription is made and again before every
attempt, on the addresses the name resolves to *then*; the delivery connects to the address it
checked (``Target.address``), so a name that re-resolves elsewhere in between (DNS rebinding) gains
nothing. Redirects are never followed (see ``rankwatch.api.delivery``).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import httpx

from rankwatch.errors import ConfigError, UnsafeURLError

__all__ = ["AllowList", "Resolver", "Target", "blocked_reason", "check_url", "parse_url", "system_resolver"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], list[str]]
ALLOW_ENV = "RANKWATCH_WEBHOOK_ALLOW"

_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")
_V4_COMPATIBLE = ipaddress.ip_network("::/96")
_SHARED = ipaddress.ip_network("100.64.0.0/10")


@dataclass(frozen=True, slots=True)
class AllowList:
    """Hosts (by name, exact) and networks webhooks may reach despite the guard."""

    hosts: frozenset[str] = frozenset()
    networks: tuple[IPNetwork, ...] = ()

    @classmethod
    def parse(cls, entries: Iterable[str]) -> AllowList:
        """From ``RANKWATCH_WEBHOOK_ALLOW``'s items: ``10.0.0.0/8``, ``127.0.0.1``, ``::1``, ``hooks.internal``.

        Raises:
            ConfigError: an item looks like a network but is not a valid one.
        """
        hosts: set[str] = set()
        networks: list[IPNetwork] = []
        for raw in entries:
            item = raw.strip().strip("[]")
            if not item:
                continue
            try:
                networks.append(ipaddress.ip_network(item, strict=False))
                continue
            except ValueError:
                if "/" in item:
                    raise ConfigError(f"{ALLOW_ENV}: {raw!r} is not a valid network (e.g. 10.0.0.0/8)") from None
            hosts.add(_norm_host(item))
        return cls(frozenset(hosts), tuple(networks))

    def allows_host(self, host: str) -> bool:
        return _norm_host(host) in self.hosts

    def allows_address(self, ip: IPAddress) -> bool:
        candidates = [ip, *_embedded_v4(ip)]
        return any(c in net for c in candidates for net in self.networks if c.version == net.version)


@dataclass(frozen=True, slots=True)
class Target:
    """A checked webhook URL: where to connect (``address``) and what to call the host (``host``)."""

    url: httpx.URL
    host: str
    port: int
    address: str

    def pinned_url(self) -> httpx.URL:
        """The URL with its host replaced by the checked address (the connection goes there)."""
        return self.url.copy_with(host=self.address)

    @property
    def host_header(self) -> str:
        default = 443 if self.url.scheme == "https" else 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == default else f"{host}:{self.port}"


def blocked_reason(ip: IPAddress) -> str | None:
    """Why ``ip`` may not be reached (``"loopback"``, ``"private"``, ...), or None for a public address."""
    embedded = _embedded_v4(ip)
    if not embedded:
        return _reason(ip)
    # the prefixes that embed IPv4 (::ffff:0:0/96, 64:ff9b::/96, ...) say nothing; what they carry does
    for v4 in embedded:
        reason = _reason(v4)
        if reason is not None:
            return f"{reason}, embedded in {ip}"
    return None


def _reason(ip: IPAddress) -> str | None:
    if ip.is_unspecified:
        return "unspecified"
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local:
        return "link-local"
    if ip.is_multicast:
        return "multicast"
    if isinstance(ip, ipaddress.IPv4Address) and ip in _SHARED:
        return "shared address space"
    if ip.is_private:
        return "private"
    if ip.is_reserved or not ip.is_global:
        return "reserved"
    return None


def _embedded_v4(ip: IPAddress) -> list[ipaddress.IPv4Address]:
    if not isinstance(ip, ipaddress.IPv6Address):
        return []
    out = [a for a in (ip.ipv4_mapped, ip.sixtofour) if a is not None]
    if ip in _NAT64 or ip in _NAT64_LOCAL or (ip in _V4_COMPATIBLE and int(ip) > 1):
        out.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    return out


def _norm_host(host: str) -> str:
    return host.strip().strip("[]").rstrip(".").lower()


def system_resolver(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to, in the resolver's order (duplicates dropped)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    out: list[str] = []
    for *_, sockaddr in infos:
        addr = str(sockaddr[0]).split("%", 1)[0]
        if addr not in out:
            out.append(addr)
    return out


def parse_url(url: str) -> httpx.URL:
    """A webhook URL, checked for shape only (scheme, host).

    Raises:
        UnsafeURLError: not an absolute http(s) URL with a host.
    """
    try:
        parsed = httpx.URL(url)
    except Exception as exc:
        raise UnsafeURLError(f"not a valid URL: {exc}") from None
    if parsed.scheme not in ("http", "https"):
        raise UnsafeURLError(f"webhook URLs must be http or https, not {parsed.scheme or 'relative'}")
    if not parsed.host:
        raise UnsafeURLError("webhook URL has no host")
    return parsed


def check_url(url: str | httpx.URL, allow: AllowList, resolver: Resolver = system_resolver) -> Target:
    """Resolve a webhook URL's host and check every address it resolves to.

    Args:
        url: the webhook URL.
        allow: what ``RANKWATCH_WEBHOOK_ALLOW`` permits despite the guard.
        resolver: host, port -> addresses (default: the system's resolver).

    Returns:
        The target, pinned to the first address (all were checked).

    Raises:
        UnsafeURLError: the URL is malformed, its host does not resolve, or any of its addresses is refused.
    """
    parsed = url if isinstance(url, httpx.URL) else parse_url(url)
    host = parsed.host
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        literal: IPAddress | None = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        literal = None
    if literal is not None:
        addresses = [str(literal)]
    else:
        try:
            addresses = resolver(host, port)
        except (OSError, UnicodeError) as exc:
            raise UnsafeURLError(f"webhook host {host!r} does not resolve: {exc}") from None
        if not addresses:
            raise UnsafeURLError(f"webhook host {host!r} resolves to no address")
    if not allow.allows_host(host):
        for a in addresses:
            ip = ipaddress.ip_address(a)
            reason = blocked_reason(ip)
            if reason is not None and not allow.allows_address(ip):
                where = f"{host!r} resolves to {ip}" if literal is None else f"{ip}"
                raise UnsafeURLError(
                    f"webhook URL refused: {where} is a {reason} address; "
                    f"allow it with {ALLOW_ENV} (a host name or a network such as {_suggest(ip)})"
                )
    return Target(url=parsed, host=host, port=port, address=addresses[0])


def _suggest(ip: IPAddress) -> str:
    return f"{ip}/32" if ip.version == 4 else f"{ip}/128"
