"""Instrumentation at the process-group level, where every path a collective takes meets.

``torch.distributed.*`` calls, DDP's C++ reducer, FSDP2, pipelining, functional collectives
(DTensor, torch.compile) and subgroups all end in a virtual method of a c10d ``ProcessGroup``.
rankwatch makes every group the job creates an ``InstrumentedProcessGroup``: a Python subclass
of c10d's ``ProcessGroup`` (so C++ callers reach its methods through pybind's trampoline) that
wraps the real group torch would have built and forwards each collective to it, timing it.

How it becomes the group everyone uses, without a change to the training script: every group
torch builds comes out of ``_new_process_group_helper`` (default group, ``new_group``, device
meshes) or ``split_group``. ``patch`` wraps those two so that, right after torch has built and
registered a group, the instrumented group takes its place in torch's registries (the maps in
``_world`` and the C++ name registry functional collectives resolve names through) and is
returned to the caller. Nothing takes DDP's single comm-hook slot.

The training thread pays, per op: two clock reads, a counter, a dict insert, the size of the
input, and a small ``Work`` wrapper whose ``wait()`` stamps completion. Async ops that are
completed through their future are stamped by a done-callback; NCCL ops are stamped from CUDA
events by a poller thread (``rankwatch.hooks.cuda``), never by synchronising.
"""

from __future__ import annotations

import functools
import logging
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed.distributed_c10d as c10d
from torch._C._distributed_c10d import ProcessGroup as _RealPG
from torch._C._distributed_c10d import Work as _RealWork

from rankwatch.hooks.cuda import stream_span
from rankwatch.wire import DTYPE_CODES, OpKind

if TYPE_CHECKING:
    from rankwatch.hooks.inject import Injector
    from rankwatch.hooks.recorder import Recorder

__all__ = ["GroupState", "InstrumentedProcessGroup", "TimedWork", "instrument", "patch", "unpatch", "wrap"]

logger = logging.getLogger(__name__)
_perf = time.perf_counter_ns

_DTYPE_CODE: dict[torch.dtype, int] = {}
for _name, _code in DTYPE_CODES.items():
    _dt = getattr(torch, _name, None)
    if isinstance(_dt, torch.dtype):
        _DTYPE_CODE[_dt] = _code

_Tensor = torch.Tensor


def _size(x: Any) -> tuple[int, int, bool]:
    """(bytes, dtype code, is_cuda) of a tensor, a list of tensors or a list of lists."""
    if isinstance(x, _Tensor):
        return x.nbytes, _DTYPE_CODE.get(x.dtype, 0), x.is_cuda
    n = 0
    code = 0
    cuda = False
    for t in x:
        if isinstance(t, _Tensor):
            if not n:
                code = _DTYPE_CODE.get(t.dtype, 0)
                cuda = t.is_cuda
            n += t.nbytes
        else:
            for u in t:
                if not n:
                    code = _DTYPE_CODE.get(u.dtype, 0)
                    cuda = u.is_cuda
                n += u.nbytes
    return n, code, cuda


