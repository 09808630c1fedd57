"""The evaluation: labelled simulated jobs through the real ``JobDetector``, scored.

Each scenario's batches are fed to a fresh detector in the order the collector would receive
them, and ``evaluate`` is called every ``eval_every`` seconds of simulated server time, as the
collector's analysis loop does. A reported suspect is *right* when its kind, level and what it
names (ranks for a rank, nodes for a node, the two nodes of a link) equal an injected fault's
label and it appeared after that fault's onset; everything else it reports is a false suspect. The
label is the finest answer the timing evidence supports (``rankwatch.sim.evidence``): a slow NIC
in a pure data-parallel ring is labelled as the ring's nodes, since every NIC on it slows the
same ring alike.
Per fault class the table gives precision, recall, detection latency (onset to the first right
report: median and 95th percentile, over all detections and over those whose true job slowdown is
at least 1.2x or that stop the job, and the share of the latter within the issue's bar: 3 s or 3
training steps, whichever is longer, for a slowdown; 15 s for a hang or a dead rank), and false
suspects per simulated job-hour on healthy runs. A training step is the median time between
step ends before the first fault.

``evaluate_suite`` is argparse-free so ``rankwatch evaluate`` and ``bench/eval_detector.py`` share it.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rankwatch.detector.config import DetectorConfig
from rankwatch.detector.finding import KINDS, Finding
from rankwatch.detector.job import JobDetector
from rankwatch.sim.evidence import expected_answers
from rankwatch.sim.faults import Expected
from rankwatch.sim.scenario import Scenario
from rankwatch.sim.ship import deliveries
from rankwatch.sim.suite import build_suite
from rankwatch.sim.truth import job_slowdown

__all__ = [
    "EVAL_EVERY_S",
    "ScenarioResult",
    "SuiteReport",
    "config_with",
    "evaluate_suite",
    "run_scenario",
    "trial_settings",
    "with_send_period",
]

EVAL_EVERY_S = 0.5
"""Seconds between ``evaluate`` calls: the collector's (``analysis_interval_s``' default)."""


def config_with(overrides: Iterable[str], base: DetectorConfig | None = None) -> DetectorConfig:
    """``base`` (default: ``DetectorConfig()``) with settings given as ``NAME=VALUE`` strings.

    For trying a threshold on the suite without editing the code (``bench/eval_detector.py
    --set``); each value is read as the type of the setting it replaces.

    Raises:
        ValueError: an item is not ``NAME=VALUE``, names no setting, or its value does not read
            as that setting's type.
    """
    cfg = base if base is not None else DetectorConfig()
    fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    changes: dict[str, Any] = {}
    for item in overrides:
        name, sep, text = item.partition("=")
        name, text = name.strip(), text.strip()
        if not sep or not name or not text:
            raise ValueError(f"{item!r}: expected NAME=VALUE, e.g. hold_s=0.5")
        if name not in fields:
            raise ValueError(f"{name!r} is not a detector setting (one of: {', '.join(sorted(fields))})")
        kind = type(fields[name])  # every setting is an int or a float
        try:
            value = kind(text)
            if not math.isfinite(value):
                raise ValueError(text)
        except ValueError:
            raise ValueError(f"{name}={text}: not {'a whole number' if kind is int else 'a number'}") from None
        if value < 0:
            raise ValueError(f"{name}={text}: must not be negative")
        changes[name] = value
    return dataclasses.replace(cfg, **changes)


def trial_settings(overrides: Iterable[str], flush_s: float | None = None) -> tuple[DetectorConfig, str]:
    """The detector settings and send period the evaluation scripts were asked to try instead of the
    code's (``--set``, ``--flush-s``), and the line their output starts with to say so ("" when
    nothing was changed).

    Raises:
        ValueError: a bad setting (``config_with``), or a send period that is not positive.
    """
    overrides = list(overrides)
    config = config_with(overrides)
    if flush_s is not None and not (math.isfinite(flush_s) and flush_s > 0):
        raise ValueError(f"--flush-s {flush_s:g}: must be a positive number of seconds")
    changed = overrides + ([] if flush_s is None else [f"flush_s={flush_s:g}"])
    return config, ("settings changed from the code's: " + ", ".join(changed)) if changed else ""


def with_send_period(scenarios: Iterable[Scenario], flush_s: float | None) -> list[Scenario]:
    """The scenarios, their simulated hooks sending every ``flush_s`` seconds (None: as they are)."""
    return [sc if flush_s is None else dataclasses.replace(sc, flush_s=flush_s) for sc in scenarios]


@dataclass(slots=True)
class Reported:
    """One suspect key as the collector would have seen it."""

    key: str
    kind: str
    level: str
    ranks: list[int]
    nodes: list[str]
    link: tuple[str, str] | None
    first: float  # first evaluate time it was reported
    last: float
    slowdown: float | None
    match: int = -1  # index of the fault it is right about, -1: false
    slowdowns: list[float] = field(default_factory=list)  # its slowdown at every evaluation it was reported


@dataclass(slots=True)
class ScenarioResult:
    name: str
    tags: tuple[str, ...]
    healthy: bool
    duration: float
    expected: list[Expected]
    onsets: list[float]
    ends: list[float]
    reported: list[Reported]
    latency: list[float | None]  # per fault: onset to first right report
    resolved: list[bool | None]  # per fault that ends: its suspect went away
    true_slowdown: float | None
    coll_per_s: float
    cpu_s: float
    step_s: float = math.nan  # median training step before the first fault (the whole run if healthy)
    steady: bool = False  # one fault, on from its onset to the end (no flapping, no recovery)
    findings_sample: list[dict[str, Any]] = field(default_factory=list)

    @property
    def false_suspects(self) -> list[Reported]:
        return [r for r in self.reported if r.match < 0]


def _matches(f: Reported, e: Expected) -> bool:
    if f.kind != e.kind or f.level != e.level:
        return False
    if e.level == "rank":
        return sorted(f.ranks) == sorted(e.ranks)
    if e.level == "node":
        return sorted(f.nodes) == sorted(e.nodes)
    return f.link is not None and tuple(sorted(f.link)) == tuple(sorted(e.link or ()))


def run_scenario(
    sc: Scenario,
    config: DetectorConfig | None = None,
    *,
    eval_every: float = EVAL_EVERY_S,
    keep_findings: bool = False,
    on_eval: Callable[[float, list[Finding]], None] | None = None,
    watch: Callable[[float, JobDetector], None] | None = None,
) -> ScenarioResult:
    """Run one scenario through a fresh detector and score what it reported.

    ``on_eval`` sees what each analysis found; ``watch`` sees the detector itself after it (read it,
    never change it).
    """
    det = JobDetector(config)
    lay = sc.layout
    expected = expected_answers(sc)
    reported: dict[str, Reported] = {}
    sample: list[dict[str, Any]] = []
    cpu0 = time.process_time()
    n_coll = 0
    t_next = eval_every

    def tick(now: float) -> None:
        found = det.evaluate(now)
        if on_eval is not None:
            on_eval(now, found)
        if watch is not None:
            watch(now, det)
        for f in found:
            r = reported.get(f.key)
            if r is None:
                r = reported[f.key] = Reported(f.key, f.kind, f.level, f.ranks, f.nodes, f.link, now, now, f.slowdown)
                if keep_findings and len(sample) < 20:
                    sample.append(f.to_dict())
            else:
                r.last = now
                r.slowdown = f.slowdown
            if f.slowdown is not None:
                r.slowdowns.append(f.slowdown)

    step_log: list[float] = []
    for d in deliveries(sc, step_log):
        while d.received_at > t_next:
            tick(t_next)
            t_next += eval_every
        det.observe(d.batch, d.received_at)
        n_coll += len(d.batch.records)
    while t_next <= sc.duration + 0.5 * eval_every:
        tick(t_next)
        t_next += eval_every
    cpu = time.process_time() - cpu0
    onsets = [f.onset for f in sc.faults]
    ends = [f.end for f in sc.faults]
    latency: list[float | None] = [None] * len(sc.faults)
    for r in reported.values():
        for i, e in enumerate(expected):
            if _matches(r, e) and r.first >= onsets[i] - 1e-9:
                r.match = i
                lat = r.first - onsets[i]
                if latency[i] is None or lat < latency[i]:  # type: ignore[operator]
                    latency[i] = lat
                break
    resolved: list[bool | None] = []
    for i, end in enumerate(ends):
        if not math.isfinite(end) or end > sc.duration - 20.0:
            resolved.append(None)
            continue
        mine = [r for r in reported.values() if r.match == i]
        resolved.append(bool(mine) and all(r.last <= end + 15.0 for r in mine))
    ends_t = np.asarray(step_log, np.float64)
    pre = ends_t[ends_t < min(onsets)] if onsets else ends_t
    steps = np.diff(pre if pre.shape[0] >= 3 else ends_t)
    return ScenarioResult(
        name=sc.name,
        tags=sc.tags,
        healthy=not sc.faults,
        duration=sc.duration,
        expected=expected,
        onsets=onsets,
        ends=ends,
        reported=list(reported.values()),
        latency=latency,
        resolved=resolved,
        true_slowdown=job_slowdown(sc, step_log),
        coll_per_s=n_coll / max(1, lay.world) / sc.duration,
        cpu_s=cpu,
        step_s=float(np.median(steps)) if steps.shape[0] else math.nan,
        steady=len(sc.faults) == 1 and sc.faults[0].flap is None and not math.isfinite(sc.faults[0].end),
        findings_sample=sample,
    )


def _run_one(args: tuple[Scenario, DetectorConfig | None, float]) -> ScenarioResult:
    sc, cfg, every = args
    return run_scenario(sc, cfg, eval_every=every)


OPTIONAL_BELOW = 1.03
"""Slow faults making the job less than this much slower need not be reported (an effect that
does not matter: DetectorConfig.min_effect); naming them is right, missing them is not a miss."""


def _required(res: ScenarioResult, i: int) -> bool:
    if res.expected[i].kind not in ("noncomm_slow", "comm_slow"):
        return True
    return res.true_slowdown is None or res.true_slowdown >= OPTIONAL_BELOW


def _bar(res: ScenarioResult, slow: bool) -> float | None:
    """The issue's latency bar for a fault of this run, in seconds: a slowdown of 1.2x or worse
    within 3 s or 3 training steps, whichever is longer; a hang (or a dead rank) within 15 s.
    None for a slowdown under 1.2x, which the bar does not time."""
    if not slow:
        return 15.0
    if (res.true_slowdown or 0.0) < 1.2:
        return None
    return max(3.0, 3.0 * res.step_s)


@dataclass(slots=True)
class SuiteReport:
    split: str
    results: list[ScenarioResult]
    wall_s: float

    def rows(self) -> list[dict[str, Any]]:
        """Per fault kind: the numbers the table prints."""
        out = []
        for kind in KINDS:
            every = [(res, i) for res in self.results for i, e in enumerate(res.expected) if e.kind == kind]
            faults = [(res, i) for res, i in every if _required(res, i)]
            optional = [(res, i) for res, i in every if not _required(res, i)]
            reps = [r for res in self.results for r in res.reported if r.kind == kind]
            right = [r for r in reps if r.match >= 0]
            lat = [float(x) for res, i in faults if (x := res.latency[i]) is not None]
            slow = kind in ("noncomm_slow", "comm_slow")
            # the bar (median within it)
            strong_res = [
                (float(x), bar)
                for res, i in faults
                if (x := res.latency[i]) is not None and (bar := _bar(res, slow)) is not None
            ]
            strong = [x for x, _ in strong_res]
            in_bar = [x <= bar for x, bar in strong_res]
            found = sum(1 for res, i in faults if res.latency[i] is not None)
            res_checks = [res.resolved[i] for res, i in faults if res.resolved[i] is not None]
            out.append(
                {
                    "kind": kind,
                    "faults": len(faults),
                    "found": found,
                    "recall": found / len(faults) if faults else math.nan,
                    "reported": len(reps),
                    "precision": len(right) / len(reps) if reps else math.nan,
                    "lat_med": float(np.median(lat)) if lat else math.nan,
                    "lat_p95": float(np.percentile(lat, 95)) if lat else math.nan,
                    "strong_n": len(strong),
                    "strong_med": float(np.median(strong)) if strong else math.nan,
                    "strong_p95": float(np.percentile(strong, 95)) if strong else math.nan,
                    "in_bar": sum(in_bar) / len(in_bar) if in_bar else math.nan,
                    "resolved": (sum(bool(x) for x in res_checks), len(res_checks)),
                    "optional": (sum(1 for res, i in optional if res.latency[i] is not None), len(optional)),
                }
            )
        return out

    def healthy(self) -> tuple[int, float, int]:
        runs = [r for r in self.results if r.healthy]
        hours = sum(r.duration for r in runs) / 3600.0
        return len(runs), hours, sum(len(r.reported) for r in runs)

    def slowdown_accuracy(self) -> list[dict[str, Any]]:
        """How the ``slowdown`` a suspect reports compares with what the job really lost.

        Over runs with one steady slow fault (no flapping, no recovery, no second fault: the job's
        loss is then that fault's) at least ``OPTIONAL_BELOW`` slower: per right suspect, the median
        of the slowdowns it reported over its life divided by the run's true slowdown
        (``job_slowdown``: the same steps timed with and without the fault). Per slow kind: n, the
        median ratio, its 5th and 95th percentiles, and the run furthest off either way.
        """
        out = []
        for kind in ("noncomm_slow", "comm_slow"):
            ratios: list[tuple[float, str]] = []
            for res in self.results:
                true = res.true_slowdown
                if not res.steady or res.expected[0].kind != kind:
                    continue
                if true is None or not math.isfinite(true) or true < OPTIONAL_BELOW:
                    continue
                mine = sorted((r for r in res.reported if r.match == 0 and r.slowdowns), key=lambda r: r.first)
                if mine:
                    ratios.append((float(np.median(mine[0].slowdowns)) / true, res.name))
            if not ratios:
                continue
            x = np.array([q for q, _ in ratios])
            worst = max(ratios, key=lambda t: abs(math.log(t[0])))
            out.append(
                {
                    "kind": kind,
                    "n": len(ratios),
                    "median": float(np.median(x)),
                    "p5": float(np.percentile(x, 5)),
                    "p95": float(np.percentile(x, 95)),
                    "within_10pct": int(np.sum(np.abs(x - 1.0) <= 0.1)),
                    "worst": worst,
                    "all": ratios,
                }
            )
        return out

    def table(self) -> str:
        lines = [
            f"split={self.split}  scenarios={len(self.results)}  wall={self.wall_s:.0f}s",
            "kind            faults  recall  reported  precision  latency med/p95 (s)"
            "  >=1.2x or hang: n  med/p95 (s)  in bar  resolved  <1.03x found",
        ]
        for r in self.rows():
            ok, n = r["resolved"]
            lines.append(
                f"{r['kind']:<15} {r['faults']:>6}  {_f(r['recall'])}  {r['reported']:>8}  {_f(r['precision']):>9}  "
                f"{_f(r['lat_med'], 1):>7} / {_f(r['lat_p95'], 1):<9}  {r['strong_n']:>18}  "
                f"{_f(r['strong_med'], 1):>4} / {_f(r['strong_p95'], 1):<5}  {_f(r['in_bar'], 2):>6}  {ok:>3}/{n:<4}  "
                f"{r['optional'][0]}/{r['optional'][1]}"
            )
        all_reps = [r for res in self.results for r in res.reported if not res.healthy]
        all_faults = [(res, i) for res in self.results for i in range(len(res.expected)) if _required(res, i)]
        right = sum(1 for r in all_reps if r.match >= 0)
        found = sum(1 for res, i in all_faults if res.latency[i] is not None)
        lines.append(
            f"{'all faults':<15} {len(all_faults):>6}  {_f(found / max(1, len(all_faults)))}  {len(all_reps):>8}  "
            f"{_f(right / max(1, len(all_reps))):>9}"
        )
        runs, hours, false = self.healthy()
        lines.append(
            f"healthy runs: {runs}, {hours:.2f} job-hours, {false} false suspects = "
            f"{false / hours if hours else math.nan:.2f} per job-hour"
        )
        rates = sorted({t for res in self.results for t in res.tags if t.endswith("/s")}, key=lambda s: float(s[:-2]))
        profs = sorted({res.tags[1] for res in self.results if len(res.tags) > 1})
        lines.append(f"op rates (nominal): {', '.join(rates)}; profiles: {', '.join(profs)}")
        lines.append(
            "in bar: share of the >=1.2x or hang detections within the issue's bar (a slowdown: 3 s or 3 training "
            "steps, whichever is longer; a hang or dead rank: 15 s); a median within the bar is a share of 0.5 or more"
        )
        for a in self.slowdown_accuracy():
            q, name = a["worst"]
            lines.append(
                f"slowdown reported / true, {a['kind']} (one steady fault, n={a['n']}): median {a['median']:.2f}, "
                f"5-95% {a['p5']:.2f}-{a['p95']:.2f}, within 10%: {a['within_10pct']} of {a['n']}, "
                f"furthest {q:.2f} ({name})"
            )
        return "\n".join(lines)

    def misses(self) -> str:
        """Scenarios with a missed fault or a false suspect, for tuning."""
        lines = []
        for res in self.results:
            miss = [i for i, lat in enumerate(res.latency) if lat is None and _required(res, i)]
            false = res.false_suspects
            if miss or false:
                missed = [(res.expected[i].kind, res.expected[i].level, res.expected[i].nodes) for i in miss]
                lines.append(
                    f"{res.name} {'/'.join(res.tags)} slowdown={res.true_slowdown} "
                    f"missed={missed} false={[(r.key, round(r.first, 1)) for r in false]}"
                )
        for a in self.slowdown_accuracy():
            for q, name in a["all"]:
                if abs(q - 1.0) > 0.25:
                    lines.append(f"{name} slowdown reported / true {q:.2f} ({a['kind']})")
        return "\n".join(lines)


def _f(x: float, nd: int = 3) -> str:
    return "  -  " if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"


def evaluate_suite(
    split: str = "tune",
    *,
    scenarios: Iterable[Scenario] | None = None,
    config: DetectorConfig | None = None,
    workers: int = 1,
    eval_every: float = EVAL_EVERY_S,
    only: str | None = None,
    progress: Callable[[ScenarioResult], None] | None = None,
) -> SuiteReport:
    """Run a split of the suite (or given scenarios) and collect the results.

    Args:
        split: ``smoke``, ``tune``, ``heldout`` or ``fresh`` (see ``rankwatch.sim.suite``).
        scenarios: run these instead of the split's.
        config: detector thresholds (default: ``DetectorConfig()``).
        workers: processes to run scenarios in.
        eval_every: seconds of simulated time between ``evaluate`` calls.
        only: run only scenarios whose name contains this.
        progress: called with each result as it completes.
    """
    scs = list(scenarios) if scenarios is not None else build_suite(split)
    if only:
        scs = [s for s in scs if only in s.name]
    t0 = time.perf_counter()
    results: list[ScenarioResult] = []
    if workers <= 1:
        for sc in scs:
            res = run_scenario(sc, config, eval_every=eval_every)
            results.append(res)
            if progress:
                progress(res)
    else:
        # big scenarios first so the pool ends evenly
        order = sorted(range(len(scs)), key=lambda i: -scs[i].layout.world * scs[i].duration)
        with ProcessPoolExecutor(workers) as pool:
            got: dict[int, ScenarioResult] = {}
            futs = {pool.submit(_run_one, (scs[i], config, eval_every)): i for i in order}
            for fut in futs:
                res = fut.result()
                got[futs[fut]] = res
                if progress:
                    progress(res)
            results = [got[i] for i in range(len(scs))]
    return SuiteReport(split=split, results=results, wall_s=time.perf_counter() - t0)
