#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh Debian machine, then runs all of it:
# ruff (lint + format), mypy, and pytest (real torchrun jobs, a real service, real receivers,
# a real PostgreSQL server).
# Run as root for the Debian packages; CI runs exactly this (see .ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)

# Debian packages the tests use (installed only when missing; needs root)
need=()
command -v ip >/dev/null || need+=(iproute2)
command -v tc >/dev/null || need+=(iproute2)
command -v slurmctld >/dev/null || need+=(slurmctld slurmd slurm-client munge)   # a real Slurm (scripts/slurm.sh)
# a real PostgreSQL server for the storage and API tests (tests/pgserver.py starts one on loopback)
ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || need+=(postgresql)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  else
    echo "test: missing ${need[*]} (run as root to install them)" >&2
  fi
fi

bash scripts/setup.sh dev

echo "== ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "== mypy"
bash scripts/typecheck.sh
echo "== pytest"
.venv/bin/pytest "$@"
echo "== all checks passed in $(( $(date +%s) - start ))s"
