"""Access: every route of the app is protected as the rule says, tokens rotate, TLS serves.

The rule: ``GET`` needs ``read`` (an admin token also reads), every change needs ``admin``,
``POST /ingest`` needs ``ingest``; only ``/healthz`` and the API's own description (``/openapi.json``
and the docs pages built from it) are open. The walker below finds every route the app has —
included routers and mounted apps too — so a route added without protection fails this test.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from starlette.routing import Mount, Route, WebSocketRoute
from support import clean_env, free_port

from rankwatch.api.app import create_app
from rankwatch.api.deps import ReadDep
from rankwatch.collector.settings import Settings

TOKENS = {"ingest": "tok-ingest-1", "read": "tok-read-1", "admin": "tok-admin-1"}
OPEN = {
    ("GET", "/healthz"),
    ("GET", "/openapi.json"),
    ("GET", "/docs"),
    ("GET", "/docs/oauth2-redirect"),
    ("GET", "/redoc"),
}
LOWER = {"read": "ingest", "admin": "read", "ingest": "read"}  # a token that must not be enough


def endpoints(routes: Any, prefix: str = "") -> list[tuple[str, str]]:
    """(method, path) of every route; a mounted app without routes of its own is probed at its root."""
    out: list[tuple[str, str]] = []
    for r in routes:
        if isinstance(r, Mount):
            inner = getattr(r.app, "routes", None)
            out += endpoints(inner, prefix + r.path) if inner else [("GET", prefix + r.path + "/")]
        elif hasattr(r, "original_router"):  # FastAPI keeps an included router as one entry
            out += endpoints(r.original_router.routes, prefix + r.include_context.prefix)
        elif isinstance(r, WebSocketRoute):
            raise AssertionError(f"websocket route {r.path}: teach this test how to check its access")
        elif isinstance(r, Route) or hasattr(r, "methods"):
            out += [(m, prefix + r.path) for m in sorted(set(r.methods or ()) - {"HEAD"})]
        else:
            raise AssertionError(f"route {r!r} of unknown type {type(r).__name__}: teach this test about it")
    return out


def expected_scope(method: str, path: str) -> str:
    if path == "/ingest":
        return "ingest"
    return "read" if method == "GET" else "admin"


def problems(client: TestClient, app: FastAPI) -> list[str]:
    """Every way a route breaks the access rule (an empty list: all protected as they should be)."""
    found: list[str] = []
    for method, template in endpoints(app.routes):
        path = re.sub(r"\{[^}]+\}", "1", template)
        if (method, template) in OPEN:
            if client.request(method, path).status_code != 200:
                found.append(f"{method} {template} should be open")
            continue
        need = expected_scope(method, template)
        r = client.request(method, path)
        if r.status_code != 401 or need not in r.json().get("detail", ""):
            found.append(f"{method} {template} without a token answered {r.status_code}, not 401 naming {need!r}")
        r = client.request(method, path, headers={"Authorization": f"Bearer {TOKENS[LOWER[need]]}"})
        if r.status_code != 403 or f"needs {need!r}" not in r.text:
            found.append(f"{method} {template} with a {LOWER[need]} token answered {r.status_code}, not 403")
        allowed = ["admin", "read"] if need == "read" else [need]
        for scope in allowed:
            r = client.request(method, path, headers={"Authorization": f"Bearer {TOKENS[scope]}"})
            if r.status_code in (401, 403):
                found.append(f"{method} {template} refused a {scope} token: {r.status_code}")
    return found


def _settings(tmp: Path, **kw: Any) -> Settings:
    return Settings(
        data_dir=tmp,
        ingest_tokens=[TOKENS["ingest"]],
        read_tokens=[TOKENS["read"]],
        admin_tokens=[TOKENS["admin"]],
        **kw,
    )


@pytest.fixture
def app_client(tmp_path: Path) -> Iterator[tuple[FastAPI, TestClient]]:
    app = create_app(_settings(tmp_path))
    with TestClient(app) as c:
        yield app, c


def test_every_route_is_protected_with_the_right_scope(app_client: tuple[FastAPI, TestClient], caplog: Any) -> None:
    caplog.set_level(logging.DEBUG)
    app, client = app_client
    found = endpoints(app.routes)
    # the walker sees the routes this test is about (a walker that saw nothing would pass anything)
    for must in [
        ("POST", "/ingest"),
        ("GET", "/suspects"),
        ("POST", "/webhooks"),
        ("DELETE", "/webhooks/{webhook_id}"),
    ]:
        assert must in found
    assert ("POST", "/webhooks/{webhook_id}/deliveries/{delivery_id}/retry") in found
    assert len(found) >= 20
    assert problems(client, app) == []
    assert caplog.records and not any(t in caplog.text for t in TOKENS.values())  # tokens are never logged


def test_the_walker_catches_an_unprotected_route_and_mount(tmp_path: Path) -> None:
    app = create_app(_settings(tmp_path))

    @app.get("/leak")
    def leak() -> dict[str, str]:
        return {"secret": "everything"}

    @app.post("/reads-only")
    def change_with_read(_: ReadDep) -> dict[str, str]:
        return {}

    async def metrics(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"rankwatch_up 1\n"})

    app.mount("/metrics", metrics)
    with TestClient(app) as client:
        found = problems(client, app)
    assert any(p.startswith("GET /leak without a token answered 200") for p in found), found
    assert any(p.startswith("POST /reads-only with a read token answered 200") for p in found), found
    assert any(p.startswith("GET /metrics/ without a token answered 200") for p in found), found


def test_without_tokens_everything_is_open(tmp_path: Path) -> None:
    with TestClient(create_app(Settings(data_dir=tmp_path))) as c:
        assert c.get("/jobs").status_code == 200
        assert c.get("/webhooks").status_code == 200
        assert c.post("/webhooks", json={"url": "ftp://x"}).status_code == 422  # validated, not refused


def test_serve_refuses_a_public_address_without_tokens(tmp_path: Path, monkeypatch: Any, capsys: Any) -> None:
    from rankwatch.cli import main

    for k in list(os.environ):
        if k.startswith("RANKWATCH"):
            monkeypatch.delenv(k)
    assert main(["serve", "--host", "0.0.0.0", "--data-dir", str(tmp_path)]) == 2
    assert "refusing to bind 0.0.0.0" in capsys.readouterr().err


def test_tokens_file_rotates_without_a_restart(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("admin old-admin-token\n")
    app = create_app(Settings(data_dir=tmp_path, tokens_file=tokens))
    with TestClient(app) as c:
        assert c.get("/webhooks", headers={"Authorization": "Bearer old-admin-token"}).status_code == 200
        tokens.write_text("admin new-admin-token\nread reader-token\n")
        os.utime(tokens, ns=(time.time_ns(), time.time_ns() + 10**9))  # a new mtime even on coarse clocks
        assert c.get("/webhooks", headers={"Authorization": "Bearer old-admin-token"}).status_code == 401
        assert c.get("/webhooks", headers={"Authorization": "Bearer new-admin-token"}).status_code == 200
        r = c.post("/webhooks", json={}, headers={"Authorization": "Bearer reader-token"})
        assert (
            r.status_code == 403 and r.json()["detail"] == "this token has the 'read' scope; this route needs 'admin'"
        )


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    import datetime as dt
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rankwatch-test")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    certfile, keyfile = tmp / "cert.pem", tmp / "key.pem"
    certfile.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    keyfile.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return certfile, keyfile


def test_serve_speaks_tls_with_certfile_and_keyfile(tmp_path: Path) -> None:
    import ssl

    certfile, keyfile = _self_signed(tmp_path)
    trust = ssl.create_default_context(cafile=str(certfile))
    port = free_port()
    cmd = [
        str(Path(sys.executable).parent / "rankwatch"),
        "serve",
        "--port",
        str(port),
        "--data-dir",
        str(tmp_path / "data"),
        "--certfile",
        str(certfile),
        "--keyfile",
        str(keyfile),
        "--read-tokens",
        "tls-reader",
    ]
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=clean_env(), stdout=out, stderr=subprocess.STDOUT)
    try:
        url = f"https://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                r = httpx.get(url + "/healthz", verify=trust, timeout=2)
                break
            except httpx.ConnectError:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
        assert r.status_code == 200 and r.json()["ok"] is True
        assert httpx.get(url + "/jobs", verify=trust, headers={"Authorization": "Bearer tls-reader"}).json() == []
        assert "serving on https://" in log.read_text()
        with pytest.raises(httpx.HTTPError):  # plain HTTP is not served on that port
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).raise_for_status()
    finally:
        proc.terminate()
        proc.wait(timeout=20)
