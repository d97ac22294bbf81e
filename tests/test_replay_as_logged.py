"""What the study's clients send for a request as logged (issue 52), without an engine: confirm's
`vllm bench serve` dataset (each row's chat messages and own body fields, carried into vLLM's own
per-request fields by autotune.vllm_cli), the served instrument's chat endpoint and its stream, n > 1
in the replay's records, and a tools workload refused in one line where the server could not run it."""

from __future__ import annotations

import asyncio
import json

from typer.testing import CliRunner

from autotune.cli.app import app
from autotune.core.workload import load_workload
from autotune.run.replay import _one, prompt_text
from autotune.run.served_engine import Delta, _delta
from autotune.serve import bench_client

CHAT = "tests/data/formats/openai_chat_bodies.jsonl"
COMPLETIONS = "tests/data/formats/openai_completion_bodies.jsonl"


def _render(messages):
    return "".join(f"<{m['role']}>{m['content']}" for m in messages)


def test_confirm_sends_a_chat_log_to_the_chat_endpoint_with_each_requests_fields():
    wl = load_workload(CHAT)
    plan = bench_client.client_plan(list(wl.requests), load="concurrency=1", render=_render)
    f = plan.flags
    assert f[f.index("--backend") + 1] == "openai-chat" and f[f.index("--endpoint") + 1] == "/v1/chat/completions"
    order, cancel, hello = plan.rows
    assert order["chat_messages"] == [dict(m) for m in wl.requests[0].messages]
    # the flags send the first request's sampling for all; the others carry their own, and every seed
    assert f[f.index("--temperature") + 1] == "0.8"
    assert order["request_overrides"] == {"seed": 5, "n": 2, "response_format": wl.requests[0].response_format}
    assert cancel["request_overrides"] == {"temperature": 1.0, "top_p": 0.9, "top_k": 0, "seed": 7,
                                           "tools": wl.requests[1].tools, "tool_choice": "auto"}
    assert hello["request_overrides"] == {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "presence_penalty": 0.5,
                                          "chat_template_kwargs": {"enable_thinking": False}}
    assert order["prompt"] == _render(wl.requests[0].messages)  # the text counts its tokens only


def test_confirm_sends_a_completions_log_with_each_requests_n_and_structured_outputs():
    plan = bench_client.client_plan(list(load_workload(COMPLETIONS).requests), load=None, render=None)
    assert plan.flags[plan.flags.index("--endpoint") + 1] == "/v1/completions"
    assert [r["request_overrides"] for r in plan.rows] == [
        {"seed": 5, "n": 3, "structured_outputs": {"json_object": True}},
        {"temperature": 0.7, "top_p": 1.0, "top_k": 0, "stop": [], "seed": 11,
         "structured_outputs": {"regex": "[A-Z][a-z ]+\\."}}]
    assert "chat_messages" not in plan.rows[0]


def test_vllm_bench_serve_carries_the_rows_fields_into_its_requests(tmp_path):
    """vLLM's own CustomDataset, as `vllm bench serve` samples it, with autotune.vllm_cli's extension."""
    from vllm.benchmarks.datasets.datasets import CustomDataset

    from autotune import demo
    from autotune.core.context import load_tokenizer
    from autotune.vllm_cli import carry_row_fields

    plan = bench_client.client_plan(list(load_workload(CHAT).requests), load=None, render=_render)
    path = tmp_path / "workload.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [*plan.rows, {"prompt": "plain", "output_tokens": 4}]))
    carry_row_fields()
    carry_row_fields()  # once is enough: a second call changes nothing
    ds = CustomDataset(dataset_path=str(path), disable_shuffle=True)
    got = ds.sample(tokenizer=load_tokenizer(str(demo.TARGET)), num_requests=4, output_len=-1, skip_chat_template=True,
                    no_oversample=True)
    assert [g.chat_messages for g in got[:3]] == [r["chat_messages"] for r in plan.rows]
    assert [g.request_overrides for g in got[:3]] == [r["request_overrides"] for r in plan.rows]
    assert got[3].chat_messages is None and got[3].request_overrides is None and got[3].expected_output_len == 4


