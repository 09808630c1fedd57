"""The ``rankwatch`` command (placeholder until the service lands)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from rankwatch import __version__

    print(__version__)
    return 0


if __name__ == "__main__":
    sys.exit(main())
