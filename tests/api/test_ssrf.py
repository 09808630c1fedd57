"""The SSRF guard: refused addresses, the allow-list, and the check at delivery time (DNS rebinding)."""

from __future__ import annotations

import ipaddress
import time
from typing import Any

import pytest
from paging_support import Finding

from rankwatch.api.ssrf import AllowList, blocked_reason, check_url
from rankwatch.errors import ConfigError, UnsafeURLError


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", "loopback"),
        ("127.8.9.10", "loopback"),
        ("::1", "loopback"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("192.168.1.1", "private"),
        ("fd00::1", "private"),
        ("169.254.169.254", "link-local"),  # cloud metadata
        ("fe80::1", "link-local"),
        ("100.64.0.1", "shared address space"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("::ffff:127.0.0.1", "loopback, embedded in ::ffff:7f00:1"),  # IPv4-mapped
        ("::ffff:10.0.0.1", "private, embedded in ::ffff:a00:1"),
        ("2002:7f00:1::", "loopback, embedded in 2002:7f00:1::"),  # 6to4
        ("64:ff9b::a00:1", "private, embedded in 64:ff9b::a00:1"),  # NAT64
        ("8.8.8.8", None),
        ("2606:4700:4700::1111", None),
        ("::ffff:8.8.8.8", None),
        ("64:ff9b::808:808", None),
    ],
)
def test_blocked_reason(address: str, reason: str | None) -> None:
    assert blocked_reason(ipaddress.ip_address(address)) == reason


def _resolver(table: dict[str, list[str]]) -> Any:
    def resolve(host: str, port: int) -> list[str]:
        if host not in table:
            raise OSError(f"[Errno -2] Name or service not known: {host}")
        return table[host]

    return resolve


def test_every_resolved_address_is_checked() -> None:
    table = {"mixed.example": ["8.8.8.8", "10.0.0.7"], "public.example": ["8.8.4.4"]}
    with pytest.raises(UnsafeURLError, match=r"'mixed.example' resolves to 10.0.0.7 is a private address"):
        check_url("https://mixed.example/hook", AllowList(), _resolver(table))
    t = check_url("https://public.example:8443/hook?x=1", AllowList(), _resolver(table))
    assert (t.address, t.host, t.port, t.host_header) == ("8.8.4.4", "public.example", 8443, "public.example:8443")
    assert str(t.pinned_url()) == "https://8.8.4.4:8443/hook?x=1"
    # the allow-list, by network or by host name
    assert check_url("https://mixed.example/", AllowList.parse(["10.0.0.0/8"]), _resolver(table)).address == "8.8.8.8"
    assert check_url("https://mixed.example/", AllowList.parse(["Mixed.Example."]), _resolver(table))
    with pytest.raises(UnsafeURLError, match="does not resolve"):
        check_url("https://nowhere.example/", AllowList(), _resolver(table))
    with pytest.raises(UnsafeURLError, match="http or https"):
        check_url("file:///etc/passwd", AllowList(), _resolver(table))
    with pytest.raises(ConfigError, match="not a valid network"):
        AllowList.parse(["10.0.0.0/33"])


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9/hook",
        "http://localhost:9/hook",  # a name that resolves to loopback
        "http://2130706433/hook",  # 127.0.0.1 spelled as a number
        "http://[::ffff:127.0.0.1]/hook",
        "http://[::1]/hook",
        "http://169.254.169.254/latest/meta-data",
        "http://10.1.2.3/hook",
        "http://0.0.0.0:7433/ingest",
    ],
)
def test_subscriptions_to_internal_addresses_are_refused(harness: Any, url: str) -> None:
    h = harness(webhook_allow=[])
    r = h.client.post("/webhooks", json={"url": url})
    assert r.status_code == 422, r.text
    assert "RANKWATCH_WEBHOOK_ALLOW" in r.json()["detail"]
    assert h.client.get("/webhooks").json() == []


def test_dns_rebinding_is_caught_at_delivery(harness: Any, receiver: Any) -> None:
    rx = receiver()
    table = {"hooks.example.test": ["93.184.216.34"]}  # public when the subscription is made
    h = harness(webhook_allow=[], resolver=_resolver(table))
    sub = h.subscribe(url=f"http://hooks.example.test:{rx.port}/hook")
    table["hooks.example.test"] = ["127.0.0.1"]  # ... and loopback by the time it is used
    h.open(Finding(key="straggler:3"))
    d = h.wait_deliveries(sub["id"], lambda ds: bool(ds) and ds[0]["attempts"] >= 1)[0]
    err = d["attempt_log"][0]["error"]
    assert "'hooks.example.test' resolves to 127.0.0.1 is a loopback address" in err
    time.sleep(0.2)
    assert rx.requests == []  # refused before any connection


def test_delivery_connects_to_the_address_it_checked(harness: Any, receiver: Any) -> None:
    rx = receiver()
    # a name only this resolver knows: the request can only arrive if the worker dialled the checked address
    table = {"hooks.example.test": ["127.0.0.1"]}
    h = harness(webhook_allow=["127.0.0.1/32"], resolver=_resolver(table))
    h.subscribe(url=f"http://hooks.example.test:{rx.port}/hook")
    h.open(Finding(key="straggler:3"))
    (req,) = rx.wait_for(1)
    assert req.headers["host"] == f"hooks.example.test:{rx.port}" and req.path == "/hook"


def test_the_allow_list_comes_from_the_variable_or_the_flag(monkeypatch: Any) -> None:
    import argparse

    from rankwatch.cli import _settings_from
    from rankwatch.collector.settings import Settings

    monkeypatch.setenv("RANKWATCH_WEBHOOK_ALLOW", "10.0.0.0/8, hooks.internal")
    assert Settings().webhook_allow == ["10.0.0.0/8", "hooks.internal"]
    allow = AllowList.parse(Settings().webhook_allow)
    assert allow.allows_host("HOOKS.internal") and allow.allows_address(ipaddress.ip_address("10.9.8.7"))
    assert _settings_from(argparse.Namespace(webhook_allow="192.168.0.0/16,")).webhook_allow == ["192.168.0.0/16"]
