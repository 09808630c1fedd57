#!/usr/bin/env bash
# mypy over the package as it installs (rankwatch.hooks lives in hooks/, and so on): the folders are
# copied into .typecheck/rankwatch/ and the paths in mypy's report are mapped back to the repository.
set -euo pipefail
cd "$(dirname "$0")/.."
MYPY=${MYPY:-.venv/bin/mypy}
rm -rf .typecheck && mkdir -p .typecheck/rankwatch
cp -r rankwatch/. .typecheck/rankwatch/
for d in hooks collector detector api; do cp -r "$d" ".typecheck/rankwatch/$d"; done
find .typecheck -name __pycache__ -prune -exec rm -rf {} +
cd .typecheck
status=0
"../$MYPY" --config-file ../pyproject.toml -p rankwatch 2>&1 \
  | sed -E 's#^rankwatch/(hooks|collector|detector|api)/#\1/#' || status=$?
exit "$status"
