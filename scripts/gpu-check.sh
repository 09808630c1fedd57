#!/usr/bin/env bash
# The checks that need a CUDA GPU and NCCL, which CI does not have: run on a GPU machine whose
# python3 has PyTorch with CUDA and rankwatch (with its dev test dependencies) installed.
#   bash scripts/gpu-check.sh [OUTDIR]     (each step's output is also written under OUTDIR)
# 1. the NCCL end-to-end test (tests/hooks/test_cuda.py): a real torchrun NCCL job, one rank per
#    GPU (at most 2), timed from CUDA events, its Flight Recorder dumped as a hung rank's would be;
# 2. the hooks' host overhead per collective on a one-rank NCCL group, then gloo on the same
#    machine for comparison (bench/hooks_overhead.py);
# 3. the rest of tests/hooks on this machine's PyTorch, if there is time (a version other than
#    the pinned one is a compatibility check).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
out=${1:-gpu-check}
mkdir -p "$out"
fail=0
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", ".".join(map(str, torch.cuda.nccl.version())), "gpus", torch.cuda.device_count())'
} 2>&1 | tee "$out/gpu.txt"
echo "== NCCL end-to-end test"
"$PY" -P -m pytest -p no:cacheprovider -m cuda -v tests/hooks/test_cuda.py 2>&1 | tee "$out/pytest-cuda.txt"
[ "${PIPESTATUS[0]}" = 0 ] || fail=1
grep -q "1 passed\|2 passed" "$out/pytest-cuda.txt" || { echo "gpu-check: the NCCL test did not run"; fail=1; }
echo "== hooks overhead, NCCL then gloo"
"$PY" bench/hooks_overhead.py --backend nccl --rounds "${ROUNDS:-30}" 2>&1 | tee "$out/overhead-nccl.txt"
[ "${PIPESTATUS[0]}" = 0 ] || fail=1
"$PY" bench/hooks_overhead.py --backend gloo --rounds "${ROUNDS:-30}" 2>&1 | tee "$out/overhead-gloo.txt"
[ "${PIPESTATUS[0]}" = 0 ] || fail=1
if [ -n "${HOOKS_TESTS_S:-}" ]; then
  echo "== tests/hooks on this PyTorch (at most ${HOOKS_TESTS_S} s)"
  timeout "$HOOKS_TESTS_S" "$PY" -P -m pytest -p no:cacheprovider -q -m "not cuda" tests/hooks 2>&1 | tee "$out/pytest-hooks.txt"
  [ "${PIPESTATUS[0]}" = 0 ] || fail=1
fi
echo "gpu-check: $([ $fail = 0 ] && echo passed || echo FAILED)"
exit $fail
