#!/usr/bin/env bash
# Set up (if needed) and run the demo: a short study on the repetitive example workload with
# the bundled demo model pair, on CPU with no downloads. Extra arguments go to `autotune search`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# --confirm: then serve the pick as exported and measure it with vllm bench serve (autotune confirm).
exec .venv/bin/autotune search examples/json_edit.jsonl --space quick --candidates 8 --study demo --confirm "$@"
