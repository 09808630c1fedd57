"""Run a callback right after a module is first imported, without importing it ourselves."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

__all__ = ["after_import"]

_callbacks: dict[str, list[Callable[[ModuleType], None]]] = {}
_lock = threading.Lock()


class _AfterImport(importlib.abc.MetaPathFinder):
    """Lets the real finder load a watched module, then runs its callbacks."""

    def find_spec(self, fullname: str, path: Any, target: ModuleType | None = None) -> Any:
        if fullname not in _callbacks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader, fullname)
                return spec
        return None


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: Any, name: str) -> None:
        self.inner = inner
        self.name = name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        with _lock:
            callbacks = _callbacks.pop(self.name, [])
            if not _callbacks:
                _remove()
        for cb in callbacks:
            try:
                cb(module)
            except Exception:  # never break the user's import
                pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


_finder = _AfterImport()


def _remove() -> None:
    try:
        sys.meta_path.remove(_finder)
    except ValueError:
        pass


def after_import(name: str, callback: Callable[[ModuleType], None]) -> None:
    """Call ``callback(module)`` once ``name`` is imported (now, if it already is)."""
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
        return
    with _lock:
        _callbacks.setdefault(name, []).append(callback)
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)
