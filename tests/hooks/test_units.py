"""Small pieces of the hooks, in this process: ring, injection syntax, configuration, identity."""

from __future__ import annotations

import pytest

from rankwatch.errors import ConfigError, InjectSpecError
from rankwatch.hooks.config import HooksConfig
from rankwatch.hooks.identity import job_from_env, node_name
from rankwatch.hooks.inject import parse_inject
from rankwatch.hooks.ring import OpRing


def test_ring_drops_oldest() -> None:
    ring = OpRing(4)
    for i in range(10):
        ring.append((i,))
    assert ring.drain(3) == [(6,), (7,), (8,)]
    ring.append((10,))
    assert ring.drain(10) == [(9,), (10,)]
    assert ring.drained == 5


def test_inject_syntax() -> None:
    rules = parse_inject(
        "slow:rank=1+3,delay=0.05,after=2,for=10; stall:node=n2,seq=40,group=1;exit:rank=0,seq=9,code=3"
    )
    assert rules[0].ranks == frozenset({1, 3}) and rules[0].delay == 0.05 and rules[0].duration == 10
    assert rules[1].node == "n2" and rules[1].seq == 40 and rules[1].group == "1"
    assert rules[2].code == 3
    for bad in ("sloww:rank=1", "slow:rank=1", "stall:rank=1", "slow:rank=x,delay=1", "slow:color=red,delay=1"):
        with pytest.raises(InjectSpecError):
            parse_inject(bad)


def test_config_from_env() -> None:
    assert HooksConfig.from_env({}) is None
    cfg = HooksConfig.from_env({"RANKWATCH": "1", "RANKWATCH_FLUSH_S": "0.5", "RANKWATCH_CONTROL": "1"})
    assert cfg is not None and cfg.flush_s == 0.5 and cfg.control and cfg.ring_records > 100_000
    with pytest.raises(ConfigError):
        HooksConfig.from_env({"RANKWATCH": "1", "RANKWATCH_FLUSH_S": "soon"})


def test_identity_precedence() -> None:
    assert job_from_env({"RANKWATCH_JOB": "a", "SLURM_JOB_ID": "b", "TORCHELASTIC_RUN_ID": "c"}) == "a"
    assert job_from_env({"SLURM_JOB_ID": "b", "TORCHELASTIC_RUN_ID": "c"}) == "b"
    assert job_from_env({"TORCHELASTIC_RUN_ID": "c"}) == "c"
    assert job_from_env({"TORCHELASTIC_RUN_ID": "none"}) is None
    assert job_from_env({"TORCHFT_LIGHTHOUSE": "http://lh:29510"}) == "torchft-lh:29510"
    assert node_name({"RANKWATCH_NODE": "x", "SLURMD_NODENAME": "y"}) == "x"
    assert node_name({"SLURMD_NODENAME": "y"}) == "y"
