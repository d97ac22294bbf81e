#!/usr/bin/env bash
# Set up (if needed) and run the test suite: unit tests, fake-engine orchestration tests and
# end-to-end tests on the real vLLM CPU engine. Extra arguments go to pytest (one run, in order).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
eval "$(bash scripts/services.sh)"  # chromium and a PostgreSQL server for the report and shared-study tests
PYTEST=(.venv/bin/python -m pytest -ra --durations=20)
if [ $# -gt 0 ]; then
  exec "${PYTEST[@]}" "$@"
fi
# The whole suite in two runs. Tests that start no real engine, two at a time (pytest-xdist): what
# they time is the fake engine's simulated clock, never the machine's. Then the real-engine tests
# one at a time: two vLLM engines on a 2-core machine disturb each other's timings.
# On a GPU machine, tests marked cpu_only (facts of vLLM's CPU build, each with its reason) do not apply.
ONLY=""
if .venv/bin/python -c "import sys; from autotune.run import hardware; sys.exit(hardware.detect() != 'cuda')"; then
  ONLY=" and not cpu_only"
  echo "test.sh: CUDA platform: deselecting tests marked cpu_only"
fi
status=0
# The tests that start no engine run with vLLM's cache empty, as on a fresh machine: none of them may
# depend on what an engine test (or an earlier run) left in ~/.cache/vllm (its model-info cache: issue 59).
FRESH_CACHE=$(mktemp -d)
VLLM_CACHE_ROOT="$FRESH_CACHE" "${PYTEST[@]}" -m "not engine$ONLY" -n 2 || status=$?
rm -rf "$FRESH_CACHE"
"${PYTEST[@]}" -m "engine$ONLY" || status=$?
exit $status
