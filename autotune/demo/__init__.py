"""The bundled demo model pair: a Llama target and a 1-layer draft sharing one tokenizer, and the
target's EAGLE-3 head.

Trained by ``scripts/train_demo_models.py`` (the pair) and ``scripts/train_eagle3.py`` (the head) on
the corpus of ``autotune.demo.corpus``; loaded from the package, no downloads.
"""

from __future__ import annotations

from pathlib import Path

MODELS = Path(__file__).resolve().parent / "models"
TARGET = MODELS / "target"
DRAFT = MODELS / "draft"
EAGLE3 = MODELS / "eagle3"  # the target's EAGLE-3 head (vLLM method eagle3)
MAX_MODEL_LEN = 1024
# vLLM's "auto" downcasts float32 checkpoints to bfloat16 on CPU; measured on this pair
# (smoke workload, concurrency 1), bfloat16 cut draft acceptance from 0.81 to 0.64.
DTYPE = "float32"
# KV cache for tests that set up the pair by hand: all three models, 16 requests of MAX_MODEL_LEN
# tokens in flight, twice over, is 352 MiB (autotune.core.kv_budget; tests/test_kv_budget.py).
KV_CACHE_BYTES = 512 * 2**20


def available() -> bool:
    return (TARGET / "model.safetensors").is_file() and (DRAFT / "model.safetensors").is_file()


def eagle3_available() -> bool:
    return (EAGLE3 / "model.safetensors").is_file() and (EAGLE3 / "config.json").is_file()


DFLASH = MODELS / "dflash"  # the target's DFlash block drafter (vLLM method dflash)


def dflash_available() -> bool:
    return (DFLASH / "model.safetensors").is_file() and (DFLASH / "config.json").is_file()
