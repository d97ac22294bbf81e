"""The launcher's CUDA self-check on a real GPU, without vLLM (not a test; issue 42).

vLLM is not installed on the GPU machine this ran on, so this checks the parts that do not need
it, each in a fresh process: (a) torch imported (with transformers, which the launcher preloads)
leaves CUDA uninitialised and a forked probe reaches the GPU (``self_check`` says None); (b) once
the parent has initialised CUDA, ``self_check`` refuses and a forked child indeed cannot use CUDA;
(c) a launcher on a stand-in ``vllm.platforms`` saying "cuda" starts, and a trial worker forked from
it computes on the GPU; (d) the same stand-in initialising CUDA on import: the launcher says so in
one line and the trial starts fresh, and computes on the GPU.

    python3 benchmarks/launcher_selfcheck_gpu.py [--out OUT.json]
"""

from __future__ import annotations

import harness  # first: this checkout's autotune on the path

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = harness.ROOT

A = """
import json, torch, transformers
from autotune.run.launcher_process import self_check
print(json.dumps({"initialised_after_imports": torch.cuda.is_initialized(), "self_check": self_check("cuda"),
                  "torch": torch.__version__, "initialised_after_check": torch.cuda.is_initialized()}))
"""
B = """
import json, os, torch
from autotune.run.launcher_process import self_check
torch.zeros(1, device="cuda")
why = self_check("cuda")
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    try:
        torch.ones(1, device="cuda")
        msg = "no error"
    except Exception as e:
        msg = f"{type(e).__name__}: {e}"
    os.write(w, msg.encode()[:300]); os._exit(0)
os.waitpid(pid, 0)
print(json.dumps({"self_check": why, "forked_child": os.read(r, 400).decode()}))
"""
C = """
import json, os, sys
from pathlib import Path
from autotune.run import launcher
from autotune.run.worker import run_trial
job = {"engine_kwargs": {}, "requests": [], "replay": {"load": {"kind": "batch"}}, "engine_module": "gpu_job"}
with launcher.active() as sock:
    ready = [l for l in (Path(sock).parent / "launcher.log").read_text().splitlines()] if sock else []
    out = run_trial(job, Path(sys.argv[1]), timeout_s=120)
print(json.dumps({"launcher": sock is not None, "launcher_log": ready[-3:], "failure": out.failure,
                  "raw": out.raw, "test_pid": os.getpid()}))
"""
JOB = """
import os, torch
def run_job(job, phase):
    x = torch.ones(1024, device="cuda") * 2
    return {"windows": [], "sum": float(x.sum()), "device": torch.cuda.get_device_name(), "ppid": os.getppid()}
"""
FAKE = "import os\nfrom types import SimpleNamespace\n{init}current_platform = SimpleNamespace(device_type='cuda')\n"


def run(code: str, env: dict[str, str], *args: str) -> dict:
    p = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=300,
                       cwd=ROOT)
    try:
        return json.loads(p.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": p.returncode, "stderr": p.stderr[-1500:], "stdout": p.stdout[-500:]}


def _smi() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=60).stdout.strip()
    except OSError as e:
        return f"no nvidia-smi ({e})"


def main() -> None:
    args = harness.parser(__doc__, out="h200_launcher_selfcheck.json", summary=True).parse_args()
    tmp = Path(tempfile.mkdtemp())
    (tmp / "gpu_job.py").write_text(JOB)
    base = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp)])}
    got = {"a_imports_then_self_check": run(A, base), "b_cuda_initialised_then_self_check": run(B, base)}
    for name, init in (("c_launcher_on_cuda_forks_a_gpu_worker", ""),
                       ("d_preload_initialises_cuda_so_fresh", "import torch\ntorch.zeros(1, device='cuda')\n")):
        fake = tmp / name / "vllm" / "platforms"
        fake.mkdir(parents=True)
        (fake.parent / "__init__.py").write_text("")
        (fake / "__init__.py").write_text(FAKE.format(init=init))
        env = {**base, "PYTHONPATH": os.pathsep.join([str(fake.parent.parent), base["PYTHONPATH"]])}
        got[name] = run(C, env, str(tmp / name / "trial"))
    out = {"note": "no vLLM on this machine: the launcher's own self-check and fork, with a stand-in vllm.platforms",
           "nvidia_smi": _smi(), **got}
    print(json.dumps(out, indent=1))
    harness.save(args.out, out)


if __name__ == "__main__":
    main()
