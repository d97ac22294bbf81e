"""scripts/gpu_smoke.sh on this machine's platform (on CPU: --space quick, two trials at concurrency 4,
one confirm round): every step as expected, each printing what a GPU run must show. Real engine: the
script's own launcher, study and confirm (not the suite's launcher: the script checks its own). Its
checks fail where they must: tests/test_gpu_smoke_checks.py plants each case."""

import os
import subprocess

import pytest

from autotune.run import hardware

pytestmark = pytest.mark.engine


def test_the_smoke_script_passes_here_and_says_what_a_gpu_must_show(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "AUTOTUNE_LAUNCHER"}
    out = subprocess.run(["bash", "scripts/gpu_smoke.sh", str(tmp_path / "smoke")], env=env, capture_output=True,
                         text=True, timeout=900)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    platform = hardware.detect()
    assert f"all 9 steps as expected on platform {platform}" in text, text[-2000:]
    assert text.count("   expect: ") == text.count("   saw:    ") == 9, text
    assert f"launcher: ready (platform {platform})" in text and "forked: True" in text
    # what the GPU run must show is printed on any platform
    for shown in ("Graph capturing finished", "nvidia-smi", "Model Runner V2", "the pick is not the baseline",
                  "tensor_parallel_size 2", "1 sampled", "--concurrency 4"):
        assert shown in text, shown
    assert "every place autotune touches it holds" in text
    assert "SURPRISE" not in text
