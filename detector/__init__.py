"""The detector: which rank, node or link is slowing or hanging a job, from its batches alone.

Pure analysis over numpy arrays — no I/O, no clock reads, no globals — so the same code runs in
the collector, in the simulator and in benchmarks. One ``JobDetector`` per job::

    det = JobDetector(DetectorConfig())
    det.observe(batch, received_at)        # a raw wire.Batch (or det.observe_blocks(block_batch, t))
    findings = det.evaluate(now)           # list[Finding]: the suspects active now
    det.ready(now)                         # enough fresh data analysed to decide (after a restart)

The five kinds (``noncomm_slow``, ``comm_slow``, ``noncomm_hang``, ``comm_hang``, ``rank_dead``)
and how each is found are described in ``docs/detector.md``; the modules are ``cells``
(aligning members), ``lateness``, ``transfer``, ``hangs``, ``liveness``, ``localise`` and ``job``.
"""

from __future__ import annotations

from rankwatch.detector.config import DetectorConfig
from rankwatch.detector.finding import KINDS, LEVELS, Finding
from rankwatch.detector.job import JobDetector

__all__ = ["KINDS", "LEVELS", "DetectorConfig", "Finding", "JobDetector"]
