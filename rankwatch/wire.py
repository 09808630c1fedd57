"""The wire format: the contract between the hooks inside every rank and the collector.

A batch is what one rank ships in one HTTP request. It is binary, versioned and columnar, so
the collector decodes it into numpy arrays without building a Python object per op::

    offset  size  what
    0       4     magic b"RWB\\x00"
    4       2     format version, little-endian (``WIRE_VERSION``)
    6       2     flags (bit 0: the column block is zlib-compressed)
    8       4     length H of the header
    12      4     number N of op records
    16      H     header: UTF-8 JSON object (identity, groups, liveness, attachments)
    16+H    ...   column block: the columns below, in this order, each N values little-endian;
                  each integer column is byte-shuffled (all first bytes, then all second bytes...)
                  before compression, which makes slowly varying 64-bit values cost ~1-2 bytes

    column    dtype  meaning
    group     u2     index into ``header["groups"]``
    kind      u1     ``OpKind``
    dtype     u1     ``DTYPES`` code of the first tensor
    peer      i4     peer's group rank for send/recv, root for rooted ops, -1 otherwise
    seq       i8     sequence number: per group for collectives, per (group, peer, direction) for p2p
    nbytes    i8     bytes of the op's input
    t_enter   i8     ns, rank-local monotonic clock, delta-coded (first value absolute)
    d_start   i8     t_start - t_enter, ns
    d_end     i8     t_end - t_start, ns

The header's keys are documented in ``docs/wire-format.md``; ``validate_header`` checks them.
"""

from __future__ import annotations

import enum
import json
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from rankwatch.errors import WireError

__all__ = [
    "inflate",
    "peek_header",
    "peek_prefixed",
    "read_header",
    "CONTENT_TYPE",
    "DTYPES",
    "MAX_BODY_BYTES",
    "MAX_HEADER_BYTES",
    "MAX_RECORDS",
    "WIRE_VERSION",
    "Batch",
    "OpKind",
    "Records",
    "decode_batch",
    "encode_batch",
    "validate_header",
]

WIRE_VERSION = 1
MAGIC = b"RWB\x00"
CONTENT_TYPE = "application/vnd.rankwatch.batch"
FLAG_ZLIB = 1

MAX_BODY_BYTES = 64 * 1024 * 1024
MAX_HEADER_BYTES = 32 * 1024 * 1024
MAX_RECORDS = 2_000_000
MAX_GROUPS_PER_BATCH = 65_535

_PREFIX = struct.Struct("<4sHHII")


class OpKind(enum.IntEnum):
    """Op kinds, named as torch.distributed names them."""

    ALL_REDUCE = 1
    BROADCAST = 2
    REDUCE = 3
    ALL_GATHER = 4
    ALL_GATHER_INTO_TENSOR = 5
    REDUCE_SCATTER = 6
    REDUCE_SCATTER_TENSOR = 7
    ALL_TO_ALL = 8
    ALL_TO_ALL_SINGLE = 9
    GATHER = 10
    SCATTER = 11
    BARRIER = 12
    SEND = 13
    RECV = 14
    ALL_REDUCE_COALESCED = 15
    ALL_GATHER_COALESCED = 16
    ALL_GATHER_INTO_TENSOR_COALESCED = 17
    REDUCE_SCATTER_TENSOR_COALESCED = 18
    COALESCED = 19

    @property
    def wire_name(self) -> str:
        return self.name.lower()

    @property
    def is_p2p(self) -> bool:
        return self in (OpKind.SEND, OpKind.RECV)


KIND_NAMES: dict[int, str] = {int(k): k.wire_name for k in OpKind}
P2P_KINDS = (int(OpKind.SEND), int(OpKind.RECV))
# lookup tables indexed by the u1 kind column: one gather per batch instead of an np.isin
_KIND_KNOWN = np.zeros(256, dtype=bool)
_KIND_KNOWN[list(KIND_NAMES)] = True
_KIND_P2P = np.zeros(256, dtype=bool)
_KIND_P2P[list(P2P_KINDS)] = True

