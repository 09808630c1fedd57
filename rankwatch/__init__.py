"""rankwatch: find the rank, node or link that is slowing or hanging a distributed training job.

This package is the core: the wire format between the hooks and the collector
(``rankwatch.wire``), environment variable names (``rankwatch.env``), errors
(``rankwatch.errors``) and the ``rankwatch`` command (``rankwatch.cli``). Its subpackages are
``rankwatch.hooks`` (inside training processes), ``rankwatch.collector``, ``rankwatch.detector``
and ``rankwatch.api`` (the service). Importing this package imports nothing else.
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__"]
