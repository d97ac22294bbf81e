"""Suffix decoding in the forecast (autotune.forecast.forecast): replayed like ngram, its knobs part of what
the replay reads, and said plainly where Arctic Inference is missing."""

import pytest

from autotune.forecast import forecast
from autotune.forecast.forecast import SCHEDULED, AcceptanceTable, Model, Observation, knobs
from autotune.forecast.predict import suffix_acceptance, suffix_available

PROMPT = list(range(100, 140))
# Three requests: one copies its prompt, the next two repeat one response (the cache's second pass).
OUTPUTS = [{"id": "a", "prompt_token_ids": PROMPT, "token_ids": PROMPT[5:25]},
           {"id": "b", "prompt_token_ids": [7, 8, 9], "token_ids": list(range(1, 21))},
           {"id": "c", "prompt_token_ids": [7, 8, 9], "token_ids": list(range(1, 21))}]
BASELINE = {"method": "none", "enforce_eager": True}
SUFFIX = {"method": "suffix", "num_speculative_tokens": 4, "suffix_decoding_max_tree_depth": 24,
          "suffix_decoding_max_spec_factor": 2.0, "suffix_decoding_min_token_prob": 0.1, "enforce_eager": True}


@pytest.mark.skipif(not suffix_available(), reason="Arctic Inference is not installed (scripts/setup.sh builds it)")
def test_a_suffix_candidate_is_forecast_from_its_replay_and_knobs():
    table = AcceptanceTable(OUTPUTS, None, 1024)
    model = Model(table, [Observation(BASELINE, 1.0, 1.0, 1.0)], BASELINE, 0.1)
    f = model.forecast(SUFFIX)
    pairs = [(o["prompt_token_ids"], o["token_ids"]) for o in OUTPUTS]
    assert f.acceptance == suffix_acceptance(pairs, k=4, max_model_len=1024, max_spec_factor=2.0)
    assert f.speedup is not None and f.speedup > 1 and "tokens/step replayed" in f.basis
    # Its knobs change what is drafted: replayed, not a measured factor on the speedup.
    assert not knobs(SUFFIX, BASELINE)
    assert model.forecast({**SUFFIX, "suffix_decoding_max_spec_factor": 1.0}).acceptance != f.acceptance
    # vLLM's suffix proposer runs one fixed k: no depth per batch size for it.
    assert "suffix" not in SCHEDULED


def test_without_arctic_inference_a_suffix_candidate_says_why_it_has_no_forecast(monkeypatch):
    monkeypatch.setattr(forecast, "suffix_available", lambda: False)
    table = AcceptanceTable(OUTPUTS, None, 1024)
    f = Model(table, [Observation(BASELINE, 1.0, 1.0, 1.0)], BASELINE, 0.1).forecast(SUFFIX)
    assert f.speedup is None and "Arctic Inference is not installed" in f.basis
