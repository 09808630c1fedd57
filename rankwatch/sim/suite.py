"""The evaluation suite: labelled scenarios, generated from seeds, in two disjoint splits.

``tune`` is what the detector's thresholds were tuned on. ``heldout`` was never run while tuning:
its seeds are different (``HELDOUT_SEED``), and so are some of its parameters — layouts
(``HELDOUT_LAYOUTS``), op rates (30 and 300 collectives per rank per second) and jitter profiles
(``HELDOUT_PROFILES``, stronger variants of the tuning ones). ``heldout``'s misses have since been
read while fixing the detector (2026-11-30), so it is no longer unseen: ``fresh`` has heldout's
parameters and new seeds (``FRESH_SEED``), and is only run to report, never to tune. ``fresh``
was in turn read (its misses are described in docs/detector.md), so ``unseen`` (added 2026-11-30,
before the detector changes of that day's fifth session) has seeds (``UNSEEN_SEED``), layouts
(``UNSEEN_LAYOUTS``), op rates (50 and 200 collectives per rank per second) and jitter profiles
(``UNSEEN_PROFILES``) that no other split uses. ``unseen``'s misses were read in turn (2026-11-30,
sixth session), so ``sealed`` (added that session before any detector change) has seeds
(``SEALED_SEED``), layouts (``SEALED_LAYOUTS``), op rates (20 and 150 collectives per rank per
second) and jitter profiles (``SEALED_PROFILES``) of its own; it is run only for the final tables
and its misses are not read to change the detector. ``smoke`` is a few seconds' worth for tests
and demos.

Each fault is placed where the topology should let the evidence tell it apart (a NIC on a node
that talks to at least two other nodes, a link between pipeline neighbours, a GPU's NIC on a rank
with traffic to two other ranks). That rule is coarse (it counts a ring's two neighbours on one
channel as two partners, and a pipeline group as a ring), so the evaluation does not take the
place as the answer: ``rankwatch.sim.evidence.expected_answer`` derives the finest answer the
evidence supports from the channels each place lies on.
Communication *hangs* are injected on pipeline links and on a node's NVLink only: when a NIC dies,
its node's ranks freeze in whichever transfer they were in, so the stuck evidence names that one
link (or, for a ring collective over many nodes, the whole ring) — see docs/detector.md.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from rankwatch.sim.faults import Fault
from rankwatch.sim.layout import Layout
from rankwatch.sim.scenario import PROFILES, Profile, Scenario, Workload

__all__ = [
    "FRESH_SEED",
    "HELDOUT_LAYOUTS",
    "HELDOUT_PROFILES",
    "HELDOUT_SEED",
    "LAYOUTS",
    "SEALED_LAYOUTS",
    "SEALED_PROFILES",
    "SEALED_SEED",
    "SPLITS",
    "UNSEEN_LAYOUTS",
    "UNSEEN_PROFILES",
    "UNSEEN_SEED",
    "build_suite",
]

LAYOUTS: dict[str, Layout] = {
    "tp4dp4": Layout(tp=4, pp=1, dp=4),  # 16 ranks, 2 nodes: every DP group is half on each node
    "tp2pp2dp4": Layout(tp=2, pp=2, dp=4),  # 16 ranks, a node is a pipeline stage
    "tp8pp2dp2": Layout(tp=8, pp=2, dp=2),  # 32 ranks, 4 nodes
    "tp2pp2dp8": Layout(tp=2, pp=2, dp=8),  # 32 ranks, 4 nodes
    "dp16": Layout(tp=1, pp=1, dp=16),  # pure data parallel
    "tp8pp4dp4": Layout(tp=8, pp=4, dp=4),  # 128 ranks, 16 nodes
}
HELDOUT_LAYOUTS: dict[str, Layout] = {
    "tp2pp4dp4": Layout(tp=2, pp=4, dp=4),  # 32 ranks, 4 nodes
    "tp4pp2dp8": Layout(tp=4, pp=2, dp=8),  # 64 ranks, 8 nodes
    "tp8dp8": Layout(tp=8, pp=1, dp=8),  # 64 ranks, 8 nodes
}
HELDOUT_PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        dataclasses.replace(PROFILES["cpu_noise"], name="cpu_noise+", cpu_sigma=0.1, net_sigma=0.1),
        dataclasses.replace(PROFILES["gc"], name="gc+", gc_rate=0.08, gc_s=0.3),
        dataclasses.replace(PROFILES["checkpoint"], name="checkpoint+", ckpt_every=25, ckpt_s=6.0, ckpt_skew_s=2.5),
        dataclasses.replace(PROFILES["data"], name="data+", step_sigma=0.3, rank_step_sigma=0.08),
        dataclasses.replace(PROFILES["everything"], name="everything+", gc_rate=0.05, cpu_sigma=0.07),
    )
}
UNSEEN_LAYOUTS: dict[str, Layout] = {
    "tp4pp4dp2": Layout(tp=4, pp=4, dp=2),  # 32 ranks, 4 nodes: a node is a pipeline stage
    "tp2pp2dp16": Layout(tp=2, pp=2, dp=16),  # 64 ranks, 8 nodes
    "tp8pp2dp4": Layout(tp=8, pp=2, dp=4),  # 64 ranks, 8 nodes
    "dp32": Layout(tp=1, pp=1, dp=32),  # 32 ranks, pure data parallel over 4 nodes
}
UNSEEN_PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        dataclasses.replace(
            PROFILES["cpu_noise"], name="cpu_noise~", cpu_sigma=0.09, net_sigma=0.09, net_spike_p=0.003
        ),
        dataclasses.replace(PROFILES["gc"], name="gc~", gc_rate=0.06, gc_s=0.25, cpu_sigma=0.05),
        dataclasses.replace(PROFILES["checkpoint"], name="checkpoint~", ckpt_every=30, ckpt_s=5.0, ckpt_skew_s=2.0),
        dataclasses.replace(PROFILES["data"], name="data~", step_sigma=0.2, rank_step_sigma=0.07),
        dataclasses.replace(PROFILES["first_step"], name="first_step~", first_step_x=8.0, init_s=1.5, cpu_sigma=0.05),
        dataclasses.replace(PROFILES["everything"], name="everything~", gc_rate=0.04, cpu_sigma=0.08, step_sigma=0.2),
    )
}
SEALED_LAYOUTS: dict[str, Layout] = {
    "tp4pp2dp4": Layout(tp=4, pp=2, dp=4),  # 32 ranks, 4 nodes
    "tp2pp4dp2": Layout(tp=2, pp=4, dp=2),  # 16 ranks, 2 nodes: a node holds two pipeline stages
    "tp8dp4": Layout(tp=8, pp=1, dp=4),  # 32 ranks, 4 nodes
    "dp24": Layout(tp=1, pp=1, dp=24),  # 24 ranks, pure data parallel over 3 nodes
}
SEALED_PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        dataclasses.replace(
            PROFILES["cpu_noise"],
            name="cpu_noise^",
            cpu_sigma=0.07,
            net_sigma=0.1,
            net_spike_p=0.004,
            hetero_sigma=0.02,
        ),
        dataclasses.replace(PROFILES["gc"], name="gc^", gc_rate=0.07, gc_s=0.18, cpu_sigma=0.04),
        dataclasses.replace(PROFILES["checkpoint"], name="checkpoint^", ckpt_every=20, ckpt_s=4.5, ckpt_skew_s=1.8),
        dataclasses.replace(PROFILES["data"], name="data^", step_sigma=0.28, rank_step_sigma=0.05),
        dataclasses.replace(PROFILES["first_step"], name="first_step^", first_step_x=10.0, init_s=2.0, cpu_sigma=0.04),
        dataclasses.replace(PROFILES["everything"], name="everything^", gc_rate=0.05, cpu_sigma=0.07, net_sigma=0.08),
    )
}
HELDOUT_SEED = 1_000_003
FRESH_SEED = 2_000_029
UNSEEN_SEED = 3_000_017
SEALED_SEED = 4_000_037
SPLITS = ("smoke", "tune", "heldout", "fresh", "unseen", "sealed")

_TUNE_PROFILES = ("quiet", "cpu_noise", "gc", "first_step", "checkpoint", "data", "everything")
_TUNE_RATES = (10.0, 100.0, 1000.0)
_HELDOUT_RATES = (30.0, 300.0)
_UNSEEN_RATES = (50.0, 200.0)
_SEALED_RATES = (20.0, 150.0)


def _big(lay: Layout, rate: float) -> bool:
    """A job simulated for less time (costly to simulate: many ranks, or many ops a second)."""
    return rate >= 500 or lay.world >= 64


def _onset(rng: np.random.Generator, lay: Layout, rate: float) -> float:
    """A fault's onset: 22-32 s into the run, or 18-22 s into the shorter run of a big job, so
    that at least 18 s of it follow the fault (a hang has 15 s to be named)."""
    return float(rng.uniform(18.0, 22.0)) if _big(lay, rate) else float(rng.uniform(22.0, 32.0))


def _scenario(
    name: str,
    lay_name: str,
    lay: Layout,
    rate: float,
    prof: Profile,
    faults: tuple[Fault, ...],
    seed: int,
    tags: tuple[str, ...],
    duration: float | None = None,
) -> Scenario:
    if duration is None:
        big = _big(lay, rate)
        duration = (40.0 if big else 60.0) if faults else (45.0 if big else 120.0)
    return Scenario(
        name=name,
        layout=lay,
        workload=Workload.for_rate(rate, lay),
        profile=prof,
        faults=faults,
        duration=duration,
        seed=seed,
        tags=(lay_name, prof.name, f"{rate:g}/s", *tags),
    )


def _inter_partners(lay: Layout, rank: int) -> set[int]:
    """Ranks on other nodes this rank exchanges data with (ring neighbours, pipeline peers)."""
    out: set[int] = set()
    for g in lay.groups[1:]:
        m = g.members.tolist()
        if rank not in m or len(m) < 2:
            continue
        i = m.index(rank)
        nb = {m[(i - 1) % len(m)], m[(i + 1) % len(m)]} if len(m) > 2 else {m[1 - i]}
        out |= {r for r in nb if lay.node_of(r) != lay.node_of(rank)}
    return out


def _places(lay: Layout) -> dict[str, list[tuple[int, ...]]]:
    """Where comm faults can go in this layout with an answer the evidence supports."""
    n_nodes = lay.n_nodes
    node_partners: dict[int, set[int]] = {n: set() for n in range(n_nodes)}
    for r in range(lay.world):
        node_partners[lay.node_of(r)] |= {lay.node_of(x) for x in _inter_partners(lay, r)}
    links: set[tuple[int, int]] = set()
    if lay.pp > 1:
        for p in range(lay.pp - 1):
            a, b = lay.stage_ranks(p).ravel(), lay.stage_ranks(p + 1).ravel()
            for x, y in zip(a.tolist(), b.tolist(), strict=True):
                na, nb = lay.node_of(x), lay.node_of(y)
                if na != nb:
                    links.add((min(na, nb), max(na, nb)))
    # a link is told apart from either end's NIC only if each end also talks to another node
    links = {(a, b) for a, b in links if len(node_partners[a]) >= 2 and len(node_partners[b]) >= 2} or (
        links if n_nodes == 2 else set()
    )
    nics: list[tuple[int, ...]] = [(n,) for n in range(n_nodes) if len(node_partners[n]) >= 2]
    rnics: list[tuple[int, ...]] = []
    for r in range(lay.world):
        partners = _inter_partners(lay, r)
        if len(partners) >= 2 and len({lay.node_of(x) for x in partners}) >= 1:
            rnics.append((r,))
    return {"link": [tuple(x) for x in sorted(links)], "nic": nics, "rnic": rnics}


def _faults_for(
    kind: str, lay: Layout, rng: np.random.Generator, onset: float, rate: float
) -> tuple[Fault, ...] | None:
    """One fault of ``kind`` at a random valid place; None if the layout has no such place."""
    world = lay.world
    n_nodes = lay.n_nodes

    def pick(xs: list[tuple[int, ...]]) -> tuple[int, ...] | None:
        return xs[int(rng.integers(len(xs)))] if xs else None

    rank = int(rng.integers(world))
    node = int(rng.integers(n_nodes))
    places = _places(lay)
    if kind == "straggler":
        return (
            Fault("slow_compute", "rank", ranks=(rank,), factor=float(rng.choice([1.2, 1.3, 1.5, 2.0])), onset=onset),
        )
    if kind == "straggler_mild":
        return (Fault("slow_compute", "rank", ranks=(rank,), factor=1.1, onset=onset),)
    if kind == "straggler_node":
        return (Fault("slow_compute", "node", nodes=(node,), factor=float(rng.choice([1.1, 1.2, 1.5])), onset=onset),)
    if kind == "straggler_flap":
        on, off = float(rng.choice([6.0, 10.0])), float(rng.choice([6.0, 10.0]))
        return (Fault("slow_compute", "rank", ranks=(rank,), factor=1.5, onset=onset, flap=(on, off)),)
    if kind == "straggler_ends":
        return (Fault("slow_compute", "rank", ranks=(rank,), factor=1.5, onset=onset, duration=15.0),)
    if kind == "two_stragglers":
        other = (rank + lay.gpus_per_node * (1 + int(rng.integers(max(1, n_nodes - 1))))) % world
        if lay.node_of(other) == lay.node_of(rank):
            return None
        return (
            Fault("slow_compute", "rank", ranks=(rank,), factor=1.5, onset=onset),
            Fault("slow_compute", "rank", ranks=(other,), factor=1.3, onset=onset + 5.0),
        )
    if kind in ("slow_link", "slow_nic", "slow_rnic"):
        where = {"slow_link": "link", "slow_nic": "nic", "slow_rnic": "rnic"}[kind]
        pl = pick(places[where])
        if pl is None:
            return None
        factor = float(rng.choice([3.0, 5.0])) if where == "link" else float(rng.choice([2.0, 3.0]))
        if where == "rnic":
            return (Fault("slow_comm", "rnic", ranks=pl, factor=factor, onset=onset),)
        return (Fault("slow_comm", where, nodes=pl, factor=factor, onset=onset),)
    if kind == "slow_link_and_straggler":
        pl = pick(places["link"])
        if pl is None:
            return None
        far = [r for r in range(world) if lay.node_of(r) not in pl]
        if not far:
            return None
        r2 = far[int(rng.integers(len(far)))]
        return (
            Fault("slow_comm", "link", nodes=pl, factor=4.0, onset=onset),
            Fault("slow_compute", "rank", ranks=(r2,), factor=1.5, onset=onset + 3.0),
        )
    if kind == "hang_rank":
        return (Fault("hang_compute", "rank", ranks=(rank,), onset=onset),)
    if kind == "hang_node":
        return (Fault("hang_compute", "node", nodes=(node,), onset=onset),)
    if kind == "hang_link":
        pl = pick(places["link"])
        if pl is None:
            return None
        return (Fault("hang_comm", "link", nodes=pl, onset=onset),)
    if kind == "hang_nvl":
        if lay.tp < 2:
            return None
        return (Fault("hang_comm", "nvl", nodes=(node,), onset=onset),)
    if kind == "stop_rank":
        return (Fault("stop", "rank", ranks=(rank,), onset=onset),)
    if kind == "stop_node":
        return (Fault("stop", "node", nodes=(node,), onset=onset),)
    if kind == "crash":
        return (Fault("crash", "rank", ranks=(rank,), onset=onset, kill_after=float(rng.choice([0.5, 2.0, 5.0]))),)
    if kind == "crash_silent":
        return (
            Fault("crash", "rank", ranks=(rank,), onset=onset, silent=True, kill_after=float(rng.choice([1.0, 3.0]))),
        )
    raise ValueError(f"unknown fault class {kind!r}")


FAULT_CLASSES = (
    "straggler",
    "straggler_mild",
    "straggler_node",
    "straggler_flap",
    "straggler_ends",
    "two_stragglers",
    "slow_link",
    "slow_nic",
    "slow_rnic",
    "slow_link_and_straggler",
    "hang_rank",
    "hang_node",
    "hang_link",
    "hang_nvl",
    "stop_rank",
    "stop_node",
    "crash",
    "crash_silent",
)


def build_suite(split: str = "tune", *, per_class: int | None = None, healthy: int | None = None) -> list[Scenario]:
    """The scenarios of one split.

    Args:
        split: ``smoke``, ``tune``, ``heldout``, ``fresh``, ``unseen`` or ``sealed``.
        per_class: scenarios per fault class (default: 10 for ``tune``, 5 for ``heldout``, ``fresh``,
            ``unseen`` and ``sealed``, 1 for ``smoke``).
        healthy: healthy runs (default: 36 for ``tune``, 16 for ``heldout``, ``fresh``, ``unseen``
            and ``sealed``, 2 for ``smoke``).
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}")
    rates: tuple[float, ...]
    if split in ("heldout", "fresh"):
        seed0 = HELDOUT_SEED if split == "heldout" else FRESH_SEED
        layouts, profiles, rates = HELDOUT_LAYOUTS, list(HELDOUT_PROFILES.values()), _HELDOUT_RATES
        per_class = 5 if per_class is None else per_class
        healthy = 16 if healthy is None else healthy
    elif split in ("unseen", "sealed"):
        if split == "unseen":
            seed0 = UNSEEN_SEED
            layouts, profiles, rates = UNSEEN_LAYOUTS, list(UNSEEN_PROFILES.values()), _UNSEEN_RATES
        else:
            seed0 = SEALED_SEED
            layouts, profiles, rates = SEALED_LAYOUTS, list(SEALED_PROFILES.values()), _SEALED_RATES
        per_class = 5 if per_class is None else per_class
        healthy = 16 if healthy is None else healthy
    else:
        layouts = LAYOUTS
        profiles = [PROFILES[p] for p in _TUNE_PROFILES]
        rates, seed0 = _TUNE_RATES, 0
        per_class = (1 if split == "smoke" else 10) if per_class is None else per_class
        healthy = (2 if split == "smoke" else 36) if healthy is None else healthy
        if split == "smoke":
            layouts = {"tp4dp4": LAYOUTS["tp4dp4"], "tp8pp2dp2": LAYOUTS["tp8pp2dp2"]}
            rates = (100.0,)
    rng = np.random.default_rng(np.random.SeedSequence([seed0, 7]))
    lay_names = list(layouts)
    out: list[Scenario] = []

    def draw(big_ok: bool) -> tuple[str, Layout, float, Profile]:
        while True:
            ln = lay_names[int(rng.integers(len(lay_names)))]
            lay = layouts[ln]
            rate = float(rates[int(rng.integers(len(rates)))])
            if (lay.world > 16 and rate >= 500) or (lay.world >= 64 and rate > 100):
                continue  # keep the suite's cost sane: the highest rates on the smaller jobs
            if lay.world >= 100 and not big_ok:
                continue
            return ln, lay, rate, profiles[int(rng.integers(len(profiles)))]

    for i in range(healthy):
        ln, lay, rate, prof = draw(True)
        out.append(_scenario(f"{split}-healthy-{i:03d}", ln, lay, rate, prof, (), seed0 + 10_000 + i, ("healthy",)))
    for cls in FAULT_CLASSES:
        made = 0
        tries = 0
        while made < per_class and tries < 50 * per_class:
            tries += 1
            ln, lay, rate, prof = draw(made % 4 == 3)
            faults = _faults_for(cls, lay, rng, _onset(rng, lay, rate), rate)
            if faults is None:
                continue
            seed = seed0 + 20_000 + 100 * FAULT_CLASSES.index(cls) + made
            out.append(_scenario(f"{split}-{cls}-{made:03d}", ln, lay, rate, prof, faults, seed, (cls,)))
            made += 1
    return out
