"""Imported by the ``rankwatch-autoload.pth`` start-up file, only when ``RANKWATCH`` is set.

It installs the hooks as soon as ``torch.distributed.distributed_c10d`` has been imported (which
``import torch`` does), so the training script needs no change. It imports neither torch nor
anything heavy itself, and never raises.
"""

from __future__ import annotations

import os
from types import ModuleType

TARGET = "torch.distributed.distributed_c10d"


def _install(_module: ModuleType) -> None:
    from rankwatch.hooks import install

    install()


def activate() -> None:
    """Arrange for the hooks to be installed when torch.distributed is imported."""
    from rankwatch.env import COLLECTOR_URL_ENV, parse_collector_url

    if parse_collector_url(os.environ.get(COLLECTOR_URL_ENV)) is None:
        return
    from rankwatch.hooks._imports import after_import

    after_import(TARGET, _install)


try:
    activate()
except Exception:
    pass
