"""Split this host's devices between parallel workers: each trial sees only its worker's share.

GPU hosts: ``CUDA_VISIBLE_DEVICES`` slices. CPU hosts: ``VLLM_CPU_OMP_THREADS_BIND`` slices of the
cores this process may use (vLLM's CPU backend binds its OpenMP threads to them), so two engines
measured at once do not fight for the same cores.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from autotune.core.errors import BadInput


def _gpus() -> list[str]:
    if os.environ.get("CUDA_VISIBLE_DEVICES"):
        return [d.strip() for d in os.environ["CUDA_VISIBLE_DEVICES"].split(",") if d.strip()]
    if shutil.which("nvidia-smi"):
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
        return [str(i) for i, line in enumerate(out.splitlines()) if line.startswith("GPU ")]
    return []


def partition(workers: int, platform: str, per_worker: int = 1) -> list[dict[str, str]]:
    """The environment of each of ``workers`` workers; ``per_worker``: devices one engine needs (GPU)."""
    if workers == 1:
        return [{}]
    if platform == "cuda":
        ids, var, what = _gpus(), "CUDA_VISIBLE_DEVICES", "GPUs"
        size = per_worker
    else:
        ids, var, what = [str(c) for c in sorted(os.sched_getaffinity(0))], "VLLM_CPU_OMP_THREADS_BIND", "cores"
        size = len(ids) // workers
    if size < 1 or size * workers > len(ids):
        raise BadInput(f"--workers {workers}: this host has {len(ids)} {what} ({','.join(ids) or 'none'}), "
                       f"not enough for {workers} workers of {max(size, 1)} each")
    return [{var: ",".join(ids[i * size:(i + 1) * size])} for i in range(workers)]
