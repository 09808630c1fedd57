"""Whatever the collector does, the job completes with the same result.

Three misbehaving collectors, each a real socket server on loopback: nothing listening, one that
accepts and never answers, one that answers garbage. A job instrumented against each must exit
0 with results identical to an uninstrumented run of the same script (speed is measured in the
benchmarks, not here).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import SCRIPTS, clean_env, free_port, torchrun

pytestmark = pytest.mark.torchrun


class _Server:
    """A TCP server on loopback whose behaviour is a function of the accepted socket."""

    def __init__(self, handle: Any) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.handle = handle
        self.conns: list[socket.socket] = []
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            self.conns.append(conn)
            threading.Thread(target=self.handle, args=(conn,), daemon=True).start()

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()


def _hang(conn: socket.socket) -> None:
    time.sleep(3600)  # read nothing, answer nothing


def _garbage(conn: socket.socket) -> None:
    conn.settimeout(5)
    try:
        while conn.recv(65536):
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Length: 40\r\n\r\n\x00\xff{not json at all ]]]]\xfe\x01garbage!!"
                b"HTTP/1.1 500 zzz\r\n\r\n\x00\x00\x00"
            )
    except OSError:
        pass


def _junk(conn: socket.socket) -> None:
    conn.sendall(b"\x16\x03\x01 this is not HTTP \r\n\r\n" * 10)
    conn.close()


def _reference(tmp: Path) -> list[Any]:
    run = torchrun(tmp, SCRIPTS / "paths.py", "mixed", "out", nproc=2, env=clean_env())
    assert run.returncode == 0, run.output[-3000:]
    return [json.loads((run.outdir / f"result_rank{r}.json").read_text()) for r in (0, 1)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> list[Any]:
    return _reference(tmp_path_factory.mktemp("reference"))


@pytest.fixture(params=["absent", "hanging", "garbage-http", "not-http"])
def bad_collector(request: pytest.FixtureRequest) -> Iterator[tuple[str, _Server | None]]:
    if request.param == "absent":
        yield f"http://127.0.0.1:{free_port()}", None
        return
    handler = {"hanging": _hang, "garbage-http": _garbage, "not-http": _junk}[request.param]
    server = _Server(handler)
    yield f"http://127.0.0.1:{server.port}", server
    server.close()


def test_job_completes_with_the_same_result(
    bad_collector: tuple[str, _Server | None], reference: list[Any], tmp_path: Path
) -> None:
    url, server = bad_collector
    env = clean_env(RANKWATCH=url, RANKWATCH_FLUSH_S="0.2", RANKWATCH_JOB="fail-open")
    t0 = time.monotonic()
    run = torchrun(tmp_path, SCRIPTS / "paths.py", "mixed", "out", nproc=2, env=env, timeout=180)
    elapsed = time.monotonic() - t0
    assert run.returncode == 0, run.output[-3000:]
    got = [json.loads((run.outdir / f"result_rank{r}.json").read_text()) for r in (0, 1)]
    assert got == reference
    if server is not None:
        assert server.accepted >= 1  # the hooks really did try to talk to it
    assert "Traceback" not in run.output, run.output[-3000:]
    assert elapsed < 120