class _Engine:
    """A stand-in for the served instrument's ``stream``: what it was sent, and two completions back."""

    serves_chat = True

    def __init__(self):
        self.sent = []

    def get_tokenizer(self):
        raise AssertionError("a chat body is not rendered here")

    async def stream(self, prompt, sampling, rid):
        self.sent.append(prompt)
        yield Delta(token_ids=[1, 2], text="ab", finished=False, prompt_token_ids=[9, 9, 9])
        yield Delta(token_ids=[5, 6, 7], text="xyz", finished=False, index=1)
        yield Delta(token_ids=[3], text="c", finished=True, finish_reason="stop")
        yield Delta(token_ids=[8], text="w", finished=True, finish_reason="length", index=1)


def test_a_chat_request_goes_as_its_body_and_n_completions_all_load_the_window():
    from autotune.run.evaluate import trial_job

    wl = load_workload(CHAT)
    req = _job_requests(wl, trial_job)[0]
    engine = _Engine()
    rec = asyncio.run(_one(engine, req, prompt_text(engine, req)))
    assert engine.sent[0] == wl.requests[0].chat_body()  # messages and response_format as logged
    # the first completion is the one judged; every completion's tokens are the load
    assert rec["token_ids"] == [1, 2, 3] and rec["text"] == "abc" and rec["finish_reason"] == "stop"
    assert sum(c[1] for c in rec["chunks"]) == 7 and rec["prompt_tokens"] == 3


def _job_requests(wl, trial_job):
    from autotune.core.candidate import Candidate, Settings
    from autotune.measure.config import StudyConfig
    from autotune.core.load import LoadPattern

    cfg = StudyConfig(name="x", results_dir=None, settings=Settings(model="m"), load=LoadPattern())
    return trial_job(Candidate(params={"method": "none"}), wl, cfg)["requests"]


def test_the_chat_stream_is_read_as_the_completions_stream():
    first = _delta({"index": 0, "delta": {"role": "assistant", "content": "Hi"}, "token_ids": [4, 5]},
                   {"prompt_token_ids": [1, 2, 3]})
    assert (first.text, first.token_ids, first.prompt_token_ids, first.finished) == ("Hi", [4, 5], [1, 2, 3], False)
    call = _delta({"index": 1, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"id": 1}'}}]},
                   "token_ids": [6], "finish_reason": "tool_calls"}, {})
    # a tool parser's end of a call is the generation's stop
    assert (call.text, call.index, call.finished, call.finish_reason) == ('{"id": 1}', 1, True, "stop")
    text = _delta({"index": 0, "text": " there", "token_ids": [7], "finish_reason": None}, {})
    assert text.text == " there" and not text.finished


def test_tools_the_server_could_not_run_are_one_line_exit_2(tmp_path, monkeypatch):
    monkeypatch.setattr("autotune.cli.search.ENGINE", "fake_engine")
    p = tmp_path / "tools.jsonl"
    p.write_text(open(CHAT).readlines()[1])  # tools, tool_choice auto
    base = ["search", str(p), "--model", "fake-model", "--results", str(tmp_path / "r")]
    r = CliRunner().invoke(app, base)
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
    assert ("request '0': tool_choice 'auto' needs vLLM's tool parser, as your service runs it: give "
            "--enable-auto-tool-choice --tool-call-parser NAME after `--`") in r.output
    p.write_text(open(CHAT).readlines()[1].replace('"auto"', '{"type": "function", "function": {"name": "cancel_order"}}'))
    r = CliRunner().invoke(app, [*base, "--instrument", "inprocess"])
    assert r.exit_code == 2 and "tool_choice 'function cancel_order' is applied by vLLM's chat server" in r.output
