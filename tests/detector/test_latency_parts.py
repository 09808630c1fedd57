"""The evaluation's ``watch`` hook and ``bench/latency_parts.py``, which reads a detection's stages
through it; trying a detector setting or the hooks' send period on the suite without editing the
code (``config_with``, ``trial_settings`` and the ``--set`` / ``--flush-s`` options of
``bench/eval_detector.py`` and ``bench/latency_parts.py``)."""

from __future__ import annotations

import pytest
from support import load_bench

from rankwatch.detector.config import DetectorConfig
from rankwatch.detector.evaluate import EVAL_EVERY_S, config_with, run_scenario, trial_settings
from rankwatch.detector.job import JobDetector
from rankwatch.sim import PROFILES, Fault, Layout, Scenario, Workload


def _straggler(seed: int = 3) -> Scenario:
    lay = Layout(tp=2, pp=1, dp=8)
    return Scenario(
        name="straggler",
        layout=lay,
        workload=Workload.for_rate(100.0, lay),
        profile=PROFILES["quiet"],
        faults=(Fault("slow_compute", "rank", ranks=(5,), factor=1.5, onset=20.0),),
        duration=30.0,
        seed=seed,
    )


def test_watch_sees_every_analysis_and_the_straggler_among_the_roots_before_it_is_named() -> None:
    sc = _straggler()
    seen: list[tuple[float, set[int]]] = []

    def watch(now: float, det: JobDetector) -> None:
        seen.append((now, set(det.roots)))

    res = run_scenario(sc, watch=watch)
    assert len(seen) == round(sc.duration / EVAL_EVERY_S)
    assert res.latency[0] is not None
    assert not any(roots for t, roots in seen if t < 20.0)  # a quiet healthy job has no root
    first = min(t for t, roots in seen if 5 in roots)
    assert 20.0 < first <= 20.0 + res.latency[0]
    assert all(roots <= {5} for _, roots in seen)


def test_latency_parts_orders_a_stragglers_stages() -> None:
    (row,) = load_bench("latency_parts").one(_straggler())
    assert row["level"] == "rank" and row["named"] is not None
    # the evidence comes first, then enough of it, then the rank is a root, then it is named
    assert 0.0 < row["ev"] <= row["hot"] <= row["root"] <= row["named"] < 5.0
    assert row["bar"] >= 3.0 and row["slowdown"] > 1.1


def test_settings_are_read_as_the_type_of_what_they_replace() -> None:
    cfg = config_with(["hold_s=0.25", " warm_cells = 12 "])
    assert cfg.hold_s == 0.25 and isinstance(cfg.hold_s, float)
    assert cfg.warm_cells == 12 and isinstance(cfg.warm_cells, int)
    assert cfg.cusum_h == DetectorConfig().cusum_h  # the rest as the code has them
    assert config_with([]) == DetectorConfig()
    assert config_with(["cusum_h=7"], base=cfg).hold_s == 0.25


@pytest.mark.parametrize(
    ("item", "says"),
    [
        ("hold_s", "expected NAME=VALUE"),
        ("=0.5", "expected NAME=VALUE"),
        ("hold=0.5", "'hold' is not a detector setting"),
        ("hold_s=soon", "hold_s=soon: not a number"),
        ("hold_s=nan", "hold_s=nan: not a number"),
        ("warm_cells=2.5", "warm_cells=2.5: not a whole number"),
        ("hold_s=-1", "must not be negative"),
    ],
)
def test_a_bad_setting_is_refused_saying_why(item: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        config_with([item])


def test_trial_settings_name_what_was_changed() -> None:
    assert trial_settings([]) == (DetectorConfig(), "")
    cfg, said = trial_settings(["hold_s=0.5"], 0.25)
    assert cfg.hold_s == 0.5 and said == "settings changed from the code's: hold_s=0.5, flush_s=0.25"
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="must be a positive number of seconds"):
            trial_settings([], bad)


def test_a_setting_reaches_the_detector() -> None:
    sc = _straggler()
    assert run_scenario(sc).latency[0] is not None
    # evidence that can never add up: the same straggler is not named
    assert run_scenario(sc, config_with(["cusum_h=1000"])).latency[0] is None


def test_latency_parts_takes_the_settings(capsys: pytest.CaptureFixture[str]) -> None:
    mod = load_bench("latency_parts")
    (row,) = mod.one(_straggler(), config_with(["cusum_h=1000"]))
    assert row["named"] is None and "hot" not in row
    with pytest.raises(SystemExit):
        mod.main(["--splits", "smoke", "--set", "nothing=1"])
    assert "'nothing' is not a detector setting" in capsys.readouterr().err


def test_eval_detector_says_what_it_changed_and_uses_it(capsys: pytest.CaptureFixture[str]) -> None:
    mod = load_bench("eval_detector")
    args = ["--split", "smoke", "--only", "smoke-straggler-000"]
    assert mod.main(args) == 0
    plain = capsys.readouterr().out
    assert "settings changed" not in plain
    assert mod.main([*args, "--set", "cusum_h=1000", "--flush-s", "0.5"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "settings changed from the code's: cusum_h=1000, flush_s=0.5"
    row = next(line for line in plain.splitlines() if line.startswith("noncomm_slow"))
    assert row.split()[2] == "1.000"  # found with the code's settings...
    row = next(line for line in out.splitlines() if line.startswith("noncomm_slow"))
    assert row.split()[2] == "0.000"  # ...and not with evidence that never adds up
    for bad, says in (["--flush-s", "0"], "must be a positive number"), (["--set", "x"], "expected NAME=VALUE"):
        with pytest.raises(SystemExit):
            mod.main([*args, *bad])
        assert says in capsys.readouterr().err


def test_eval_detector_sends_every_scenario_at_the_period_given(monkeypatch: pytest.MonkeyPatch) -> None:
    mod = load_bench("eval_detector")
    seen: dict[str, object] = {}
    real = mod.evaluate_suite

    def spy(split: str, **kw: object) -> object:
        seen.update(kw)
        return real(split, **kw)

    monkeypatch.setattr(mod, "evaluate_suite", spy)
    assert mod.main(["--split", "smoke", "--only", "smoke-healthy-001", "--flush-s", "0.25"]) == 0
    scs = seen["scenarios"]
    assert isinstance(scs, list) and len(scs) == 20 and {sc.flush_s for sc in scs} == {0.25}
    assert seen["config"] == DetectorConfig()


def test_latency_parts_runs_every_straggler_with_the_settings_given(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    mod = load_bench("latency_parts")
    monkeypatch.setattr(mod, "build_suite", lambda split: [_straggler()])
    assert mod.main(["--splits", "smoke", "--all"]) == 0
    plain = capsys.readouterr().out.splitlines()
    assert mod.main(["--splits", "smoke", "--all", "--set", "cusum_h=1000", "--flush-s", "0.5"]) == 0
    tried = capsys.readouterr().out.splitlines()
    assert tried[0] == "settings changed from the code's: cusum_h=1000, flush_s=0.5"
    # the straggler's row: named with the code's settings, never with evidence that cannot add up
    (row,) = [line for line in plain if line.strip().startswith("straggler ")]
    (row2,) = [line for line in tried if line.strip().startswith("straggler ")]
    assert row.split()[-2] != "-" and row2.split()[-2] == "-"
    seen: list[tuple[float, float]] = []
    monkeypatch.setattr(mod, "one", lambda sc, config: seen.append((sc.flush_s, config.cusum_h)) or [])
    assert mod.main(["--splits", "smoke", "--flush-s", "0.25", "--set", "cusum_h=7"]) == 0
    assert seen == [(0.25, 7.0)]
