#!/usr/bin/env bash
# Creates .venv with rankwatch installed (as users install it: a wheel, not an editable tree) and
# torch 2.13.0, the CPU build. Usage: scripts/setup.sh [extras]   e.g. scripts/setup.sh dev
set -euo pipefail
cd "$(dirname "$0")/.."
extras=${1:-}
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  for cand in python3.11 python3; do command -v "$cand" >/dev/null && { PY=$cand; break; }; done
fi
[ -n "$PY" ] || { echo "setup: no python3 found" >&2; exit 1; }

if [ ! -x .venv/bin/python ]; then
  if ! "$PY" -m venv .venv 2>/dev/null; then
    # Debian ships venv separately
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
      rm -rf .venv && "$PY" -m venv .venv
    else
      echo "setup: '$PY -m venv' failed; install python3-venv" >&2; exit 1
    fi
  fi
fi
pip() { .venv/bin/python -m pip -q --disable-pip-version-check "$@"; }
spec="."
[ -n "$extras" ] && spec=".[${extras}]"
# torch is pinned to the CPU build that 2.13.0 resolves to here; the package itself only asks for torch>=2.6
# a build/ left by an older checkout would ship files that no longer exist (an old migration, say)
rm -rf build
pip install "torch==2.13.0" "$spec"
if [ "$extras" = "dev" ]; then
  pip install "torchft==0.2.0" "opentelemetry-api>=1.39" "opentelemetry-sdk>=1.39" "opentelemetry-exporter-otlp-proto-http>=1.39"
fi
.venv/bin/python -c "import torch, rankwatch; print('setup: rankwatch', rankwatch.__version__, 'with torch', torch.__version__)"
