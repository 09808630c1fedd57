"""Let gloo's worker threads finish with the last op before the interpreter exits.

torch 2.13's gloo worker thread destroys a finished op's record a moment after the op completes,
and that takes the GIL twice: for the op's tensors and for the thread-local state it captured
(which holds a Python object). If the main thread has begun interpreter shutdown by then, the
worker cannot take it, its thread exits through a noexcept destructor and the process dies with
"terminate called without an active exception" (SIGABRT) although the script finished
(docs/decisions.md, *Gloo jobs can abort at exit*; ``bench/gloo_exit_race.py`` measures it).
"""

import time

import torch


def let_go(*tensors: torch.Tensor, timeout: float = 2.0, settle: float = 0.05) -> None:
    """Wait until nothing but Python holds ``tensors`` (at most ``timeout`` s), then ``settle`` s more.

    Once the tensors are free the worker is inside the op's destructor, about to drop the
    thread-local state; sleeping releases the GIL so it can.
    """
    deadline = time.monotonic() + timeout
    while any(t._use_count() > 1 for t in tensors) and time.monotonic() < deadline:
        time.sleep(0.001)
    time.sleep(settle)
