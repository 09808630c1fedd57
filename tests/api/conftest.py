"""Fixtures for webhook tests: harnesses (the app with its worker) and receivers, closed after the test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from paging_support import Harness, Receiver, Reply


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Callable[..., Harness]]:
    made: list[Harness] = []

    def make(**kw: Any) -> Harness:
        h = Harness(tmp_path, **kw)
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()


@pytest.fixture
def receiver() -> Iterator[Callable[..., Receiver]]:
    made: list[Receiver] = []

    def make(script: list[Reply] | None = None, default: Reply | None = None) -> Receiver:
        r = Receiver(script, default)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()
