"""``python -m rankwatch``: the same as the ``rankwatch`` command."""

import sys

from rankwatch.cli import main

sys.exit(main())
