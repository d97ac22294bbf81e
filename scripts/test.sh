#!/usr/bin/env bash
# Set up (if needed) and run the test suite: unit tests, fake-engine orchestration tests and
# end-to-end tests on the real vLLM CPU engine. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
eval "$(bash scripts/services.sh)"  # chromium and a PostgreSQL server for the report and shared-study tests
exec .venv/bin/python -m pytest -ra --durations=20 "$@"
