"""A small helper to checkpoint with ``torch.distributed.checkpoint`` and resume from the latest.

Restarting a job from checkpoint is the training script's business; this is the few lines every
script needs, so that a restart rankwatch triggers (or any restart) loses little work::

    from rankwatch.hooks import checkpoint, on_restart

    state = {"model": model.state_dict(), "optim": opt.state_dict(), "step": torch.tensor(0)}
    step = checkpoint.load_latest(state, "/ckpt")          # 0 when there is none yet
    model.load_state_dict(state["model"]); opt.load_state_dict(state["optim"])

    on_restart(lambda: checkpoint.save(state_fn(), "/ckpt", current_step))   # before a commanded exit
    for step in range(step + 1, total + 1):
        ...
        if step % 50 == 0:
            checkpoint.save(state_fn(), "/ckpt", step)

Checkpoints are directories ``step-<n>`` written by every rank (DCP is collective) and committed by
rank 0 writing ``step-<n>/.done`` last, so a half-written checkpoint is never resumed from. Saved
state reshards on load, so a job that comes back with fewer ranks resumes too.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

__all__ = ["latest", "load_latest", "save"]

_STEP = re.compile(r"^step-(\d+)$")


def latest(root: str | os.PathLike[str]) -> tuple[int, Path] | None:
    """The newest complete checkpoint under ``root``: (step, directory), or None."""
    best: tuple[int, Path] | None = None
    base = Path(root)
    if not base.is_dir():
        return None
    for d in base.iterdir():
        m = _STEP.match(d.name)
        if m and (d / ".done").exists():
            step = int(m.group(1))
            if best is None or step > best[0]:
                best = (step, d)
    return best


def save(state: dict[str, Any], root: str | os.PathLike[str], step: int) -> Path:
    """Save ``state`` (a state dict) as checkpoint ``step``; collective: every rank calls it."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    path = Path(root) / f"step-{step}"
    path.mkdir(parents=True, exist_ok=True)
    dcp.save(state, checkpoint_id=str(path))
    if dist.is_initialized():
        dist.barrier()
    if not dist.is_initialized() or dist.get_rank() == 0:
        (path / ".done").write_text(str(step))
    if dist.is_initialized():
        dist.barrier()
    return path


def load_latest(state: dict[str, Any], root: str | os.PathLike[str]) -> int:
    """Load the newest complete checkpoint into ``state`` in place; returns its step (0 if none)."""
    import torch.distributed.checkpoint as dcp

    found = latest(root)
    if found is None:
        return 0
    step, path = found
    dcp.load(state, checkpoint_id=str(path))
    return step
