"""scripts/gpu_smoke.sh on this machine's platform (on CPU: --space quick, the demo models, greedy
requests at concurrency 4, one confirm round): every step as expected, each printing what a GPU run
must show; and the script fails where a first GPU run would go wrong (issue 59), each fault planted in
a run of its own: a drafter's trace that raises, a trial whose record says V2 where vLLM's log shows
V1, a candidate vLLM refuses at config. Real engine: the script's own launcher, study and confirm (not
the suite's launcher: the script checks its own). Its checks on planted results folders:
tests/test_gpu_smoke_checks.py."""

import os
import subprocess
from pathlib import Path

import pytest

from autotune.run import hardware

pytestmark = pytest.mark.engine
FAULTS = Path(__file__).resolve().parent / "smoke_faults"


def _smoke(out: Path, **env: str) -> tuple[int, str]:
    base = {k: v for k, v in os.environ.items() if k != "AUTOTUNE_LAUNCHER"}
    r = subprocess.run(["bash", "scripts/gpu_smoke.sh", str(out)], env={**base, **env}, capture_output=True,
                       text=True, timeout=1200)
    return r.returncode, r.stdout + r.stderr


def test_the_smoke_script_passes_here_and_says_what_a_gpu_must_show(tmp_path):
    code, text = _smoke(tmp_path / "smoke")
    assert code == 0, text[-3000:]
    platform = hardware.detect()
    assert f"all 10 steps as expected on platform {platform}" in text, text[-2000:]
    assert text.count("   expect: ") == text.count("   saw:    ") == 10, text
    assert f"launcher: ready (platform {platform})" in text and "forked: True" in text
    # what the GPU run must show is printed on any platform
    for shown in ("Graph capturing finished", "nvidia-smi", "Using V2 Model Runner", "the pick is not the baseline",
                  "tensor_parallel_size 2", "concurrency 4", "built by vLLM's own config code"):
        assert shown in text, shown
    assert "every place autotune touches it holds" in text and "SURPRISE" not in text
    # the plan: every candidate at config, then one trial per method (each recorded and logged on V1 here)
    assert "candidates of space 'quick' built by vLLM's config code on cpu: none refused or changed" in text
    for method in ("ngram", "draft_model", "eagle3"):
        assert f"plan: {method} k=" in text
    assert "eagle3 trace: ran" in text and "draft trace: ran" in text
    assert "eagle3: forecast" in text and "ngram: forecast" in text


SMALL = """name: planted
baseline: {method: none, enforce_eager: true}
params:
  method: {choices: [none, ngram, {value: eagle3, needs: eagle3_head}]}
  num_speculative_tokens: {int: [3, 3], when: {method: [ngram, eagle3]}}
  prompt_lookup_max: {int: [4, 4], when: {method: [ngram]}}
  prompt_lookup_min: {int: [%d, %d], when: {method: [ngram]}}
  enforce_eager: {choices: [true]}
"""


def _planted_space(tmp_path: Path, lookup_min: int = 2) -> Path:
    """A small space (quick's eager ngram and eagle3 at one depth: each planted run measures one trial);
    with ``lookup_min`` 5 an ngram window vLLM refuses (prompt_lookup_min above prompt_lookup_max)."""
    path = tmp_path / "planted.yaml"
    path.write_text(SMALL % (lookup_min, lookup_min))
    return path


@pytest.mark.parametrize("fault", ["trace", "runner", "config"])
def test_the_smoke_script_fails_on_each_planted_fault(tmp_path, fault):
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(FAULTS), os.environ.get("PYTHONPATH")])),
           "AUTOTUNE_SMOKE_FAULT": fault,
           "AUTOTUNE_SMOKE_SPACE": str(_planted_space(tmp_path, 5 if fault == "config" else 2)),
           # one method's trial: the fault's own (a short run)
           "AUTOTUNE_SMOKE_METHODS": {"trace": "eagle3", "runner": "ngram", "config": "ngram"}[fault]}
    code, text = _smoke(tmp_path / "smoke", **env)
    assert code == 1, text[-3000:]
    said = {"trace": ("FAILED at step 5", "the eagle3 trace failed: RuntimeError: planted: the trace raised"),
            "runner": ("FAILED at step 6", "recorded v2, but vLLM's log says v1"),
            "config": ("FAILED at step 3", "prompt_lookup_min=5 must be <= prompt_lookup_max")}[fault]
    for words in said:
        assert words in text, (fault, text[-3000:])
    if fault == "config":  # before any engine: no study was started
        assert not (tmp_path / "smoke" / "smoke").exists()
