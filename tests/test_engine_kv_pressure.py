"""Preemptions and the KV cache's size recorded on the real vLLM CPU engine: a KV cache of 3 blocks
(384 tokens: 4 layers x 4 KV heads x 64 x float32 = 8 KiB a token) for 4 requests in flight that each
grow to ~150 tokens, so the scheduler must preempt. Judges counters, not speed: untimed engine."""

from __future__ import annotations

import pytest

from autotune import demo
from autotune.core.candidate import Candidate, Settings
from autotune.core.load import LoadPattern
from autotune.core.workload import Request, Workload
from autotune.measure.config import StudyConfig
from autotune.measure.metrics import measure_run
from autotune.run.engine import UNTIMED_ENV
from autotune.run.evaluate import trial_job
from autotune.run.worker import run_trial

pytestmark = pytest.mark.engine
KV_BYTES = 3 * 2**20


@pytest.mark.cpu_only(reason="3 MiB is 3 KV blocks of the CPU build's 128-token blocks (vllm/platforms/cpu.py); "
                              "CUDA's 16-token blocks make 24 of it, and 4 requests fit")
def test_a_kv_cache_too_small_for_the_load_records_preemptions(tmp_path):
    reqs = tuple(Request(id=f"r{i}", prompt=f"### Edit the config: set workers to {i}.\nInput:\n", max_tokens=140,
                         ignore_eos=True) for i in range(4))
    cfg = StudyConfig(name="kv", results_dir=tmp_path, load=LoadPattern("concurrency", concurrency=4), repeats=1,
                      warmup=0, samples=0, instrument="inprocess",
                      settings=Settings(model=str(demo.TARGET), dtype=demo.DTYPE, max_model_len=256,
                                        kv_cache_memory_bytes=KV_BYTES))
    out = run_trial(trial_job(Candidate({"method": "none", "enforce_eager": True}), Workload("kv", reqs), cfg),
                    tmp_path / "trial", timeout_s=300, env=UNTIMED_ENV)
    assert out.raw is not None, out.failure
    m = measure_run(out.raw)
    assert m["kv_cache_blocks"] == 3  # vLLM's own num_gpu_blocks for 3 MiB
    assert m["preemptions"] >= 1 and m["completed"] == 4  # preempted, recomputed, finished
