"""The evaluation suite's splits: what was tuned on and what was not never share a scenario."""

from __future__ import annotations

import pytest

from rankwatch.sim.suite import HELDOUT_LAYOUTS, LAYOUTS, build_suite


def _seeds(split: str) -> set[int]:
    return {sc.seed for sc in build_suite(split)}


def test_splits_share_no_seed() -> None:
    tune, heldout, fresh = _seeds("tune"), _seeds("heldout"), _seeds("fresh")
    assert not tune & heldout
    assert not tune & fresh
    assert not heldout & fresh


def test_held_out_splits_use_layouts_never_tuned_on() -> None:
    tuned = set(LAYOUTS.values())
    for split in ("heldout", "fresh"):
        used = {sc.layout for sc in build_suite(split)}
        assert used <= set(HELDOUT_LAYOUTS.values())
        assert not used & tuned


def test_fresh_is_not_heldout_again() -> None:
    heldout = build_suite("heldout")
    fresh = build_suite("fresh")
    assert len(fresh) == len(heldout)
    # same kinds of scenario, drawn anew: places and onsets differ
    assert [f.faults for f in fresh] != [h.faults for h in heldout]


def test_unknown_split_is_refused() -> None:
    with pytest.raises(ValueError, match="split must be one of"):
        build_suite("everything")
