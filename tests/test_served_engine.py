"""The served instrument's pieces that need no server: vLLM's counters read from /metrics."""

from __future__ import annotations

import math

from autotune.run.replay import diff_counters
from autotune.measure.metrics import prefill_share
from autotune.run.served_engine import PER_POS, parse_counters

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
# HELP vllm:request_prefill_time_seconds Histogram of time spent in PREFILL phase for request.
# TYPE vllm:request_prefill_time_seconds histogram
vllm:request_prefill_time_seconds_bucket{engine="0",le="+Inf",model_name="m"} 32.0
vllm:request_prefill_time_seconds_count{engine="0",model_name="m"} 32.0
vllm:request_prefill_time_seconds_sum{engine="0",model_name="m"} 0.25
# HELP vllm:request_decode_time_seconds Histogram of time spent in DECODE phase for request.
# TYPE vllm:request_decode_time_seconds histogram
vllm:request_decode_time_seconds_bucket{engine="0",le="+Inf",model_name="m"} 32.0
vllm:request_decode_time_seconds_count{engine="0",model_name="m"} 32.0
vllm:request_decode_time_seconds_sum{engine="0",model_name="m"} 2.25
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
                     "vllm:spec_decode_num_accepted_tokens": 0, PER_POS: [],
                     "vllm:request_prefill_time_seconds": 0.0, "vllm:request_decode_time_seconds": 0.0,
                     "vllm:num_preemptions": 0}
    d = diff_counters(empty, parse_counters(METRICS))
    assert d["vllm:spec_decode_num_drafts"] == 42 and d[PER_POS] == [40, 35, 30]


def test_the_prefill_share_comes_from_vllms_own_prefill_and_decode_times():
    """Not from TTFT / E2E at the client: a lagging API process merges a request's chunks, and the
    first token then arrives with the last (TTFT = E2E), which read as all prefill."""
    d = diff_counters(parse_counters(""), parse_counters(METRICS))
    assert d["vllm:request_prefill_time_seconds"] == 0.25 and prefill_share(d) == 0.1
    assert math.isnan(prefill_share({})) and math.isnan(prefill_share(parse_counters("")))


def test_attach_drives_a_server_started_elsewhere_and_shutdown_leaves_it_running(tmp_path):
    """``attach`` (the seam benchmarks/client_gap.py uses) reads a server it did not start; its
    ``shutdown`` closes the client's session and ends no process. The server here is a stand-in
    (aiohttp serving the /metrics page above), not vLLM."""
    import asyncio

    from aiohttp import web

    from autotune.run.served_engine import ServedEngine
    from autotune.serve.servers import HOST, free_port

    async def go() -> tuple[dict, bool, int]:
        async def metrics(_req: web.Request) -> web.Response:
            return web.Response(text=METRICS)

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, HOST, port).start()
        try:
            engine = ServedEngine(engine_kwargs={"model": "m"}, log_path=tmp_path / "server.log", port=port)
            engine.attach()
            counters = await engine.counters()
            session = engine._session
            await engine.shutdown()
            again = ServedEngine(engine_kwargs={"model": "m"}, log_path=tmp_path / "server.log", port=port)
            again.attach()  # the server outlived the first engine's shutdown
            second = await again.counters()
            await again.shutdown()
            return counters, session.closed, second["vllm:spec_decode_num_drafts"]
        finally:
            await runner.cleanup()

    counters, closed, drafts_again = asyncio.run(go())
    assert counters["vllm:spec_decode_num_drafts"] == 42 and drafts_again == 42
    assert closed


def test_decoded_logprobs_read_token_ids_from_the_completion():
    """The baseline's decode again with log-probs through the served instrument (autotune.run.replay.decode_drift):
    vLLM writes each token as "token_id:N" when asked ``return_tokens_as_token_ids``."""
    from autotune.run.served_engine import decoded_logprobs

    choice = {"logprobs": {"tokens": ["token_id:224", "token_id:94"], "token_logprobs": [-0.0, -0.012345678],
                           "top_logprobs": [{"token_id:224": -0.0, "token_id:393": -14.34375},
                                            {"token_id:94": -0.0123, "token_id:7": -4.5}]}}
    assert decoded_logprobs(choice) == {"token_ids": [224, 94], "logprobs": [-0.0, -0.01235],
                                        "top": [[[224, -0.0], [393, -14.34375]], [[94, -0.0123], [7, -4.5]]]}