class GroupState:
    """What rankwatch keeps per process group: counters, in-flight ops, where records go."""

    __slots__ = (
        "__weakref__",
        "append",
        "coalescing",
        "cuda_default",
        "current",
        "current_kind",
        "desc",
        "epoch",
        "gidx",
        "inflight",
        "inject",
        "inline",
        "last_enter_ns",
        "members",
        "name",
        "ops",
        "p2p_seq",
        "pg_ref",
        "poller",
        "recorder",
        "retired",
        "seq",
    )

    def __init__(
        self,
        recorder: Recorder,
        gidx: int,
        pg: _RealPG,
        name: str,
        desc: str,
        epoch: int,
        inject: Injector | None,
        cuda_default: bool,
    ) -> None:
        self.recorder = recorder
        self.gidx = gidx
        self.name = name
        self.desc = desc
        self.epoch = epoch
        self.pg_ref = weakref.ref(pg)
        self.seq = 0
        self.p2p_seq: dict[tuple[int, int], int] = {}
        self.ops = 0
        # op id -> [t_enter_ns, inner work or None, kind, dtype, peer, seq, nbytes, op id, gidx]
        self.inflight: dict[int, list[Any]] = {}
        self.append = recorder.ring.append
        self.inject = inject
        self.cuda_default = cuda_default
        self.poller: Any = None
        self.coalescing: list[int] | None = None
        self.last_enter_ns = 0
        self.members: list[int] | None = None  # global ranks, when torch's registry lacks them
        self.retired = False
        # the synchronous op in flight, timed inline: its t_enter_ns (or None) and kind; its
        # sequence number is ``seq``
        self.current: int | None = None
        self.current_kind = 0
        # ``inject`` is the group's 'before' hook: fault injection, or an exit planned at a sequence
        # number (see shipper.ExitPlan); both are called on the training thread before an op
        # synchronous ops may be timed inline: a CPU group, not inside a coalescing block
        self.inline = not cuda_default

    @property
    def key(self) -> str:
        """The group's id on the wire: its c10d name, plus a generation if the name was reused."""
        return self.name if self.epoch == 0 else f"{self.name}#{self.epoch}"

    def enter(self, kind: int, tensors: Any, peer: int) -> tuple[list[Any], bool]:
        """Open an op; returns (its in-flight entry, whether it runs on CUDA).

        The entry is ``[t_enter_ns, work, kind, dtype, peer, seq, nbytes, op id, group index]``;
        the work is filled in once the backend has returned it.
        """
        if tensors is None:
            nbytes, code, cuda = 0, 0, self.cuda_default
        elif type(tensors) is list and len(tensors) == 1 and type(tensors[0]) is _Tensor:
            t = tensors[0]
            nbytes, code, cuda = t.nbytes, _DTYPE_CODE.get(t.dtype, 0), t.is_cuda
        else:
            nbytes, code, cuda = _size(tensors)
        if kind == _SEND or kind == _RECV:
            key = (kind, peer)
            seq = self.p2p_seq[key] = self.p2p_seq.get(key, 0) + 1
        else:
            seq = self.seq = self.seq + 1
        op = self.ops = self.ops + 1
        t0 = self.last_enter_ns = _perf()
        entry = self.inflight[op] = [t0, None, kind, code, peer, seq, nbytes, op, self.gidx]
        return entry, cuda

    def track(self, entry: list[Any], cuda: bool, work: Any, span: Any = None) -> Any:
        """Attach completion timing to the work an op returned; returns what the caller gets.

        ``span``: events recorded before a synchronous CUDA call, for when it returns no work.
        """
        op = entry[7]
        if self.coalescing is not None:
            self.coalescing.append(op)
            return work
        if work is None:
            if span is not None:  # a synchronous NCCL op, enqueued on the caller's stream
                self._to_poller(op, span.close())
            else:
                finish(self, op, _perf())  # a backend that completed synchronously
            return work
        entry[1] = work
        if cuda:
            self._to_poller(op, work)
            return work
        return TimedWork(work, self, op)

    def _to_poller(self, op: int, work: Any) -> None:
        """Leave the op to the CUDA poller, which stamps it once ``work``'s events have fired."""
        if self.poller is None:
            self.poller = self.recorder.cuda_poller()
        self.poller.add(self, op, work)


def finish(st: GroupState, op: int, t_end: int, t_start: int | None = None) -> None:
    """Close an op exactly once, from whichever thread sees it complete first.

    The ring's record is a tuple of ints (which the garbage collector stops tracking):
    ``(t_enter, t_end, kind, dtype, peer, seq, nbytes, group index[, t_start])``; without
    ``t_start`` (CPU backends) the op started when it was entered.
    """
    e = st.inflight.pop(op, None)
    if e is None:
        return
    if t_start is None:
        st.append((e[0], t_end, e[2], e[3], e[4], e[5], e[6], e[8]))
    else:
        st.append((e[0], t_end, e[2], e[3], e[4], e[5], e[6], e[8], t_start))


def _finish_all(st: GroupState, ops: tuple[int, ...] | int, t_end: int) -> None:
    if isinstance(ops, int):
        finish(st, ops, t_end)
    else:
        for op in ops:
            finish(st, op, t_end)


