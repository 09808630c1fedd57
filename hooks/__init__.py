"""rankwatch's hooks: run inside every training process and time every collective it issues.

Turned on by one environment variable, ``RANKWATCH=<collector URL>`` (or ``RANKWATCH=1`` for
``http://127.0.0.1:7433``): a start-up file installed with the package then instruments
``torch.distributed`` as soon as it is imported, with no change to the training script.
``install()`` does the same from code. Importing this package imports nothing heavy; torch is
imported only by ``install()``.

Public names:
    install      instrument this process (idempotent); returns the ``Recorder``
    installed    the process's ``Recorder``, or None
    on_restart   register a callback run before a collector-commanded exit (save a checkpoint)
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rankwatch.hooks.recorder import Recorder

__all__ = ["install", "installed", "on_restart"]

logger = logging.getLogger(__name__)
_lock = threading.RLock()
_recorder: list[Recorder | None] = [None]
_pending_callbacks: list[Callable[[], Any]] = []


def install(url: str | None = None, *, transport: Any = None, start_threads: bool = True) -> Recorder | None:
    """Instrument every process group this process creates from now on (and any it already has).

    Args:
        url: collector URL, token in the user-info (``http://TOKEN@host:7433``); default: the
            ``RANKWATCH`` variable, then ``http://127.0.0.1:7433``.
        transport: test seam, a callable ``(body, headers, timeout) -> (status, body)``.
        start_threads: False keeps the shipper from running (tests drive it by hand).

    Returns:
        The process's ``Recorder``, or None if instrumentation could not be installed (the
        reason is logged; training goes on uninstrumented).
    """
    with _lock:
        if _recorder[0] is not None:
            return _recorder[0]
        try:
            return _install(url, transport, start_threads)
        except Exception:
            logger.warning("rankwatch: could not install the hooks; training is not watched", exc_info=True)
            return None


def _install(url: str | None, transport: Any, start_threads: bool) -> Recorder:
    import dataclasses
    import os

    from rankwatch.env import COLLECTOR_URL_ENV, DEFAULT_URL, parse_collector_url
    from rankwatch.hooks.config import HooksConfig

    config = HooksConfig.from_env()
    if url is not None or config is None:
        parsed = parse_collector_url(url or os.environ.get(COLLECTOR_URL_ENV) or DEFAULT_URL)
        if parsed is None:
            parsed = parse_collector_url(DEFAULT_URL)
        assert parsed is not None
        config = dataclasses.replace(config, collector=parsed) if config else _default_config(parsed)

    from rankwatch.hooks import process_group
    from rankwatch.hooks.recorder import Recorder

    rec = Recorder(config, transport=transport, start_threads=start_threads)
    rec.restart_callbacks.extend(_pending_callbacks)
    process_group.patch(rec)
    _patch_destroy(rec)
    _recorder[0] = rec
    from rankwatch.hooks import torchft as _torchft

    _torchft.watch_for_torchft()
    return rec


def _default_config(parsed: Any) -> Any:
    from rankwatch.hooks.config import HooksConfig

    env = HooksConfig.from_env({"RANKWATCH": parsed.base})
    assert env is not None
    import dataclasses

    return dataclasses.replace(env, collector=parsed)


def _patch_destroy(rec: Recorder) -> None:
    import functools

    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    original = c10d.destroy_process_group
    if getattr(original, "_rankwatch", False):
        return

    @functools.wraps(original)
    def destroy_process_group(group: Any = None) -> Any:
        try:
            if group is None or group is c10d.GroupMember.WORLD:
                rec.goodbye("destroy_process_group")
        except Exception:
            pass
        return original(group)

    destroy_process_group._rankwatch = True  # type: ignore[attr-defined]
    c10d.destroy_process_group = destroy_process_group
    if getattr(dist, "destroy_process_group", None) is original:
        dist.destroy_process_group = destroy_process_group


def installed() -> Recorder | None:
    """The process's ``Recorder`` if the hooks are installed."""
    return _recorder[0]


def on_restart(fn: Callable[[], Any]) -> Callable[[], Any]:
    """Run ``fn`` before this rank exits on a collector's restart command (e.g. save a checkpoint).

    Usable as a decorator. When the command names an op (``at_seq`` of a group, as rankwatch's
    own restarts do), callbacks run on the training thread just before that op, at the same point
    on every rank, so ``fn`` may be collective (a DCP save); the op may be inside a step (e.g. DDP's
    gradient all-reduce), so save the last step the loop *finished*. A command without ``at_seq``
    runs them on a rankwatch thread, while the loop goes on; a rank that does not reach the op
    before the command's deadline (stuck) exits without running them.
    """
    with _lock:
        rec = _recorder[0]
        if rec is not None:
            rec.restart_callbacks.append(fn)
        else:
            _pending_callbacks.append(fn)
    return fn