DTYPES: tuple[str, ...] = (
    "other",
    "float32",
    "float64",
    "float16",
    "bfloat16",
    "int8",
    "uint8",
    "int16",
    "int32",
    "int64",
    "bool",
    "complex64",
    "complex128",
    "float8_e4m3fn",
    "float8_e5m2",
    "uint16",
    "uint32",
    "uint64",
)
DTYPE_CODES: dict[str, int] = {name: i for i, name in enumerate(DTYPES)}

_COLUMNS: tuple[tuple[str, str], ...] = (
    ("group", "<u2"),
    ("kind", "u1"),
    ("dtype", "u1"),
    ("peer", "<i4"),
    ("seq", "<i8"),
    ("nbytes", "<i8"),
    ("t_enter", "<i8"),
    ("d_start", "<i8"),
    ("d_end", "<i8"),
)
_ROW_BYTES = sum(np.dtype(dt).itemsize for _, dt in _COLUMNS)


@dataclass(frozen=True, slots=True)
class Records:
    """Op records as columns; row i of every array describes one op.

    Times are nanoseconds on the recording rank's own monotonic clock.
    """

    group: np.ndarray
    kind: np.ndarray
    dtype: np.ndarray
    peer: np.ndarray
    seq: np.ndarray
    nbytes: np.ndarray
    t_enter: np.ndarray
    t_start: np.ndarray
    t_end: np.ndarray

    def __len__(self) -> int:
        return int(self.seq.shape[0])

    @classmethod
    def empty(cls) -> Records:
        return cls.from_rows([])

    @classmethod
    def from_rows(cls, rows: list[tuple[int, int, int, int, int, int, int, int, int]] | list[Any]) -> Records:
        """Build columns from rows ``(group, kind, dtype, peer, seq, nbytes, t_enter, t_start, t_end)``."""
        if not rows:
            z8 = np.zeros(0, np.int64)
            return cls(
                np.zeros(0, np.uint16),
                np.zeros(0, np.uint8),
                np.zeros(0, np.uint8),
                np.zeros(0, np.int32),
                z8,
                z8.copy(),
                z8.copy(),
                z8.copy(),
                z8.copy(),
            )
        a = np.array(rows, dtype=np.int64)
        return cls(
            a[:, 0].astype(np.uint16),
            a[:, 1].astype(np.uint8),
            a[:, 2].astype(np.uint8),
            a[:, 3].astype(np.int32),
            np.ascontiguousarray(a[:, 4]),
            np.ascontiguousarray(a[:, 5]),
            np.ascontiguousarray(a[:, 6]),
            np.ascontiguousarray(a[:, 7]),
            np.ascontiguousarray(a[:, 8]),
        )


@dataclass(frozen=True, slots=True)
class Batch:
    """A decoded batch: its JSON header and its op records."""

    header: dict[str, Any]
    records: Records


def _shuffle(a: np.ndarray) -> bytes:
    size = a.dtype.itemsize
    if size == 1:
        return a.tobytes()
    return a.view(np.uint8).reshape(-1, size).T.tobytes()


def _column_runs() -> list[tuple[list[str], np.dtype[Any]]]:
    """``_COLUMNS`` as runs of neighbours of one dtype (the five int64 columns are one run)."""
    runs: list[tuple[list[str], np.dtype[Any]]] = []
    for name, dt in _COLUMNS:
        d = np.dtype(dt)
        if runs and runs[-1][1] == d:
            runs[-1][0].append(name)
        else:
            runs.append(([name], d))
    return runs


_COLUMN_RUNS = _column_runs()


def _unshuffle_columns(block: bytes, n: int) -> dict[str, np.ndarray]:
    """Every column of a decompressed block: each run of same-dtype columns unshuffled in one
    numpy pass (one pass per column cost a fifth of decoding a 100-record batch)."""
    raw = np.frombuffer(block, dtype=np.uint8)
    cols: dict[str, np.ndarray] = {}
    off = 0
    for names, dt in _COLUMN_RUNS:
        k, size = len(names), dt.itemsize
        part = raw[off : off + k * size * n]
        off += k * size * n
        if size == 1:
            arr = part.view(dt).reshape(k, n)
        else:
            arr = np.ascontiguousarray(part.reshape(k, size, n).transpose(0, 2, 1)).view(dt).reshape(k, n)
        for i, name in enumerate(names):
            cols[name] = arr[i]
    return cols


