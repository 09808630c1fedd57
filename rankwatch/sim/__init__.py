"""The trace simulator: labelled jobs whose ranks send exactly the batches real hooks send.

A ``Scenario`` (``scenario``) is a layout of data x tensor x pipeline parallel groups on nodes of
eight (``layout``), the shape of a training step (``Workload``), healthy jitter (``Profile``) and
injected ``Fault``s (``faults``), all deterministic from a seed. ``engine`` computes every op of
every rank in true time; ``ship`` turns them into the ``wire.Batch``es each rank's shipper would
send (``deliveries``); ``blocks`` defines the sequence-aligned block summaries large jobs send
instead (``BlockBatch``) and ``stream`` produces them at scale. ``suite`` is the evaluation's
list of scenarios. Only the standard library and numpy are used: this package is part of the
core and never imports the detector.
"""

from __future__ import annotations

from rankwatch.sim.blocks import BLOCK_DTYPE, BlockBatch, from_batch, summarise
from rankwatch.sim.engine import save_after
from rankwatch.sim.faults import Expected, Fault
from rankwatch.sim.layout import GroupSpec, Layout, node_name
from rankwatch.sim.scenario import PROFILES, Profile, Scenario, Workload
from rankwatch.sim.ship import Delivery, deliveries

__all__ = [
    "BLOCK_DTYPE",
    "PROFILES",
    "BlockBatch",
    "Delivery",
    "Expected",
    "Fault",
    "GroupSpec",
    "Layout",
    "Profile",
    "Scenario",
    "Workload",
    "deliveries",
    "from_batch",
    "node_name",
    "save_after",
    "summarise",
]
