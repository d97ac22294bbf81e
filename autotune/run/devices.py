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


BIND = "VLLM_CPU_OMP_THREADS_BIND"


def partition(workers: int, platform: str, per_worker: int = 1) -> list[dict[str, str]]:
    """The environment of each of ``workers`` workers; ``per_worker``: devices one engine needs (GPU:
    tensor x pipeline x data parallel; N workers of T devices each take N x T GPUs, or are refused)."""
    if platform == "cuda":
        ids, var, what = _gpus(), "CUDA_VISIBLE_DEVICES", "GPUs"
        size = per_worker
        if workers == 1 and (size == 1 or not ids or size <= len(ids)):
            return [{}]  # one engine sees every device (none listed here: vLLM finds out)
    else:
        if workers == 1:
            return [{}]
        ids, var, what = [str(c) for c in sorted(os.sched_getaffinity(0))], BIND, "cores"
        size = len(ids) // workers
    if size < 1 or size * workers > len(ids):
        each = f"{max(size, 1)} each" + (f" (tensor x pipeline x data parallel {per_worker})" if per_worker > 1 else "")
        raise BadInput(f"--workers {workers}: this host has {len(ids)} {what} ({','.join(ids) or 'none'}), "
                       f"not enough for {workers} worker(s) of {each}")
    return [{var: ",".join(ids[i * size:(i + 1) * size])} for i in range(workers)]


def bind_ranks(envs: list[dict[str, str]], platform: str, ranks: int) -> tuple[list[dict[str, str]], str | None]:
    """On CPU, an engine of several ranks (tensor/pipeline/data parallel) with a core list per rank.

    vLLM's CPU autobind gives each rank a NUMA node of its own ("Not enough allowed NUMA nodes to bind
    threads of 2 local CPUWorkers" on a one-node machine); ``VLLM_CPU_OMP_THREADS_BIND`` with one
    list a rank, ``|``-separated (vllm.utils.ompmultiprocessing), binds them on any machine. Each
    worker's cores (its share, or every core this process may use) are split evenly between the
    ranks. A binding the user set is kept. Returns the environments and one line saying what was set."""
    if platform != "cpu" or ranks == 1 or os.environ.get(BIND):
        return envs, None
    out = []
    for env in envs:
        cores = env[BIND].split(",") if env.get(BIND) else [str(c) for c in sorted(os.sched_getaffinity(0))]
        size = len(cores) // ranks
        if size < 1:
            raise BadInput(f"serving flags: {ranks} ranks (tensor x pipeline x data parallel) need a core each; "
                           f"{'each worker has' if len(envs) > 1 else 'this process may use'} {len(cores)} "
                           f"({','.join(cores)})")
        out.append({**env, BIND: "|".join(",".join(cores[i * size:(i + 1) * size]) for i in range(ranks))})
    return out, (f"{ranks} ranks on CPU: {BIND}={out[0][BIND]}" + (" (first worker)" if len(out) > 1 else "")
                 + ", a core list per rank (vLLM's autobind wants a NUMA node per rank)")
