#!/usr/bin/env bash
# Sets up .venv and runs the demo: the service on SQLite plus a local 4-rank torchrun job with one slow rank.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/rankwatch demo "$@"
