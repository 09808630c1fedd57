"""Fixtures over ``support``: a real service per test, and a torchrun runner in the test's tmp dir."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import Run, Service, start_service, torchrun


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    svc = start_service(tmp_path)
    yield svc
    svc.stop()


@pytest.fixture
def run_torchrun(tmp_path: Path) -> Any:
    def run(script: str | Path, *args: str, **kw: Any) -> Run:
        return torchrun(tmp_path, script, *args, **kw)

    return run
