"""The launcher per platform (autotune.run.launcher_process), with the platform faked both ways.

CPU: the CPU worker and model runner preloaded, vLLM's engine processes forked and bound as spawned
(as before). CUDA: neither, the start method left to the user and vLLM, and the launcher checks
after its preload that CUDA is not initialised and that a forked process can use the device; if
not, it says so in one line and every process starts fresh. No GPU here: CUDA is faked (a stand-in
``vllm.platforms`` saying "cuda", a stand-in torch.cuda), so every CUDA claim is untested on a GPU.
"""

import os
import sys
import types

import pytest

from autotune.run import launcher, launcher_process
from autotune.run.worker import run_trial
from test_launcher import _job, jobs  # noqa: F401  (the fixture)


class _FakeCpuPlatform:
    calls = 0

    @classmethod
    def check_and_update_config(cls, vllm_config):
        cls.calls += 1
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"  # as vllm/platforms/cpu.py does


@pytest.fixture
def fake_vllm_cpu(monkeypatch):
    """A stand-in ``vllm.platforms.cpu`` (this process must not import vLLM), and os.register_at_fork recorded."""
    cpu = types.ModuleType("vllm.platforms.cpu")
    cpu.CpuPlatform = type("CpuPlatform", (_FakeCpuPlatform,), {})
    for name, mod in (("vllm", types.ModuleType("vllm")), ("vllm.platforms", types.ModuleType("vllm.platforms")),
                      ("vllm.platforms.cpu", cpu)):
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setattr(sys.modules["vllm.platforms"], "cpu", cpu, raising=False)
    registered = []
    monkeypatch.setattr(os, "register_at_fork", lambda **kw: registered.append(kw))
    monkeypatch.delenv("VLLM_WORKER_MULTIPROC_METHOD", raising=False)
    return cpu, registered


def test_cpu_preloads_its_worker_and_cuda_does_not():
    assert {"vllm.v1.worker.cpu_worker", "vllm.v1.worker.cpu_model_runner"} <= set(launcher.preloads("cpu"))
    on_cuda = launcher.preloads("cuda")
    assert not any("cpu_worker" in m or "cpu_model_runner" in m or "gpu_" in m for m in on_cuda)
    assert "vllm.entrypoints.openai.api_server" in on_cuda  # the API server's import is still saved


def test_on_cpu_a_forked_server_forks_its_engine_processes_as_before(fake_vllm_cpu):
    cpu, registered = fake_vllm_cpu
    original = cpu.CpuPlatform.check_and_update_config
    launcher_process._fork_engine_processes(serve=True, platform="cpu")
    assert os.environ["VLLM_WORKER_MULTIPROC_METHOD"] == "fork"
    assert cpu.CpuPlatform.check_and_update_config != original and registered  # patched, binding hooked


@pytest.mark.parametrize("platform", ["cuda", None])
def test_off_cpu_no_start_method_is_forced(fake_vllm_cpu, platform):
    cpu, registered = fake_vllm_cpu
    original = cpu.CpuPlatform.check_and_update_config
    for serve in (True, False):
        launcher_process._fork_engine_processes(serve=serve, platform=platform)
    assert "VLLM_WORKER_MULTIPROC_METHOD" not in os.environ  # `vllm serve` then asks for spawn itself
    assert cpu.CpuPlatform.check_and_update_config == original and not registered


def test_on_cpu_the_users_own_start_method_is_kept(fake_vllm_cpu, monkeypatch):
    cpu, registered = fake_vllm_cpu
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    launcher_process._fork_engine_processes(serve=True, platform="cpu")
    assert os.environ["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn" and not registered


class _FakeCuda:
    def __init__(self, initialized=False):
        self.initialized = initialized

    def is_initialized(self):
        return self.initialized


def test_the_self_check_refuses_an_initialised_cuda_and_a_fork_that_cannot_reach_the_device(monkeypatch):
    assert launcher_process.self_check("cpu", cuda=_FakeCuda(True)) is None  # nothing to check on CPU
    why = launcher_process.self_check("cuda", cuda=_FakeCuda(True))
    assert why and "torch.cuda.is_initialized()" in why
    assert launcher_process.self_check("cuda", cuda=_FakeCuda(), probe=lambda cuda: None) is None

    def broken(cuda):
        raise RuntimeError("Cannot re-initialize CUDA in forked subprocess")

    why = launcher_process.self_check("cuda", cuda=_FakeCuda(), probe=broken)
    assert why and "forked after the preload could not use the cuda device" in why
    # the real probe, with no GPU visible (none here, or hidden on a GPU machine), fails in the fork
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert launcher_process.self_check("cuda") is not None


# A stand-in vllm.platforms saying "cuda", imported by the launcher alone; it hides every GPU from the
# launcher (as a device set would), so the fork's probe fails on any machine, a GPU one too.
FAKE_CUDA_VLLM = ("import os\nfrom types import SimpleNamespace\nos.environ['CUDA_VISIBLE_DEVICES'] = ''\n"
                  "current_platform = SimpleNamespace(device_type='cuda')\n")


def test_a_launcher_whose_fork_cannot_use_cuda_says_so_once_and_everything_starts_fresh(jobs, tmp_path, monkeypatch,
                                                                                        capfd):
    """The launcher process itself on a faked CUDA platform (a stand-in vllm.platforms): its real
    self-check forks a probe, which reaches no device (none here, or none visible to it); the
    launcher stops, and the trial starts fresh, with one line saying why."""
    fake = tmp_path / "fake_cuda_vllm"
    (fake / "vllm" / "platforms").mkdir(parents=True)
    (fake / "vllm" / "__init__.py").write_text("")
    (fake / "vllm" / "platforms" / "__init__.py").write_text(FAKE_CUDA_VLLM)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(fake), os.environ["PYTHONPATH"]]))
    launcher._said.clear()
    with launcher.active() as sock:
        assert sock is None and launcher.ENV_KEY not in os.environ
        out = run_trial(_job("who"), jobs / "t", timeout_s=60)
    assert out.failure is None and out.raw["ppid"] == os.getpid()  # fresh
    err = [ln for ln in capfd.readouterr().err.splitlines() if ln.startswith("autotune: starting")]
    assert err == ["autotune: starting a process without the launcher: a process forked after the preload "
                   "could not use the cuda device (see the launcher log); every process starts fresh"], err
