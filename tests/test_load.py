import pytest

from autotune.core.errors import BadInput
from autotune.core.load import LoadPattern, parse_load, send_offsets
from autotune.measure.metrics import measure_run


@pytest.mark.parametrize("text, pattern", [
    ("concurrency=4", LoadPattern("concurrency", concurrency=4)), ("batch", LoadPattern("batch")),
    ("poisson=2.5", LoadPattern("poisson", rate=2.5)), ("replay", LoadPattern("replay")),
])
def test_parse_load(text, pattern):
    assert parse_load(text) == pattern


@pytest.mark.parametrize("text", ["concurrency=0", "concurrency", "poisson=-1", "poisson=fast", "batch=3", "storm"])
def test_bad_load(text):
    with pytest.raises(BadInput, match="--load: expected concurrency=N"):
        parse_load(text)


def test_send_offsets():
    assert send_offsets({"kind": "concurrency", "concurrency": 2}, 3, [None] * 3) is None
    assert send_offsets({"kind": "batch"}, 3, [None] * 3) == [0.0, 0.0, 0.0]
    assert send_offsets({"kind": "replay"}, 3, [5.0, 5.5, 7.0]) == [0.0, 0.5, 2.0]
    offs = send_offsets({"kind": "poisson", "rate": 4.0, "seed": 1}, 4000, [None] * 4000)
    assert offs[0] == 0.0 and all(b >= a for a, b in zip(offs, offs[1:]))
    assert len(offs) / offs[-1] == pytest.approx(4.0, rel=0.05)  # the asked rate
    assert offs == send_offsets({"kind": "poisson", "rate": 4.0, "seed": 1}, 4000, [None] * 4000)  # seeded


def window(tok_s_scale):
    reqs = [{"id": "a", "start": 0.0, "end": 1.0, "chunks": [[0.1, 1], [1.0 / tok_s_scale, 9]], "token_ids": [0] * 10,
             "text": "", "finish_reason": "length", "error": None}]
    return {"window_s": 1.0 / tok_s_scale, "requests": reqs,
            "spec_counters": {"vllm:spec_decode_num_drafts": 2, "vllm:spec_decode_num_draft_tokens": 6,
                              "vllm:spec_decode_num_accepted_tokens": 3,
                              "vllm:spec_decode_num_accepted_tokens_per_pos": [2, 1, 0]}}


def test_measure_run_takes_medians_mads_and_pools_acceptance():
    m = measure_run({"windows": [window(1.0), window(1.1), window(0.5)], "engine_init_s": 3.0})
    assert m["output_tok_s_windows"] == pytest.approx([10, 11, 5])
    assert m["output_tok_s"] == pytest.approx(10) and m["output_tok_s_mad"] == pytest.approx(1)
    assert m["noisy"] and m["windows"] == 3 and m["engine_init_s"] == 3.0
    assert m["acceptance_rate"] == pytest.approx(0.5) and m["acceptance_by_pos"] == pytest.approx([1, 0.5, 0])
    assert not measure_run({"windows": [window(1.0), window(1.0)]})["noisy"]