def encode_batch(header: Mapping[str, Any], records: Records, *, compress: bool = True) -> bytes:
    """Serialise one batch.

    Args:
        header: the JSON-serialisable header (see ``docs/wire-format.md``).
        records: the op records; their ``group`` values index ``header["groups"]``.
        compress: zlib-compress the column block (the default; level 1, fast).

    Returns:
        The request body.
    """
    n = len(records)
    t_enter = records.t_enter.astype(np.int64, copy=False)
    t_enter_delta = np.empty_like(t_enter)
    if n:
        t_enter_delta[0] = t_enter[0]
        np.subtract(t_enter[1:], t_enter[:-1], out=t_enter_delta[1:])
    cols = {
        "group": records.group,
        "kind": records.kind,
        "dtype": records.dtype,
        "peer": records.peer,
        "seq": records.seq,
        "nbytes": records.nbytes,
        "t_enter": t_enter_delta,
        "d_start": records.t_start - t_enter,
        "d_end": records.t_end - records.t_start,
    }
    block = b"".join(_shuffle(np.asarray(cols[name], dtype=dt)) for name, dt in _COLUMNS)
    flags = 0
    if compress:
        block = zlib.compress(block, 1)
        flags |= FLAG_ZLIB
    head = json.dumps(header, separators=(",", ":"), allow_nan=False).encode()
    return _PREFIX.pack(MAGIC, WIRE_VERSION, flags, len(head), n) + head + block


def decode_batch(body: bytes) -> Batch:
    """Parse and check one batch without building a Python object per op.

    Raises:
        WireError: the body is not a well-formed batch of a version this code reads; the
            message says what is wrong.
    """
    if len(body) > MAX_BODY_BYTES:
        raise WireError(f"batch is {len(body)} bytes; the limit is {MAX_BODY_BYTES}")
    if len(body) < _PREFIX.size:
        raise WireError(f"batch is {len(body)} bytes, shorter than the {_PREFIX.size}-byte prefix")
    magic, version, flags, head_len, n = _PREFIX.unpack_from(body)
    if magic != MAGIC:
        raise WireError("not a rankwatch batch (bad magic bytes)")
    if version != WIRE_VERSION:
        raise WireError(f"wire version {version} is not supported; this collector reads {WIRE_VERSION}")
    if flags & ~FLAG_ZLIB:
        raise WireError(f"unknown flags 0x{flags:x}")
    if head_len > MAX_HEADER_BYTES:
        raise WireError(f"header is {head_len} bytes; the limit is {MAX_HEADER_BYTES}")
    if n > MAX_RECORDS:
        raise WireError(f"batch has {n} records; the limit is {MAX_RECORDS}")
    header, end = read_header(body, _PREFIX.size, head_len, "batch")
    block = body[end:]
    if flags & FLAG_ZLIB:
        block = inflate(block, n * _ROW_BYTES)
    if len(block) != n * _ROW_BYTES:
        raise WireError(f"column block is {len(block)} bytes; {n} records need {n * _ROW_BYTES}")
    cols = _unshuffle_columns(block, n)
    t_enter = np.cumsum(cols["t_enter"], dtype=np.int64)
    t_start = t_enter + cols["d_start"]
    records = Records(
        group=cols["group"],
        kind=cols["kind"],
        dtype=cols["dtype"],
        peer=cols["peer"],
        seq=cols["seq"],
        nbytes=cols["nbytes"],
        t_enter=t_enter,
        t_start=t_start,
        t_end=t_start + cols["d_end"],
    )
    validate_header(header)
    _validate_records(header, records)
    return Batch(header=header, records=records)


_REQUIRED: dict[str, type | tuple[type, ...]] = {
    "job": str,
    "rank": int,
    "world": int,
    "node": str,
    "incarnation": str,
    "batch": int,
    "mono_ns": int,
    "groups": list,
}
_OPTIONAL: dict[str, type | tuple[type, ...]] = {
    "state": str,
    "drops": int,
    "pid": int,
    "agent_pid": int,
    "restart": int,
    "flush_s": (int, float),
    "wall_ns": int,
    "meta": dict,
    "stack": (str, type(None)),
    "attachments": dict,
    "control": dict,
    "stats": dict,
    "end_reason": str,
}
STATES = ("running", "goodbye", "terminating", "crashed")
MAX_NAME = 256


