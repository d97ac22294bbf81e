"""GPU memory before an engine starts, read through NVML: the preflight before the baseline and the
wait for the previous trial's engine to give its memory back.

vLLM refuses to start when a device's free memory is below ``gpu_memory_utilization`` x its total
(``vllm/v1/worker/utils.py`` ``request_memory``: ``ceil(total * utilization)``, checked on every
device the engine uses). Another process on the GPU would turn every trial into a failed candidate
with no hint why; a study of fresh engines per trial would race the previous engine's teardown.
NVML (vLLM ships ``vllm/third_party/pynvml.py``) reads memory without initialising CUDA, and sees
physical devices whatever ``CUDA_VISIBLE_DEVICES`` says, so visible ids are mapped here as vLLM's
``NvmlCudaPlatform.device_control_id_to_physical_device_id`` maps them (an index, or a UUID).
Tests pass a fake NVML module (no GPU at hand); on a GPU this is untested.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from autotune.core.errors import BadInput

GIB = 1024 ** 3
# vLLM 0.32's CacheConfig.gpu_memory_utilization default (vllm/config/cache.py), for engines given none.
DEFAULT_UTILIZATION = 0.92
RELEASE_TIMEOUT_S = 120.0  # how long a trial waits for the previous engine's memory before it is failed


def _nvml() -> Any:
    from vllm.third_party import pynvml

    return pynvml


@dataclass(frozen=True)
class Device:
    """One GPU as NVML sees it now."""

    id: str  # as CUDA_VISIBLE_DEVICES names it
    total: int  # bytes
    free: int
    holders: tuple[str, ...]  # "pid 1234 (python3, 20.0 GiB)", where NVML tells

    def requested(self, utilization: float) -> int:
        return math.ceil(self.total * utilization)


def visible(env: dict[str, str] | None = None, devices: int = 1) -> list[str] | None:
    """The device ids one engine of a worker with ``env`` uses: its first ``devices`` visible
    devices (None: the first devices NVML counts, none being hidden)."""
    spec = (env or {}).get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"))
    if spec is None:
        return None
    return [d.strip() for d in spec.split(",") if d.strip()][:devices]


def engine_devices(kwargs: dict[str, Any]) -> int:
    """Devices one engine with engine arguments ``kwargs`` spans: tensor x pipeline x data parallel,
    as the preflight counts them (autotune.core.serving_flags.ServingFlags.devices_per_engine)."""
    n = 1
    for key in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
        value = kwargs.get(key)
        n *= value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 1
    return n


def _text(x: Any) -> str:
    return x.decode(errors="replace") if isinstance(x, bytes) else str(x)


def _holders(nv: Any, handle: Any) -> tuple[str, ...]:
    try:
        procs = nv.nvmlDeviceGetComputeRunningProcesses(handle)
    except Exception:  # noqa: BLE001 - NVML may not tell (containers, old drivers): name nobody
        return ()
    out = []
    for p in procs:
        try:
            name = os.path.basename(_text(nv.nvmlSystemGetProcessName(p.pid)))
        except Exception:  # noqa: BLE001 - another PID namespace: the pid is all there is
            name = "?"
        used = getattr(p, "usedGpuMemory", None)
        out.append(f"pid {p.pid} ({name}" + (f", {used / GIB:.1f} GiB)" if isinstance(used, int) else ")"))
    return tuple(out)


def read(ids: list[str] | None, *, count: int = 1, nvml: Any = None) -> list[Device]:
    """NVML's view of devices ``ids`` (visible ids; None: the first ``count`` NVML devices)."""
    nv = nvml or _nvml()
    nv.nvmlInit()
    try:
        if ids is None:
            ids = [str(i) for i in range(min(count, nv.nvmlDeviceGetCount()))]
        devices = []
        for d in ids:
            handle = nv.nvmlDeviceGetHandleByIndex(int(d)) if d.isdigit() else nv.nvmlDeviceGetHandleByUUID(d)
            mem = nv.nvmlDeviceGetMemoryInfo(handle)
            devices.append(Device(d, int(mem.total), int(mem.free), _holders(nv, handle)))
        return devices
    finally:
        nv.nvmlShutdown()


def short(devices: list[Device], utilization: float) -> list[Device]:
    """The devices whose free memory is below what an engine at ``utilization`` asks of each."""
    return [d for d in devices if d.free < d.requested(utilization)]


def describe(d: Device, utilization: float) -> str:
    held = f"; held by {', '.join(d.holders)}" if d.holders else ""
    return (f"GPU {d.id} has {d.free / GIB:.1f} of {d.total / GIB:.1f} GiB free, an engine at "
            f"gpu_memory_utilization {utilization:g} asks for {d.requested(utilization) / GIB:.1f} GiB{held}")


def preflight(envs: list[dict[str, str]], utilization: float | None, *, devices: int = 1,
              nvml: Any = None) -> None:
    """Before the baseline: BadInput (one line, exit 2) when any worker's engine cannot fit its
    ``devices`` devices (tensor x pipeline x data parallel)."""
    util = utilization if utilization is not None else DEFAULT_UTILIZATION
    for env in envs:
        lacking = short(read(visible(env, devices), count=devices, nvml=nvml), util)
        if lacking:
            d = lacking[0]
            fits = math.floor(d.free / d.total * 100) / 100
            raise BadInput(f"GPU memory: {describe(d, util)}: end those processes or lower "
                           f"--gpu-memory-utilization to {fits:g} or less")


def asked_by(job: dict[str, Any]) -> tuple[float | None, int]:
    """(gpu_memory_utilization, devices) a worker job's process will ask of its GPUs: an engine's from
    its engine arguments; a job that runs no vLLM engine (the EAGLE-3 trace: the target in torch on the
    worker's GPU) says it in ``gpu_memory`` (the study's utilization and devices per engine)."""
    kw = job.get("engine_kwargs")
    if isinstance(kw, dict):
        return kw.get("gpu_memory_utilization"), engine_devices(kw)
    asked = job.get("gpu_memory") or {}
    return asked.get("utilization"), int(asked.get("devices") or 1)


def wait_released(env: dict[str, str] | None, utilization: float | None, *, devices: int = 1,
                  timeout_s: float = RELEASE_TIMEOUT_S, nvml: Any = None,
                  sleep: Callable[[float], None] = time.sleep,
                  clock: Callable[[], float] = time.monotonic) -> str | None:
    """Before a trial's engine: wait up to ``timeout_s`` until its ``devices`` devices have the memory it
    asks for (the previous engine's teardown releases it late). None when they do, else why not, in one line."""
    util = utilization if utilization is not None else DEFAULT_UTILIZATION
    ids, start = visible(env, devices), clock()
    while True:
        lacking = short(read(ids, count=devices, nvml=nvml), util)
        if not lacking:
            return None
        if clock() - start >= timeout_s:
            return f"GPU memory not released within {timeout_s:.0f}s: {describe(lacking[0], util)}"
        sleep(1.0)