class TimedWork(_RealWork):
    """The ``Work`` a CPU collective returns, which stamps completion when it is waited on.

    Everything is forwarded to the real work. C++ callers (DDP, functional collectives) reach
    ``wait`` and ``get_future`` through pybind's trampoline; the future gets a done-callback so
    ops completed through it are stamped too.
    """

    def __init__(self, inner: Any, st: GroupState, ops: tuple[int, ...] | int) -> None:
        _RealWork.__init__(self)
        self._rw_inner = inner
        self._rw_st = st
        self._rw_ops = ops
        self._rw_cb = False

    def wait(self, *args: Any, **kwargs: Any) -> bool:
        ok = self._rw_inner.wait(*args, **kwargs)
        try:
            _finish_all(self._rw_st, self._rw_ops, _perf())
        except Exception:  # never into training code
            pass
        return bool(ok)

    def get_future(self) -> Any:
        fut = self._rw_inner.get_future()
        if not self._rw_cb:
            self._rw_cb = True
            try:
                st, ops = self._rw_st, self._rw_ops
                fut.add_done_callback(lambda _f: _finish_all(st, ops, _perf()))
            except Exception:
                pass
        return fut

    def is_completed(self) -> bool:
        done = self._rw_inner.is_completed()
        if done:
            try:
                _finish_all(self._rw_st, self._rw_ops, _perf())
            except Exception:
                pass
        return bool(done)

    def synchronize(self) -> None:
        self._rw_inner.synchronize()

    def is_success(self) -> bool:
        return bool(self._rw_inner.is_success())

    def exception(self) -> Any:
        return self._rw_inner.exception()

    def source_rank(self) -> int:
        return int(self._rw_inner.source_rank())

    def _source_rank(self) -> int:
        return int(self._rw_inner._source_rank())

    def result(self) -> Any:
        return self._rw_inner.result()

    def get_future_result(self) -> Any:
        return self._rw_inner.get_future_result()

    def block_current_stream(self) -> None:
        self._rw_inner.block_current_stream()

    def _get_duration(self) -> float:
        return float(self._rw_inner._get_duration())

    def _get_op_type(self) -> Any:
        return self._rw_inner._get_op_type()

    def boxed(self) -> Any:
        return self._rw_inner.boxed()


_SEND = int(OpKind.SEND)
_RECV = int(OpKind.RECV)

# name -> (kind, index of the input tensors in args, where the peer/root comes from)
#   peer source: None (no peer), "opts" (opts.rootRank, args[-1]), or an int index into args
_OPS: dict[str, tuple[OpKind, int | None, str | int | None]] = {
    "allreduce": (OpKind.ALL_REDUCE, 0, None),
    "allreduce_coalesced": (OpKind.ALL_REDUCE_COALESCED, 0, None),
    "broadcast": (OpKind.BROADCAST, 0, "opts"),
    "reduce": (OpKind.REDUCE, 0, "opts"),
    "allgather": (OpKind.ALL_GATHER, 1, None),
    "allgather_coalesced": (OpKind.ALL_GATHER_COALESCED, 1, None),
    "all_gather_single": (OpKind.ALL_GATHER_INTO_TENSOR, 1, None),
    "_allgather_base": (OpKind.ALL_GATHER_INTO_TENSOR, 1, None),
    "all_gather_single_coalesced": (OpKind.ALL_GATHER_INTO_TENSOR_COALESCED, 1, None),
    "allgather_into_tensor_coalesced": (OpKind.ALL_GATHER_INTO_TENSOR_COALESCED, 1, None),
    "reduce_scatter": (OpKind.REDUCE_SCATTER, 1, None),
    "reduce_scatter_single": (OpKind.REDUCE_SCATTER_TENSOR, 1, None),
    "_reduce_scatter_base": (OpKind.REDUCE_SCATTER_TENSOR, 1, None),
    "reduce_scatter_single_coalesced": (OpKind.REDUCE_SCATTER_TENSOR_COALESCED, 1, None),
    "reduce_scatter_tensor_coalesced": (OpKind.REDUCE_SCATTER_TENSOR_COALESCED, 1, None),
    "alltoall": (OpKind.ALL_TO_ALL, 1, None),
    "all_to_all_single": (OpKind.ALL_TO_ALL_SINGLE, 1, None),
    "alltoall_base": (OpKind.ALL_TO_ALL_SINGLE, 1, None),
    "gather": (OpKind.GATHER, 1, "opts"),
    "scatter": (OpKind.SCATTER, 0, "opts"),
    "barrier": (OpKind.BARRIER, None, None),
    "send": (OpKind.SEND, 0, 1),
    "recv": (OpKind.RECV, 0, 1),
    "recv_anysource": (OpKind.RECV, 0, None),
}


