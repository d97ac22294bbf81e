import math

import numpy as np

import pytest

from autotune.measure.metrics import acceptance, measure


def rec(id, start, chunks, finish="length", error=None):
    return {"id": id, "start": start, "end": chunks[-1][0] if chunks else start, "chunks": chunks,
            "token_ids": list(range(sum(n for _, n in chunks))), "text": "", "finish_reason": finish, "error": error}


def test_measure_matches_hand_computation():
    # Request a: first chunk at 0.1 s after start (1 token), then a burst of 3 tokens at 0.3, 1 at 0.4.
    raw = {"window_s": 1.0, "requests": [rec("a", 0.0, [[0.1, 1], [0.3, 3], [0.4, 1]]),
                                         rec("b", 0.5, [[0.7, 2], [1.0, 2]])],
           "spec_counters": {}}
    m = measure(raw)
    assert m["output_tokens"] == 9 and m["completed"] == 2 and m["incomplete"] == 0
    assert m["output_tok_s"] == pytest.approx(9.0)
    assert m["req_s"] == pytest.approx(2.0)
    # TTFT a=100 ms, b=200 ms; E2E a=400, b=500; TPOT a=(400-100)/4=75, b=(500-200)/3=100.
    assert m["ttft_ms_mean"] == pytest.approx(150) and m["e2e_ms_p50"] == pytest.approx(450)
    assert m["tpot_ms_mean"] == pytest.approx(87.5)
    # ITL pooled over chunks: a: 200, 100; b: 300 -> p50 200.
    assert m["itl_ms_p50"] == pytest.approx(200) and m["itl_ms_mean"] == pytest.approx(200)
    assert math.isnan(m["acceptance_rate"])


def test_incomplete_requests_are_not_scored():
    raw = {"window_s": 1.0, "requests": [rec("a", 0.0, [[0.1, 2]]), rec("b", 0.0, [[0.2, 1]], finish=None),
                                         rec("c", 0.0, [[0.2, 1]], error="boom")], "spec_counters": {}}
    m = measure(raw)
    assert m["completed"] == 1 and m["incomplete"] == 2 and m["output_tokens"] == 2


def test_acceptance_fraction_and_mean_length_differ():
    a = acceptance({"vllm:spec_decode_num_drafts": 10, "vllm:spec_decode_num_draft_tokens": 30,
                    "vllm:spec_decode_num_accepted_tokens": 15,
                    "vllm:spec_decode_num_accepted_tokens_per_pos": [8, 5, 2]})
    assert a["acceptance_rate"] == pytest.approx(0.5)
    assert a["mean_accepted_length"] == pytest.approx(2.5)
    assert a["acceptance_by_pos"] == pytest.approx([0.8, 0.5, 0.2])


def test_speedup_interval_brackets_the_ratio_and_narrows_with_more_windows():
    from autotune.measure.metrics import ratio_interval

    base2, cand2 = [100.0, 110.0], [150.0, 170.0]
    lo, hi = ratio_interval(cand2, base2)
    # Two windows a side: the interval reaches the extreme window ratios, no further.
    assert 150 / 110 <= lo < 160 / 105 < hi <= 170 / 100
    rng = np.random.default_rng(1)
    base, cand = list(100 + rng.normal(0, 5, 20)), list(150 + rng.normal(0, 5, 20))
    lo20, hi20 = ratio_interval(cand, base)
    assert lo20 < np.median(cand) / np.median(base) < hi20 and hi20 - lo20 < hi - lo
    assert all(x != x for x in ratio_interval([], base))  # nothing measured: no interval (NaN)


def test_pool_joins_two_engines_windows_and_rederives_their_medians():
    from autotune.measure.metrics import pool

    first = {"output_tok_s": 10.5, "output_tok_s_windows": [10.0, 11.0], "output_tok_s_mad": 0.5, "windows": 2,
             "noisy": False, "windows@concurrency=4": 2, "engine_init_s": 31.0, "warmup_s": 0.4,
             "output_tok_s_windows@concurrency=4": [5.0, 6.0], "output_tok_s@concurrency=4": 5.5,
             "mean_accepted_length": 3.0}
    again = {"output_tok_s_windows": [13.0, 14.0], "windows": 2, "output_tok_s_windows@concurrency=4": [7.0, 8.0],
             "windows@concurrency=4": 2, "engine_init_s": 28.5, "warmup_s": 0.3,
             "mean_accepted_length": 3.0}
    m = pool(first, again)
    assert m["output_tok_s_windows"] == [10.0, 11.0, 13.0, 14.0] and m["output_tok_s"] == 12.0
    assert m["output_tok_s@concurrency=4"] == 6.5 and m["output_tok_s_mad@concurrency=4"] == 1.0
    assert m["windows"] == 4 and m["instances"] == 2 and m["noisy"]  # 1.5 / 12 > 3%: the instances disagree
    assert m["mean_accepted_length"] == 3.0 and m["windows@concurrency=4"] == 4
    # the re-measure trial's row shows its own engine's start, not the first instance's
    assert (m["engine_init_s"], m["warmup_s"]) == (28.5, 0.3)
    # The second engine ran 13.5 / 10.5 of the first: the spread a comparison across engines meets.
    assert m["instance_spread"] == pytest.approx(13.5 / 10.5 - 1)
    assert pool(m, {"output_tok_s_windows": [12.0]})["instance_spread"] == pytest.approx(13.5 / 10.5 - 1)
