"""The one ``Recorder`` per training process: identity, the record ring, the groups, the endings.

It owns everything that is per process rather than per group, and is the only object the
process-group layer talks to. The shipper thread reads it; nothing here does I/O on the
training thread.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

from rankwatch.hooks.config import HooksConfig
from rankwatch.hooks.identity import job_from_env, make_incarnation, node_name, process_meta
from rankwatch.hooks.inject import Injector, InjectRule, parse_inject
from rankwatch.hooks.ring import OpRing

__all__ = ["Recorder"]

logger = logging.getLogger(__name__)


class Recorder:
    """Per-process state of the hooks."""

    def __init__(self, config: HooksConfig, *, transport: Any = None, start_threads: bool = True) -> None:
        self.config = config
        self.ring = OpRing(config.ring_records)
        self.groups: list[Any] = []  # GroupState, in creation order; index == gidx
        self._names: dict[str, int] = {}
        self._lock = threading.Lock()
        self.node = node_name()
        self.restart, self.incarnation = make_incarnation()
        self.meta = process_meta()
        self.job: str | None = job_from_env()
        self.rank: int | None = None
        self.world: int | None = None
        self.state = "running"
        self.end_reason: str | None = None
        self.t0 = time.monotonic()
        self.errors = 0
        self.abandoned = 0
        self._drops = 0
        self.rules: list[InjectRule] = []
        if config.inject:
            try:
                self.rules = parse_inject(config.inject)
            except Exception as exc:  # a bad spec must not break training either
                logger.warning("rankwatch: ignoring RANKWATCH_INJECT: %s", exc)
        self._transport = transport
        self._start_threads = start_threads
        self.shipper: Any = None
        self._poller: Any = None
        self._ended = threading.Lock()
        self._final_sent = False
        self._final_done = threading.Event()
        self.restart_callbacks: list[Callable[[], Any]] = []
        # rankwatch's threads call into torch (work queries, group sizes, the store, Flight
        # Recorder dumps) only inside ``torch_section``, and not at all once ``halt`` has run at
        # interpreter exit: a daemon thread that is inside a pybind call which released the GIL when
        # the interpreter finalizes is ended by pthread_exit as it takes the GIL back, and that
        # unwinding through pybind's noexcept destructor aborts the process
        # ("terminate called without an active exception")
        self._torch_lock = threading.RLock()
        self.halted = False

    # -- groups -----------------------------------------------------------------------------------
    def add_group(self, pg: Any) -> Any:
        from rankwatch.hooks.process_group import GroupState

        with self._lock:
            name = str(pg.group_name)
            epoch = self._names.get(name, -1) + 1
            self._names[name] = epoch
            gidx = len(self.groups)
            desc = str(pg.group_desc)
            real = getattr(pg, "_rw_real", pg)  # the wrapper's own backend name need not say "nccl"
            backend = _backend_name(real)
            st = GroupState(
                self,
                gidx,
                pg,
                name,
                desc,
                epoch,
                self._injector(name, desc),
                cuda_default=backend in ("nccl", "xccl"),
            )
            self.groups.append(st)
        if st.cuda_default:
            _enable_timing(real)
        if desc == "default_pg":
            self._on_world(pg)
        self._ensure_started()
        return st

    def stamp_completed(self) -> None:
        """Stamp the CUDA ops that completed since the poller last looked (it sleeps up to 20 ms).

        Called before a final batch and before a group is retired: on a real NCCL job the ops of
        the last steps, synchronised just before ``destroy_process_group``, were otherwise lost.
        """
        poller = self._poller
        if poller is None:
            return
        try:
            with self.torch_section() as allowed:
                if allowed:
                    poller.poll_once()
        except Exception:
            logger.debug("rankwatch: could not stamp completed CUDA ops", exc_info=True)

    def retire(self, st: Any) -> None:
        """A group that was destroyed or replaced: its unfinished ops will never complete."""
        self.stamp_completed()
        st.retired = True
        self.abandoned += len(st.inflight) + (1 if st.current is not None else 0)
        st.inflight.clear()
        st.current = None

    def drops(self) -> int:
        """Records the ring lost to overflow: completed ops that were neither drained nor are waiting."""
        completed = -self.abandoned
        for st in list(self.groups):
            entered = st.seq + sum(st.p2p_seq.values())
            completed += entered - len(st.inflight) - (1 if st.current is not None else 0)
        self._drops = max(self._drops, completed - self.ring.drained - len(self.ring))
        return self._drops

    def set_identity(self, rank: int, world: int) -> None:
        """Rank and world from a launcher torch does not know about (torchft replica groups)."""
        import torch.distributed.distributed_c10d as c10d

        if c10d._world.default_pg is None or self.world == 1:
            self.rank = rank
            self.world = max(world, rank + 1)

    def _injector(self, name: str, desc: str) -> Injector | None:
        if not self.rules:
            return None
        rank = self.rank if self.rank is not None else _env_int("RANK", -1)
        return Injector.for_group(self.rules, rank, self.node, name, desc == "default_pg", self.t0)

    def _on_world(self, pg: Any) -> None:
        self.rank = int(pg.rank())
        self.world = int(pg.size())
        if self.state == "goodbye":
            self.state = "running"
            self._final_sent = False
            self._final_done.clear()

    def world_store(self) -> Any:
        """The default group's store, for sharing a job id made by rank 0."""
        import torch.distributed.distributed_c10d as c10d

        pg = c10d._world.default_pg
        if pg is None:
            return None
        return c10d._world.pg_map[pg][1]

    def cuda_poller(self) -> Any:
        with self._lock:
            if self._poller is None:
                from rankwatch.hooks.cuda import CudaPoller

                self._poller = CudaPoller(self)
                if self._start_threads:
                    self._poller.start()
            return self._poller

    # -- threads and endings ----------------------------------------------------------------------
    def _ensure_started(self) -> None:
        if self.shipper is not None:
            return
        from rankwatch.hooks.shipper import Shipper

        self.shipper = Shipper(self, transport=self._transport)
        if not self._start_threads:
            return
        self.shipper.start()
        atexit.register(self._at_exit)
        self._install_excepthook()
        self._install_sigterm()

    def _at_exit(self) -> None:
        if self.state == "running":
            self.state = "goodbye"
            self.end_reason = self.end_reason or "interpreter exit"
        self.final_batch()
        self.halt()

    @contextlib.contextmanager
    def torch_section(self) -> Iterator[bool]:
        """Yields whether a rankwatch thread may call into torch now; ``halt`` waits for it meanwhile."""
        with self._torch_lock:
            yield not self.halted

    def halt(self, timeout: float = 2.0) -> None:
        """Keep rankwatch's threads out of torch from now on (the interpreter is about to finalize).

        Waits for a thread inside a ``torch_section`` to leave it, at most ``timeout`` seconds (a
        store call to a launcher that is gone can block for longer; exit is not delayed for it).
        """
        got = self._torch_lock.acquire(timeout=timeout)
        self.halted = True
        if got:
            self._torch_lock.release()

    def goodbye(self, reason: str) -> None:
        """The job ended its process group normally: not dead, finished."""
        if self.state == "running":
            self.state = "goodbye"
            self.end_reason = reason
        self.final_batch()

    def final_batch(self, timeout: float | None = None) -> None:
        """Ship what is left and the state, once per ending, with a short timeout."""
        shipper = self.shipper
        if shipper is None:
            return
        limit = timeout if timeout is not None else min(2.0, self.config.timeout_s)
        with self._ended:
            first = not self._final_sent
            self._final_sent = True
        if not first:  # another thread is sending it: wait for that, briefly
            self._final_done.wait(limit + 0.5)
            return
        self.stamp_completed()
        try:
            shipper.flush(final=True, timeout=limit)
        except Exception:
            logger.debug("rankwatch: final batch failed", exc_info=True)
        finally:
            self._final_done.set()

    def _install_excepthook(self) -> None:
        previous = sys.excepthook

        def hook(exc_type: Any, exc: Any, tb: Any) -> None:
            try:
                if exc_type is not KeyboardInterrupt and self.state == "running":
                    self.state = "crashed"
                    self.end_reason = "".join(traceback.format_exception_only(exc_type, exc)).strip()[:2000]
            except Exception:
                pass
            previous(exc_type, exc, tb)

        sys.excepthook = hook

    def _install_sigterm(self) -> None:
        """Send a last batch on SIGTERM, even while the training thread is stuck in C++.

        Python runs signal handlers only on the main thread between bytecodes, so a rank blocked
        in a collective would never say it was terminated. The wakeup fd is written by the C
        handler at once; a thread reading it ships the last batch, then, if the previous
        disposition was the default, terminates the process as the default would have.
        """
        if threading.current_thread() is not threading.main_thread():
            return
        try:
            previous = signal.getsignal(signal.SIGTERM)
        except (ValueError, OSError):
            return
        if previous is signal.SIG_IGN:
            return

        def on_sigterm(signum: int, frame: Any) -> None:
            self._terminating(signum)
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
            if callable(previous):
                previous(signum, frame)
            else:
                os.kill(os.getpid(), signum)

        try:
            signal.signal(signal.SIGTERM, on_sigterm)
        except (ValueError, OSError):
            return
        try:
            r, w = socket.socketpair()
            w.setblocking(False)
            old_fd = signal.set_wakeup_fd(w.fileno(), warn_on_full_buffer=False)
            if old_fd != -1:  # someone (asyncio) owns the wakeup fd: leave it to them
                signal.set_wakeup_fd(old_fd)
                r.close()
                w.close()
                return
        except (ValueError, OSError):
            return
        self._wakeup = (r, w)
        default = previous in (signal.SIG_DFL, None)
        threading.Thread(target=self._watch_signals, args=(r, default), name="rankwatch-signals", daemon=True).start()

    def _watch_signals(self, r: socket.socket, default: bool) -> None:
        while True:
            try:
                data = r.recv(64)
            except OSError:
                return
            if not data:
                return
            if signal.SIGTERM in data:
                self._terminating(signal.SIGTERM)
                if default:
                    time.sleep(0.2)  # let the main thread act first if it can
                    _default_action(signal.SIGTERM)

    def _terminating(self, signum: int) -> None:
        if self.state == "running":
            self.state = "terminating"
            self.end_reason = f"signal {signal.Signals(signum).name}"
        self.final_batch(timeout=1.0)

    # -- remediation hooks ------------------------------------------------------------------------
    def run_restart_callbacks(self) -> None:
        for fn in list(self.restart_callbacks):
            try:
                fn()
            except Exception:
                logger.warning("rankwatch: on_restart callback failed", exc_info=True)


def _enable_timing(real: Any) -> None:
    """Turn on c10d's per-collective CUDA events (``TORCH_NCCL_ENABLE_TIMING``) on the real group,
    whose backends the wrapper shares (on torch 2.11 with NCCL the works of async ops then report
    their GPU duration; the backend object itself has no such method in Python)."""
    try:
        real._enable_collectives_timing()
    except Exception:
        logger.debug("rankwatch: could not enable collective timing on %r", real, exc_info=True)


def _backend_name(pg: Any) -> str:
    try:
        return str(pg._get_backend_name()).lower()
    except Exception:
        return "unknown"


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def _default_action(signum: int) -> None:
    """Terminate as the default disposition would, from a thread that is not the main one."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.signal(int(signum), ctypes.c_void_p(0))  # SIG_DFL
        os.kill(os.getpid(), signum)
    except Exception:
        os._exit(128 + int(signum))