def _peer(args: tuple[Any, ...], src: str | int | None) -> int:
    if src is None:
        return -1
    if src == "opts":
        opts = args[-1] if len(args) > 1 else None
        return int(getattr(opts, "rootRank", -1))
    assert isinstance(src, int)
    return int(args[src]) if len(args) > src else -1


# coalesced ops over a single tensor (what functional collectives issue) are named as the plain op
_SINGLE = {
    OpKind.ALL_REDUCE_COALESCED: OpKind.ALL_REDUCE,
    OpKind.ALL_GATHER_INTO_TENSOR_COALESCED: OpKind.ALL_GATHER_INTO_TENSOR,
    OpKind.REDUCE_SCATTER_TENSOR_COALESCED: OpKind.REDUCE_SCATTER_TENSOR,
}


def _make_op(name: str, kind: OpKind, tensors_at: int | None, peer_src: str | int | None) -> Callable[..., Any]:
    real_method = getattr(_RealPG, name)
    k = int(kind)
    single = int(_SINGLE.get(kind, kind))
    inline_ok = not kind.is_p2p  # p2p calls carry no options saying whether they are synchronous

    rooted = peer_src == "opts"

    def op(self: InstrumentedProcessGroup, *args: Any, _perf: Callable[[], int] = _perf, **kwargs: Any) -> Any:
        st = self._rw
        if st is None:
            return real_method(self._rw_real, *args, **kwargs)
        if st.inject is not None:
            st.inject.before(st.seq + 1)
        if inline_ok and st.inline and args and not kwargs and getattr(args[-1], "asyncOp", True) is False:
            # The common case, a synchronous call from torch.distributed on CPU: torch waits on the
            # work as soon as we return it, so wait here and time the op inline, without an
            # in-flight entry or a Work wrapper. ``current`` shows it in flight meanwhile.
            try:
                x = args[tensors_at] if tensors_at is not None else None
                if type(x) is list and len(x) == 1:
                    x = x[0]
                if type(x) is _Tensor:
                    nbytes, code = x.nbytes, _DTYPE_CODE.get(x.dtype, 0)
                    kind_now = single
                else:
                    nbytes, code, _ = _size(x) if x is not None else (0, 0, False)
                    kind_now = k
                peer = int(getattr(args[-1], "rootRank", -1)) if rooted else -1
                seq = st.seq = st.seq + 1
                st.current_kind = kind_now
                t0 = st.current = st.last_enter_ns = _perf()
            except Exception:
                return real_method(self._rw_real, *args, **kwargs)
            work = real_method(self._rw_real, *args)
            if work is not None:
                work.wait()
            t1 = _perf()
            st.current = None
            st.append((t0, t1, kind_now, code, peer, seq, nbytes, st.gidx))
            return work
        try:
            if tensors_at is None:
                tensors = None
            elif len(args) > tensors_at:
                tensors = args[tensors_at]
            else:
                tensors = next(iter(kwargs.values())) if kwargs else None
            kind_now = single if single != k and isinstance(tensors, list) and len(tensors) == 1 else k
            entry, cuda = st.enter(kind_now, tensors, _peer(args, peer_src))
            span = None
            if cuda and inline_ok and args and getattr(args[-1], "asyncOp", True) is False:
                span = stream_span()  # no work will come back to read the GPU time from
        except Exception:
            logger.debug("rankwatch: could not record %s", name, exc_info=True)
            return real_method(self._rw_real, *args, **kwargs)
        work = real_method(self._rw_real, *args, **kwargs)
        try:
            return st.track(entry, cuda, work, span)
        except Exception:
            logger.debug("rankwatch: could not track %s", name, exc_info=True)
            return work

    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"{real_method.__doc__ or name}\n\nTimed by rankwatch."
    return op


