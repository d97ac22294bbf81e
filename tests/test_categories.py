"""Results by category, on small hand-built records (streamed chunks as autotune.run.engine keeps them)."""

import math

import pytest

from autotune.measure.categories import by_category, category_speedup, rows, stream_acceptance, window_metrics


def rec(id, chunks, start=0.0, finish="length"):
    """A request record: ``chunks`` as (time, tokens) pairs."""
    return {"id": id, "start": start, "chunks": [list(c) for c in chunks], "finish_reason": finish, "error": None}


@pytest.mark.parametrize("steps, k, mean, rate, by_pos", [
    ([4, 4, 4], 3, 4.0, 1.0, [1.0, 1.0, 1.0]),  # every draft accepted
    ([1, 1, 1, 1], 3, 1.0, 0.0, [0.0, 0.0, 0.0]),  # none accepted: one token a step
    ([1, 2, 3, 4], 3, 2.5, 0.5, [0.75, 0.5, 0.25]),  # a step of m tokens accepted positions 1..m-1
])
def test_stream_acceptance_from_step_sizes(steps, k, mean, rate, by_pos):
    a = stream_acceptance(steps, k)
    assert a["mean_accepted_length"] == mean and a["acceptance_rate"] == pytest.approx(rate)
    assert a["acceptance_by_pos"] == pytest.approx(by_pos)


def test_no_speculation_has_no_acceptance_and_unknown_depth_only_a_mean():
    assert math.isnan(stream_acceptance([1, 1], 0)["mean_accepted_length"])
    suffix = stream_acceptance([3, 1], None)  # e.g. suffix decoding: no fixed depth
    assert suffix["mean_accepted_length"] == 2 and math.isnan(suffix["acceptance_rate"])


def test_window_metrics_skip_the_prefill_chunk_and_incomplete_requests():
    m = window_metrics([rec("a", [(0.1, 1), (0.2, 3), (0.3, 3)]), rec("b", [(0.5, 1)], finish=None)])
    assert m["requests"] == 2 and m["completed"] == 1 and m["output_tokens"] == 7
    assert m["steps"] == [3, 3]  # the first chunk is the prefill's single token
    assert m["output_tok_s"] == pytest.approx(7 / 0.3) and m["tpot_ms_p50"] == pytest.approx(200 / 6)


def test_by_category_medians_over_windows_and_speedups():
    cats = {"e": "editing", "m": "math"}
    base = [{"requests": [rec("e", [(0.1, 1)] + [(0.1 * i, 1) for i in range(2, 9)]),
                          rec("m", [(0.1, 1)] + [(0.1 * i, 1) for i in range(2, 9)])]}] * 2
    cand = [{"requests": [rec("e", [(0.1, 1), (0.2, 4), (0.3, 3)]),  # 8 tokens in 0.3 s against 0.8 s
                          rec("m", [(0.1, 1)] + [(0.12 * i, 1) for i in range(2, 9)])]}] * 2  # slower steps
    b, c = by_category(base, cats, 0), by_category(cand, cats, 3)
    assert list(c) == ["editing", "math"] and c["editing"]["requests"] == 1 and c["editing"]["completed"] == 2
    assert c["editing"]["mean_accepted_length"] == 3.5 and math.isnan(b["editing"]["mean_accepted_length"])
    s = category_speedup(c, b)
    assert s["editing"]["output_tok_s"] == pytest.approx(0.8 / 0.3) and s["editing"]["tpot_ms_p50"] > 1
    assert s["math"]["output_tok_s"] < 1 and s["math"]["tpot_ms_p50"] < 1  # speculation lost here
    # the throughput ratio's interval over the windows (here alike, so a point)
    assert s["editing"]["output_tok_s_lo"] == pytest.approx(0.8 / 0.3) == s["editing"]["output_tok_s_hi"]
    del c["editing"]["output_tok_s_windows"]  # a measurement from before per-category windows: the ratio alone
    assert "output_tok_s_lo" not in category_speedup(c, b)["editing"]
    out = rows(1, "ngram k=3", "candidate", c, s)
    assert [r["category"] for r in out] == ["editing", "math"] and out[0]["acceptance_by_pos"] == "1.000 1.000 0.500"
    assert out[0]["speedup_output_tok_s"] == pytest.approx(0.8 / 0.3)


def test_vllms_per_request_metrics_are_preferred_where_every_request_has_them():
    # RequestSpecDecodeMetrics.to_dict of two requests (k=3): verify steps by accepted drafts 0..3
    a = {"acceptance_histogram": [1, 0, 0, 3], "num_draft_tokens": 12}
    b = {"acceptance_histogram": [2, 1, 1, 0], "num_draft_tokens": 12}
    windows = [{"requests": [{**rec("a", [(0.1, 1), (0.2, 4)]), "spec_decode": a},
                             {**rec("b", [(0.1, 1), (0.2, 2)]), "spec_decode": b}]}]
    m = by_category(windows, {"a": "x", "b": "x"}, 3)["x"]
    assert m["acceptance_source"] == "vllm"
    assert m["mean_accepted_length"] == pytest.approx(1 + 12 / 8) and m["acceptance_rate"] == pytest.approx(12 / 24)
    assert m["acceptance_by_pos"] == pytest.approx([5 / 8, 4 / 8, 3 / 8])
    del windows[0]["requests"][1]["spec_decode"]  # one request without: the stream for all of them
    m = by_category(windows, {"a": "x", "b": "x"}, 3)["x"]
    assert m["acceptance_source"] == "stream" and m["mean_accepted_length"] == 3
