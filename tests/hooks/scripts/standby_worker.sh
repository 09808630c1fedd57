#!/bin/bash
# torchrun --no-python runs this for every worker. A worker torchrun restarts after rankwatch killed
# its replica group stands for the warmed standby that replaces it: it runs on a node of its own
# (<node>-standby) and without the fault the original node had.
if [ "${TORCHELASTIC_RESTART_COUNT:-0}" != 0 ]; then
  export RANKWATCH_NODE="${RANKWATCH_NODE}-standby"
  unset RANKWATCH_INJECT
fi
exec "$RANKWATCH_TEST_PYTHON" "$@"