def validate_header(header: Mapping[str, Any]) -> None:
    """Check a batch header's keys, types and ranges.

    Raises:
        WireError: with the name of the first offending field.
    """
    for key, typ in _REQUIRED.items():
        if key not in header:
            raise WireError(f"header lacks required field {key!r}")
        if not isinstance(header[key], typ) or isinstance(header[key], bool):
            raise WireError(f"header field {key!r} must be {_tname(typ)}")
    for key, typ in _OPTIONAL.items():
        if key in header and header[key] is not None and not isinstance(header[key], typ):
            raise WireError(f"header field {key!r} must be {_tname(typ)}")
    for key in ("job", "node", "incarnation"):
        if not header[key] or len(header[key]) > MAX_NAME:
            raise WireError(f"header field {key!r} must be 1 to {MAX_NAME} characters")
    world = header["world"]
    if not 1 <= world <= 10_000_000:
        raise WireError(f"world size {world} is out of range")
    if not 0 <= header["rank"] < world:
        raise WireError(f"rank {header['rank']} is not within world size {world}")
    if header["batch"] < 0:
        raise WireError("batch number must not be negative")
    if header.get("state", "running") not in STATES:
        raise WireError(f"state must be one of {', '.join(STATES)}")
    if header.get("drops", 0) < 0:
        raise WireError("drops must not be negative")
    groups = header["groups"]
    if len(groups) > MAX_GROUPS_PER_BATCH:
        raise WireError(f"batch names {len(groups)} groups; the limit is {MAX_GROUPS_PER_BATCH}")
    for i, g in enumerate(groups):
        _validate_group(i, g, world)


