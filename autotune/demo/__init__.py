"""The bundled demo model pair: a Llama target and a 1-layer draft sharing one tokenizer.

Trained by ``scripts/train_demo_models.py`` on the corpus of ``autotune.demo.corpus``;
loaded from the package, no downloads.
"""

from __future__ import annotations

from pathlib import Path

MODELS = Path(__file__).resolve().parent / "models"
TARGET = MODELS / "target"
DRAFT = MODELS / "draft"
MAX_MODEL_LEN = 1024


def available() -> bool:
    return (TARGET / "model.safetensors").is_file() and (DRAFT / "model.safetensors").is_file()
