"""The evaluation suite's splits: what was tuned on and what was not never share a scenario."""

from __future__ import annotations

import pytest

from rankwatch.sim.suite import HELDOUT_LAYOUTS, LAYOUTS, SEALED_LAYOUTS, UNSEEN_LAYOUTS, build_suite


def _seeds(split: str) -> set[int]:
    return {sc.seed for sc in build_suite(split)}


def test_splits_share_no_seed() -> None:
    seeds = {split: _seeds(split) for split in ("tune", "heldout", "fresh", "unseen", "sealed")}
    for a in seeds:
        for b in seeds:
            assert a == b or not seeds[a] & seeds[b], (a, b)


@pytest.mark.parametrize(
    ("split", "layouts", "before"),
    [
        ("unseen", UNSEEN_LAYOUTS, ("tune", "heldout", "fresh")),
        ("sealed", SEALED_LAYOUTS, ("tune", "heldout", "fresh", "unseen")),
    ],
)
def test_a_late_split_shares_no_layout_rate_or_profile_with_the_splits_before_it(
    split: str, layouts: dict[str, object], before: tuple[str, ...]
) -> None:
    others = [sc for s in before for sc in build_suite(s)]
    mine = build_suite(split)
    assert {sc.layout for sc in mine} <= set(layouts.values())
    assert len({sc.layout for sc in mine}) == len(layouts)  # every layout of its own is drawn
    for key in (lambda sc: sc.layout, lambda sc: sc.profile.name, lambda sc: sc.tags[2]):
        assert not {key(sc) for sc in mine} & {key(sc) for sc in others}


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


def test_the_evaluation_analyses_as_often_as_the_collector() -> None:
    from rankwatch.collector.settings import Settings
    from rankwatch.detector.evaluate import EVAL_EVERY_S

    assert Settings.model_fields["analysis_interval_s"].default == EVAL_EVERY_S