def _validate_group(i: int, g: Any, world: int) -> None:
    # every rank's group entries pass here, every batch: the common case costs a few type checks
    if not isinstance(g, dict):
        raise WireError(f"groups[{i}] must be an object")
    gid = g.get("id")
    if not isinstance(gid, str) or not gid or len(gid) > MAX_NAME:
        raise WireError(f"groups[{i}].id must be a non-empty string of at most {MAX_NAME} characters")
    ranks = g.get("ranks")
    if ranks is None:  # membership unknown to the rank; the collector infers it from who reports
        ranks = []
    elif not isinstance(ranks, list) or not ranks:
        raise WireError(f"groups[{i}].ranks must be a non-empty list of [start, stop, step] runs")
    size = 0
    for run in ranks:
        # type(x) is int: JSON gives int, bool, float or str, and a bool is no rank
        if not isinstance(run, list) or len(run) != 3:
            raise WireError(f"groups[{i}].ranks must be a list of [start, stop, step] integer runs")
        start, stop, step = run
        if type(start) is not int or type(stop) is not int or type(step) is not int:
            if not all(isinstance(x, int) and not isinstance(x, bool) for x in run):
                raise WireError(f"groups[{i}].ranks must be a list of [start, stop, step] integer runs")
        if step <= 0 or start < 0 or stop > world or stop <= start:
            raise WireError(f"groups[{i}].ranks run {run} is not within world size {world}")
        size += (stop - start + step - 1) // step
    if size > world:
        raise WireError(f"groups[{i}] has {size} members, more than the world size {world}")
    entered = g.get("entered", 0)
    completed = g.get("completed", 0)
    for key, v in (("entered", entered), ("completed", completed)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise WireError(f"groups[{i}].{key} must be a non-negative integer")
    if completed > entered:
        raise WireError(f"groups[{i}].completed is ahead of groups[{i}].entered")
    since = g.get("inflight_since_ns")
    if since is not None and (not isinstance(since, int) or isinstance(since, bool)):
        raise WireError(f"groups[{i}].inflight_since_ns must be an integer or null")


def _validate_records(header: Mapping[str, Any], r: Records) -> None:
    n = len(r)
    if not n:
        return
    groups = header["groups"]
    if int(r.group.max()) >= len(groups):
        raise WireError(f"a record names group index {int(r.group.max())}; the batch has {len(groups)} groups")
    if int(r.seq.min()) < 1:
        raise WireError("sequence numbers start at 1")
    bad_kind = ~_KIND_KNOWN[r.kind]
    if bad_kind.any():
        raise WireError(f"unknown op kind {int(r.kind[bad_kind][0])}")
    if int(r.dtype.max()) >= len(DTYPES):
        raise WireError(f"unknown dtype code {int(r.dtype.max())}")
    if int(r.nbytes.min()) < 0:
        raise WireError("nbytes must not be negative")
    if bool((r.t_start < r.t_enter).any()) or bool((r.t_end < r.t_start).any()):
        raise WireError("timestamps must satisfy enter <= start <= end")
    p2p = _KIND_P2P[r.kind]
    if not p2p.all():
        entered = np.array([g.get("entered", 0) for g in groups], dtype=np.int64)
        seq, group = (r.seq, r.group) if not p2p.any() else (r.seq[~p2p], r.group[~p2p])
        over = seq > entered[group]
        if over.any():
            raise WireError("a record's sequence number is ahead of its group's 'entered' count")


def _tname(typ: type | tuple[type, ...]) -> str:
    if isinstance(typ, tuple):
        return " or ".join(t.__name__ for t in typ)
    return {"str": "a string", "int": "an integer", "list": "a list", "dict": "an object"}.get(
        typ.__name__, typ.__name__
    )


def ranks_to_runs(ranks: list[int] | range) -> list[list[int]]:
    """Compress member ranks, in group-rank order, into ``[start, stop, step]`` runs.

    A data- or tensor-parallel group is one run, so a 100,000-rank group costs a few bytes.
    """
    rs = list(ranks)
    runs: list[list[int]] = []
    i = 0
    while i < len(rs):
        start = rs[i]
        if i + 1 < len(rs):
            step = rs[i + 1] - start
            j = i + 1
            while j + 1 < len(rs) and rs[j + 1] - rs[j] == step:
                j += 1
            if step > 0 and j > i:
                runs.append([start, rs[j] + 1, step])
                i = j + 1
                continue
        runs.append([start, start + 1, 1])
        i += 1
    return runs


def runs_to_ranks(runs: list[list[int]]) -> list[int]:
    """Inverse of ``ranks_to_runs``."""
    out: list[int] = []
    for start, stop, step in runs:
        out.extend(range(start, stop, step))
    return out


def peek_header(body: bytes) -> dict[str, Any]:
    """A raw batch's JSON header, without checking or decoding the rest.

    Raises:
        WireError: shorter than the prefix, or the header truncated or not a JSON object.
    """
    return peek_prefixed(body, _PREFIX, "batch")


def peek_prefixed(body: bytes, prefix: struct.Struct, what: str) -> dict[str, Any]:
    """The JSON header of a body whose fixed prefix (``prefix``) has the header's length as its
    fourth field, as raw and block bodies do; nothing else is checked or decoded."""
    if len(body) < prefix.size:
        raise WireError(f"{what} is {len(body)} bytes, shorter than the {prefix.size}-byte prefix")
    return read_header(body, prefix.size, prefix.unpack_from(body)[3], what)[0]


def read_header(body: bytes, start: int, head_len: int, what: str) -> tuple[dict[str, Any], int]:
    """The JSON object header at ``body[start:start + head_len]`` and where it ends.

    Raises:
        WireError: truncated, not JSON, or not an object.
    """
    end = start + head_len
    if len(body) < end:
        raise WireError(f"{what} is truncated inside its header")
    try:
        header = orjson.loads(memoryview(body)[start:end])  # a quarter of json.loads' time
    except orjson.JSONDecodeError as exc:  # also invalid UTF-8, NaN, integers beyond 64 bits
        raise WireError(f"header is not valid JSON: {exc}") from None
    if not isinstance(header, dict):
        raise WireError("header must be a JSON object")
    return header, end


def inflate(block: bytes, size: int) -> bytes:
    """zlib-decompress a column block that must come to exactly ``size`` bytes (never more: no zip bomb).

    Raises:
        WireError: not zlib, or not ``size`` bytes once decompressed.
    """
    try:
        d = zlib.decompressobj()
        out = d.decompress(block, size + 1)
        if d.unconsumed_tail or not d.eof:
            raise WireError("column block does not decompress to the expected size")
    except zlib.error as exc:
        raise WireError(f"column block is not valid zlib data: {exc}") from None
    return out
