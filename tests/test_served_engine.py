"""The served instrument's pieces that need no server: vLLM's counters read from /metrics."""

from __future__ import annotations

from autotune.engine import diff_counters
from autotune.served_engine import PER_POS, parse_counters

# As vLLM 0.32's /metrics shows them (two label sets of one engine summed; positions out of order).
METRICS = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 40.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 2.0
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 210.0
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 150.0
# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 35.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 40.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 30.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 1.0
"""


def test_counters_are_read_from_the_metrics_page_summed_and_by_position():
    c = parse_counters(METRICS)
    assert c["vllm:spec_decode_num_drafts"] == 42 and c["vllm:spec_decode_num_draft_tokens"] == 210
    assert c["vllm:spec_decode_num_accepted_tokens"] == 150
    assert c[PER_POS] == [40, 35, 30]  # ordered by the position label, not by the page's order


def test_a_server_without_speculation_reads_zero_and_diffs_like_the_in_process_counters():
    empty = parse_counters("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0.0\n")
    assert empty == {"vllm:spec_decode_num_drafts": 0, "vllm:spec_decode_num_draft_tokens": 0,
                     "vllm:spec_decode_num_accepted_tokens": 0, PER_POS: []}
    d = diff_counters(empty, parse_counters(METRICS))
    assert d["vllm:spec_decode_num_drafts"] == 42 and d[PER_POS] == [40, 35, 30]
