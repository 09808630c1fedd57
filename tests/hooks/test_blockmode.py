"""The shipper's block mode, without torch: records wait for their group's block size and for
their block to complete, and none is lost or summarised twice."""

from __future__ import annotations

import pytest

from rankwatch.errors import ConfigError
from rankwatch.hooks.blockmode import BlockShaper, want_block
from rankwatch.hooks.config import HooksConfig
from rankwatch.wire import OpKind, Records

AR, SEND = int(OpKind.ALL_REDUCE), int(OpKind.SEND)
MS = 1_000_000


def _records(group: int, seqs: range, t0_ms: int = 0, kind: int = AR) -> Records:
    return Records.from_rows(
        [
            (group, kind, 1, -1 if kind == AR else 1, s, 64, (t0_ms + i) * MS, (t0_ms + i) * MS, (t0_ms + i) * MS + 10)
            for i, s in enumerate(seqs)
        ]
    )


def test_want_block_is_a_power_of_two_up_to_64() -> None:
    assert want_block(100, 1.0, 0.2) == 16
    assert want_block(1, 1.0, 0.2) == 1
    assert want_block(10**6, 1.0, 0.2) == 64


def test_records_wait_for_their_groups_size_then_whole_blocks_go() -> None:
    sh = BlockShaper(flush_s=1.0, block_s=0.2, max_held=10_000)
    out, sizes, wants = sh.shape(_records(0, range(1, 51)), ["g"], now_ns=60 * MS)
    assert len(out) == 0 and wants == {0: 8}  # 50 ops/s * 0.2 s -> 8
    sh.learn({"g": 8, "bad": 3, "worse": "x"})
    assert sh.sizes == {"g": 8}
    out, sizes, _ = sh.shape(_records(0, range(51, 61), t0_ms=50), ["g"], now_ns=70 * MS)
    assert sizes == {0: 8}
    assert out.seq.tolist() == list(range(1, 57))  # blocks 1..56 complete; 57..60 wait for their block
    out, _, _ = sh.shape(Records.empty(), ["g"], now_ns=70 * MS, final=True)
    assert out.seq.tolist() == [57, 58, 59, 60]  # the last batch takes everything


def test_old_partial_blocks_and_p2p_do_not_wait() -> None:
    sh = BlockShaper(flush_s=1.0, block_s=0.2, max_held=10_000, hold_s=2.0)
    sh.learn({"g": 64})
    out, _, _ = sh.shape(_records(0, range(1, 4)), ["g"], now_ns=1 * MS)
    assert len(out) == 0
    out, _, _ = sh.shape(_records(0, range(1, 3), kind=SEND), ["g"], now_ns=5_000 * MS)
    assert sorted(out.seq.tolist()) == [1, 1, 2, 2, 3]  # the sends, and the collectives held too long


def test_overflow_drops_the_oldest_and_counts_them() -> None:
    sh = BlockShaper(flush_s=1.0, block_s=0.2, max_held=10)
    sh.shape(_records(0, range(1, 31)), ["g"], now_ns=0)
    assert sh.dropped == 20 and sh.held.seq.tolist() == list(range(21, 31))


def test_wire_mode_from_the_environment() -> None:
    url = {"RANKWATCH": "1"}
    cfg = HooksConfig.from_env(url)
    assert cfg is not None and cfg.wire_mode == "auto" and not cfg.blocks_for(1023) and cfg.blocks_for(1024)
    cfg = HooksConfig.from_env(url | {"RANKWATCH_WIRE_MODE": "blocks"})
    assert cfg is not None and cfg.blocks_for(2)
    cfg = HooksConfig.from_env(url | {"RANKWATCH_WIRE_MODE": "raw"})
    assert cfg is not None and not cfg.blocks_for(10**6)
    cfg = HooksConfig.from_env(url | {"RANKWATCH_BLOCK_MODE_MIN_WORLD": "16"})
    assert cfg is not None and cfg.blocks_for(16) and not cfg.blocks_for(15)
    with pytest.raises(ConfigError, match="RANKWATCH_WIRE_MODE must be one of auto, raw, blocks"):
        HooksConfig.from_env(url | {"RANKWATCH_WIRE_MODE": "fast"})
