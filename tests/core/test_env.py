"""Parsing the ranks' one variable."""

from __future__ import annotations

import pytest

from rankwatch.env import DEFAULT_URL, parse_collector_url
from rankwatch.errors import ConfigError


def test_switches_and_urls() -> None:
    assert parse_collector_url(None) is None
    assert parse_collector_url("0") is None and parse_collector_url("off") is None
    assert parse_collector_url("1").base == DEFAULT_URL  # type: ignore[union-attr]
    u = parse_collector_url("http://tok3n@collector:7433/")
    assert u is not None and u.base == "http://collector:7433" and u.token == "tok3n"
    assert "tok3n" not in repr(u)
    assert parse_collector_url("collector:9000").base == "http://collector:9000"  # type: ignore[union-attr]
    assert parse_collector_url("https://a%40b@h/prefix").token == "a@b"  # type: ignore[union-attr]


def test_bad_scheme() -> None:
    with pytest.raises(ConfigError):
        parse_collector_url("ftp://host")
