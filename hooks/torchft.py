"""Instrumenting torchft's own process groups (its Manager's all-reduce between replica groups).

torchft builds a fresh c10d group on every quorum change inside
``ProcessGroupWrapper.configure``, outside ``torch.distributed``'s registries. rankwatch wraps
that group as soon as torchft creates it, names it ``torchft:q<quorum>:g<group rank>`` (the same
on every replica group in the quorum), records its members as torchft's global ranks, and retires
the previous quorum's group. The replica id (with torchft's uuid) is reported, so the torchft
actuator can kill that replica group through the lighthouse.
"""

from __future__ import annotations

import functools
import logging
import os
from types import ModuleType
from typing import Any

__all__ = ["watch_for_torchft"]

logger = logging.getLogger(__name__)


def watch_for_torchft() -> None:
    from rankwatch.hooks._imports import after_import

    after_import("torchft.process_group", _patch)
    after_import("torchft.manager", _patch_manager)


def _patch_manager(module: ModuleType) -> None:
    """Learn the replica id torchft's lighthouse knows (with the uuid torchft appends)."""
    manager_cls = getattr(module, "Manager", None)
    if manager_cls is None or getattr(manager_cls.__init__, "_rankwatch", False):
        return
    original = manager_cls.__init__
    key = getattr(module, "REPLICA_ID_KEY", "replica_id")

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        try:
            from rankwatch.hooks import installed

            rec = installed()
            if rec is not None:
                full = self._store.get(key)
                rec.meta["torchft_replica_id"] = full.decode() if isinstance(full, bytes) else str(full)
        except Exception:
            logger.debug("rankwatch: could not read torchft's replica id", exc_info=True)

    __init__._rankwatch = True  # type: ignore[attr-defined]
    manager_cls.__init__ = __init__


def _patch(module: ModuleType) -> None:
    wrapper_cls = getattr(module, "ProcessGroupWrapper", None)
    if wrapper_cls is None or getattr(wrapper_cls.configure, "_rankwatch", False):
        return
    original = wrapper_cls.configure

    @functools.wraps(original)
    def configure(
        self: Any, store_addr: str, replica_id: str, rank: int, world_size: int, *args: Any, **kwargs: Any
    ) -> Any:
        old = getattr(self, "_pg", None)
        result = original(self, store_addr, replica_id, rank, world_size, *args, **kwargs)
        try:
            _after_configure(self, old, replica_id, rank, world_size)
        except Exception:
            logger.debug("rankwatch: could not instrument a torchft group", exc_info=True)
        return result

    configure._rankwatch = True  # type: ignore[attr-defined]
    wrapper_cls.configure = configure


def _after_configure(wrapper: Any, old: Any, replica_id: str, rank: int, world_size: int) -> None:
    from torch._C._distributed_c10d import ProcessGroup as RealPG

    from rankwatch.hooks import installed
    from rankwatch.hooks.process_group import InstrumentedProcessGroup, wrap

    rec = installed()
    pg = getattr(wrapper, "_pg", None)
    if rec is None or pg is None or type(pg) is not RealPG:
        return  # nested torchft wrappers: the innermost one holds the real group
    if type(old) is InstrumentedProcessGroup and old._rw is not None:
        rec.retire(old._rw)
    quorum = getattr(wrapper, "_quorum_id", None)
    group_rank = getattr(wrapper, "_group_rank", None)
    group_world = getattr(wrapper, "_group_world_size", None)
    members = getattr(wrapper, "_global_ranks", None)
    name = f"torchft:q{quorum if quorum is not None else 0}:g{group_rank if group_rank is not None else 0}"
    RealPG._set_group_name(pg, name)  # type: ignore[arg-type]
    RealPG._set_group_desc(pg, "torchft")
    new = wrap(pg)
    if type(new) is not InstrumentedProcessGroup or new._rw is None:
        return
    if members and len(members) == world_size:
        new._rw.members = list(members)
        my_rank = int(members[rank])
        try:
            replicas = int(os.environ.get("NUM_REPLICA_GROUPS", "0"))
        except ValueError:
            replicas = 0
        world = max(max(members) + 1, (replicas or 0) * (group_world or 1))
        rec.set_identity(my_rank, world)
    rec.meta.setdefault("torchft_replica_id", replica_id)
    wrapper._pg = new