class InstrumentedProcessGroup(_RealPG):
    """A c10d ``ProcessGroup`` that forwards every op to the real group and times it."""

    _rw: GroupState | None
    _rw_real: _RealPG

    def __init__(self, real: _RealPG) -> None:
        _RealPG.__init__(self, real.rank(), real.size())  # type: ignore[call-arg]  # pybind overload
        self._rw_real = real
        self._rw = None

    @property  # type: ignore[misc]
    def bound_device_id(self) -> Any:
        return self._rw_real.bound_device_id

    @bound_device_id.setter
    def bound_device_id(self, device: Any) -> None:
        _RealPG.bound_device_id.__set__(self, device)  # type: ignore[attr-defined]
        self._rw_real.bound_device_id = device

    # -- what needs the real group's own C++ state ------------------------------------------------
    def get_group_store(self) -> Any:
        return self._rw_real.get_group_store()

    def split_group(self, *args: Any, **kwargs: Any) -> Any:
        split = self._rw_real.split_group(*args, **kwargs)
        return None if split is None else wrap(split)

    def merge_remote_group(self, *args: Any, **kwargs: Any) -> Any:
        merged = self._rw_real.merge_remote_group(*args, **kwargs)
        return None if merged is None else wrap(merged)

    def abort(self) -> None:
        self._rw_real.abort()

    def shutdown(self) -> None:
        self._rw_real.shutdown()

    def set_timeout(self, timeout: Any) -> None:
        self._rw_real.set_timeout(timeout)

    def _start_coalescing(self, device: Any) -> None:
        st = self._rw
        if st is not None:
            st.coalescing = []
            st.inline = False
        self._rw_real._start_coalescing(device)

    def _end_coalescing(self, device: Any) -> Any:
        st = self._rw
        ops = st.coalescing if st is not None else None
        if st is not None:
            st.coalescing = None
            st.inline = not st.cuda_default
        work = self._rw_real._end_coalescing(device)
        if st is None or not ops:
            return work
        try:
            if work is None:
                _finish_all(st, tuple(ops), _perf())
                return work
            if st.cuda_default:
                for op in ops:
                    entry = st.inflight.get(op)
                    if entry is not None:
                        st.track(entry, True, work)
                return work
            return TimedWork(work, st, tuple(ops))
        except Exception:
            return work

    # C++ (pybind trampoline) spellings of the coalescing hooks
    start_coalescing = _start_coalescing
    end_coalescing = _end_coalescing

    def __repr__(self) -> str:
        return f"<rankwatch InstrumentedProcessGroup name={self.group_name!r} of {self._rw_real!r}>"


for _name, (_kind, _at, _peer_src) in _OPS.items():
    if hasattr(_RealPG, _name):
        setattr(InstrumentedProcessGroup, _name, _make_op(_name, _kind, _at, _peer_src))


# ------------------------------------------------------------------------------------------------
# Making instrumented groups take the place of the ones torch builds.

_RECORDER: list[Recorder | None] = [None]
_ORIGINAL: dict[str, Any] = {}


def wrap(real: _RealPG) -> _RealPG:
    """An instrumented group standing for ``real``, a group torch has fully set up.

    It shares the real group's backends (so ``_get_backend`` and everything C++ asks of it agree)
    and its name; ops go to the real group. On any failure the real group is returned.
    """
    if type(real) is InstrumentedProcessGroup:
        return real
    try:
        pg = InstrumentedProcessGroup(real)
        btype = c10d.Backend.backend_type_map.get(str(real._get_backend_name()), _RealPG.BackendType.CUSTOM)
        try:
            _RealPG._set_default_backend(pg, btype)
        except Exception:
            pass
        for dev in real._device_types:
            device = torch.device(dev)
            _RealPG._register_backend(pg, device, btype, real._get_backend(device))
        if real.bound_device_id is not None:
            _RealPG.bound_device_id.__set__(pg, real.bound_device_id)  # type: ignore[attr-defined]
        _RealPG._set_group_name(pg, real.group_name)
        _RealPG._set_group_desc(pg, real.group_desc)
        rec = _RECORDER[0]
        if rec is not None:
            pg._rw = rec.add_group(pg)
        return pg
    except Exception:
        logger.debug("rankwatch: could not wrap group %r", real, exc_info=True)
        return real


