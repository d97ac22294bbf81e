"""GPU memory preflight and the wait between trials (autotune.run.gpu_memory), with NVML FAKED.

No GPU is at hand: a fake NVML module object stands in for vLLM's bundled pynvml (the same
function names and record fields), and autotune.run.hardware is told the platform is CUDA.
"""

import os
import sys
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from autotune.cli.app import app
from autotune.core.errors import BadInput
from autotune.run import gpu_memory, hardware
from autotune.run.gpu_memory import GIB, preflight, wait_released
from autotune.run.worker import run_trial


class FakeNVML:
    """NVML as vllm/third_party/pynvml.py answers it: handles by index or UUID, memory, processes."""

    def __init__(self, *devices):
        # each device: (total GiB, free GiB, [(pid, name, used GiB)])
        self.devices = [list(d) for d in devices]
        self.reads = 0
        self.inits = self.shutdowns = 0

    def nvmlInit(self):
        self.inits += 1

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetHandleByUUID(self, uuid):
        return int(uuid.rsplit("-", 1)[1])

    def nvmlDeviceGetMemoryInfo(self, h):
        self.reads += 1
        total, free, _ = self.devices[h]
        return SimpleNamespace(total=int(total * GIB), free=int(free * GIB), used=int((total - free) * GIB))

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [SimpleNamespace(pid=pid, usedGpuMemory=int(used * GIB)) for pid, _, used in self.devices[h][2]]

    def nvmlSystemGetProcessName(self, pid):
        return next(f"/usr/bin/{n}".encode() for d in self.devices for p, n, _ in d[2] if p == pid)


def test_preflight_passes_when_each_engine_fits():
    nv = FakeNVML((80, 79, []))
    preflight([{}], None, nvml=nv)  # vLLM's default 0.92 x 80 = 73.6 GiB <= 79 free
    assert nv.inits == nv.shutdowns == 1


def test_preflight_names_the_processes_holding_the_gpu():
    nv = FakeNVML((80, 30, [(4242, "python3", 49.5)]))
    with pytest.raises(BadInput) as e:
        preflight([{}], 0.9, nvml=nv)
    line = str(e.value)
    assert line == ("GPU memory: GPU 0 has 30.0 of 80.0 GiB free, an engine at gpu_memory_utilization 0.9 asks for "
                    "72.0 GiB; held by pid 4242 (python3, 49.5 GiB): end those processes or lower "
                    "--gpu-memory-utilization to 0.37 or less")
    preflight([{}], 0.37, nvml=nv)  # the suggested utilization fits


def test_preflight_checks_each_workers_own_devices_tensor_parallel_included():
    # two workers of tensor parallel 2: devices 0,1 and 2,3; device 3 is held
    nv = FakeNVML((80, 79, []), (80, 79, []), (80, 79, []), (80, 10, [(7, "other", 69)]), (80, 0, []))
    envs = [{"CUDA_VISIBLE_DEVICES": "0,1"}, {"CUDA_VISIBLE_DEVICES": "2,3"}]
    preflight(envs, None, devices=1, nvml=nv)  # tensor parallel 1: devices 0 and 2 only
    with pytest.raises(BadInput, match="GPU 3 has 10.0 of 80.0 GiB free"):
        preflight(envs, None, devices=2, nvml=nv)
    # a UUID in CUDA_VISIBLE_DEVICES is found by UUID (device 4 here); device 4 is full
    with pytest.raises(BadInput, match="GPU GPU-fake-4 has 0.0 of 80.0"):
        preflight([{"CUDA_VISIBLE_DEVICES": "GPU-fake-4"}], None, nvml=nv)


def test_no_cuda_visible_devices_means_the_first_devices_nvml_counts(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    nv = FakeNVML((80, 79, []), (80, 0, []))
    preflight([{}], None, devices=1, nvml=nv)
    with pytest.raises(BadInput, match="GPU 1 has 0.0"):
        preflight([{}], None, devices=2, nvml=nv)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # the parent's own setting, where a worker sets none
    with pytest.raises(BadInput, match="GPU 1 has 0.0"):
        preflight([{}], None, nvml=nv)


class Releasing(FakeNVML):
    """The previous engine gives its memory back after ``after`` reads."""

    def __init__(self, after):
        super().__init__((80, 5, [(99, "python3", 75)]))
        self.after = after

    def nvmlDeviceGetMemoryInfo(self, h):
        if self.reads >= self.after:
            self.devices[0][1:] = [79, []]
        return super().nvmlDeviceGetMemoryInfo(h)


def test_the_wait_ends_when_the_previous_engine_releases_its_memory():
    clock, slept = [0.0], []

    def sleep(s):
        slept.append(s)
        clock[0] += s

    assert wait_released({}, None, nvml=Releasing(3), sleep=sleep, clock=lambda: clock[0]) is None
    assert len(slept) == 3
    why = wait_released({}, None, timeout_s=10, nvml=Releasing(1000), sleep=sleep, clock=lambda: clock[0])
    assert why == ("GPU memory not released within 10s: GPU 0 has 5.0 of 80.0 GiB free, an engine at "
                   "gpu_memory_utilization 0.92 asks for 73.6 GiB; held by pid 99 (python3, 75.0 GiB)")


FAKE_ENGINE_OK = '''
def run_job(job, phase):
    return {"fake": True}
'''


@pytest.mark.parametrize("released_after", [2, None])
def test_a_trial_waits_for_the_memory_before_its_worker_starts(tmp_path, monkeypatch, released_after):
    # On the FAKE CUDA platform: run_trial waits on NVML before it starts the worker (a fake engine).
    (tmp_path / "ok_engine.py").write_text(FAKE_ENGINE_OK)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    monkeypatch.setattr(hardware, "detect", lambda: "cuda")
    nv = Releasing(released_after if released_after is not None else 10 ** 6)
    monkeypatch.setattr(gpu_memory, "_nvml", lambda: nv)
    monkeypatch.setattr(gpu_memory, "RELEASE_TIMEOUT_S", 3.0)
    job = {"engine_kwargs": {"model": "m", "gpu_memory_utilization": 0.5}, "requests": [],
           "replay": {"load": {"kind": "batch"}}, "engine_module": "ok_engine"}
    out = run_trial(job, tmp_path / "t", timeout_s=60, python=sys.executable)
    if released_after is not None:
        assert out.failure is None and out.raw == {"fake": True} and nv.reads == released_after + 1
    else:
        assert out.raw is None and out.failure.startswith("GPU memory not released within 3s: GPU 0 has 5.0 of 80.0")
        assert not (tmp_path / "t" / "events.jsonl").exists()  # no worker was started


def test_search_stops_before_the_baseline_when_the_gpu_is_held(tmp_path, monkeypatch):
    monkeypatch.setattr(hardware, "detect", lambda: "cuda")
    monkeypatch.setattr(gpu_memory, "_nvml", lambda: FakeNVML((24, 20, [(555, "Xorg", 3.9)])))
    monkeypatch.setattr("autotune.cli.search.ENGINE", "no_such_engine_module")
    r = CliRunner().invoke(app, ["search", "examples/smoke.jsonl", "--model", "fake-model", "--space",
                                 "tests/data/fake_space.yaml", "--results", str(tmp_path / "results")])
    assert r.exit_code == 2, r.output
    text = r.stderr.replace("\n", "")
    assert text.startswith("error: GPU memory: GPU 0 has 20.0 of 24.0 GiB free") and "pid 555 (Xorg, 3.9 GiB)" in text
    assert "Traceback" not in r.output and not (tmp_path / "results").exists()