def _swap(old: _RealPG, new: _RealPG) -> None:
    """Put ``new`` wherever torch's registries hold ``old``."""
    world = c10d._world
    mappings: list[dict[Any, Any]] = [
        world.pg_map,
        world.pg_names,
        world.pg_group_ranks,
        world.pg_backend_config,
        world.pg_to_tag,
        world.pg_coalesce_state,
    ]
    for mapping in mappings:
        if old in mapping:
            mapping[new] = mapping.pop(old)
    for pgs in world.tags_to_pg.values():
        for i, g in enumerate(pgs):
            if g is old:
                pgs[i] = new
    if world.default_pg is old:
        c10d._update_default_pg(new)
    name = old.group_name
    if name:
        try:
            c10d._unregister_process_group(name)
            c10d._register_process_group(name, new)
        except Exception:
            logger.debug("rankwatch: could not re-register group %r", name, exc_info=True)


def instrument(real: Any) -> Any:
    """Wrap a group torch just built and registered, and swap it into the registries."""
    if not isinstance(real, _RealPG) or type(real) is InstrumentedProcessGroup:
        return real
    new = wrap(real)
    if new is not real:
        try:
            _swap(real, new)
        except Exception:
            logger.debug("rankwatch: could not swap group", exc_info=True)
            return real
    return new


def adopt_existing_groups() -> int:
    """Instrument groups that were created before ``install``."""
    count = 0
    for old in list(c10d._world.pg_map.keys()):
        if instrument(old) is not old:
            count += 1
    return count


def _patched_helper(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def _new_process_group_helper(*args: Any, **kwargs: Any) -> Any:
        pg, store = original(*args, **kwargs)
        return instrument(pg), store

    return _new_process_group_helper


def _patched_split(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def split_group(*args: Any, **kwargs: Any) -> Any:
        return instrument(original(*args, **kwargs))

    return split_group


def _patched_batch(original: Callable[..., Any]) -> Callable[..., Any]:
    """``batch_isend_irecv`` coalesces only for groups whose type *is* ``ProcessGroup``.

    For an instrumented group on a backend that coalesces (NCCL), issue the same coalesced
    batch, or a ring exchange would deadlock; everything else goes to torch's function.
    """

    @functools.wraps(original)
    def batch_isend_irecv(p2p_op_list: list[Any]) -> Any:
        group = p2p_op_list[0].group if p2p_op_list else None
        group = group if group is not None else c10d._world.default_pg
        if type(group) is InstrumentedProcessGroup and p2p_op_list:
            device = p2p_op_list[0].tensor.device
            backend = None
            try:
                backend = group._get_backend(device)
            except Exception:
                pass
            if backend is not None and backend.supports_coalescing:
                c10d._check_p2p_op_list(p2p_op_list)
                with c10d._coalescing_manager(group, device, async_ops=True) as cm:
                    for p in p2p_op_list:
                        key = "group_dst" if p.op is c10d.isend else "group_src"
                        p.op(p.tensor, group=p.group, tag=p.tag, **{key: p.group_peer})
                return cm.works
        return original(p2p_op_list)

    return batch_isend_irecv


def patch(recorder: Recorder) -> None:
    """Instrument every group torch creates from now on, and the ones it already has."""
    import torch.distributed as dist

    _RECORDER[0] = recorder
    if _ORIGINAL:
        return
    for name, make in (
        ("_new_process_group_helper", _patched_helper),
        ("split_group", _patched_split),
        ("batch_isend_irecv", _patched_batch),
    ):
        original = getattr(c10d, name, None)
        if original is None:
            continue
        _ORIGINAL[name] = original
        replacement = make(original)
        setattr(c10d, name, replacement)
        if getattr(dist, name, None) is original:
            setattr(dist, name, replacement)
    adopt_existing_groups()


def unpatch() -> None:
    """Undo ``patch`` for groups created later; existing groups stay instrumented."""
    import torch.distributed as dist

    for name, original in _ORIGINAL.items():
        replacement = getattr(c10d, name, None)
        setattr(c10d, name, original)
        if getattr(dist, name, None) is replacement:
            setattr(dist, name, original)
    _ORIGINAL.clear()
    _RECORDER[0] = None
