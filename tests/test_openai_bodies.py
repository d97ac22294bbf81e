"""OpenAI request bodies as a workload format (issue 52): chat and completions bodies as gateways log
them, read with what changes generation kept (n, response_format, structured_outputs, tools), what does
not counted and ignored in one line, the removed guided_* fields mapped, and any field that cannot be
replayed refused in one line. No engine: the engine side is tests/test_engine_structured.py."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from autotune.cli.app import app
from autotune.core.errors import BadInput
from autotune.core.formats import detect
from autotune.core.workload import load_workload

CHAT = "tests/data/formats/openai_chat_bodies.jsonl"
COMPLETIONS = "tests/data/formats/openai_completion_bodies.jsonl"
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "qty": {"type": "integer"}},
          "required": ["name", "qty"], "additionalProperties": False}


def _write(tmp_path, rows, name="w.jsonl"):
    p = tmp_path / name
    p.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return p


def test_a_chat_body_log_keeps_n_response_format_and_tools():
    wl = load_workload(CHAT)
    assert detect(json.loads(open(CHAT).readline())) == "openai"
    order, cancel, hello = wl.requests
    assert [r.id for r in wl.requests] == ["0", "1", "2"]
    assert order.n == 2 and order.max_tokens == 64 and order.temperature == 0.8 and order.seed == 5
    assert order.response_format["json_schema"]["schema"] == SCHEMA
    assert order.sampling()["n"] == 2 and order.sampling()["structured_outputs"] == {"json": SCHEMA}
    assert order.needs_chat == "response_format on a chat request"
    assert cancel.messages[0]["content"] == "Cancel order A1234." and cancel.tool_choice == "auto"
    assert cancel.tools[0]["function"]["name"] == "cancel_order" and cancel.needs_chat == "tools"
    assert cancel.render_kwargs() == {"tools": cancel.tools}
    assert cancel.chat_body()["tools"] == cancel.tools and "structured_outputs" not in cancel.sampling()
    assert hello.sampling()["presence_penalty"] == 0.5 and hello.render_kwargs() == {"enable_thinking": False}
    assert wl.endpoint == "chat"
    # what was not replayed, a line each: the fields ignored, and the defaults taken
    assert wl.notes[0] == ("ignored (no effect on generation): model on 3, stream on 2, stream_options on 1, "
                           "user on 1")  # logprobs and stream false: as absent
    assert "2 request(s) without temperature: sampled at 1.0, the OpenAI default" in wl.notes
    assert "1 request(s) without max_tokens: the native default or --output-len" in wl.notes
    assert hello.temperature == 1.0 and cancel.temperature == 1.0


def test_a_completions_body_log_keeps_n_and_its_structured_outputs():
    wl = load_workload(COMPLETIONS)
    edit, summary = wl.requests
    assert edit.n == 3 and edit.stop == ("\n\n",) and edit.sampling()["structured_outputs"] == {"json_object": True}
    assert summary.sampling()["structured_outputs"] == {"regex": "[A-Z][a-z ]+\\."} and summary.seed == 11
    assert wl.endpoint == "completions"  # a prompt's response format is a constraint, not a template's input
    assert wl.notes == ("ignored (no effect on generation): model on 2, stream on 1",)  # echo: false is absent


def test_the_batch_path_keeps_the_same_fields(tmp_path):
    body = json.loads(open(COMPLETIONS).readline())
    p = _write(tmp_path, [{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": body}])
    (r,) = load_workload(p).requests
    assert (r.id, r.n, r.sampling()["structured_outputs"]) == ("a", 3, {"json_object": True})


def test_convert_writes_what_was_kept_and_reads_it_back(tmp_path):
    for src in (CHAT, COMPLETIONS):
        out = tmp_path / "native.jsonl"
        r = CliRunner().invoke(app, ["workload", "convert", src, "-o", str(out)])
        assert r.exit_code == 0, r.output
        assert load_workload(out).requests == load_workload(src).requests


@pytest.mark.parametrize("field, structured", [
    ("guided_json", {"json": SCHEMA}), ("guided_regex", {"regex": "[0-9]+"}), ("guided_choice", {"choice": ["yes", "no"]}),
])
def test_a_guided_field_is_mapped_to_structured_outputs(tmp_path, field, structured):
    value = next(iter(structured.values()))
    wl = load_workload(_write(tmp_path, [{"model": "m", "prompt": "Answer:", field: value,
                                          "guided_decoding_backend": "xgrammar"}]))
    assert wl.requests[0].sampling()["structured_outputs"] == structured
    assert any("guided_* (removed in vLLM 0.32" in n and "replayed as structured_outputs" in n for n in wl.notes)
    assert "guided_decoding_backend on 1" in wl.notes[0]


@pytest.mark.parametrize("row, fragment", [
    # a guided field the native form meets: one line saying what to write instead
    ('{"prompt": "a"}\n{"prompt": "b", "guided_json": {"type": "object"}}',
     ":2: 'guided_json' was removed in vLLM 0.32 (a server answers it unconstrained); write it as"),
    ('{"model": "m", "prompt": "a", "guided_json": {}, "response_format": {"type": "json_object"}}',
     ":1: guided_json (removed in vLLM 0.32) beside 'structured_outputs' or 'response_format': keep only the latter"),
    ('{"model": "m", "prompt": "a", "logit_bias": {"50256": -100}}',
     ":1: field 'logit_bias' changes what is generated and cannot be replayed; remove it from the log"),
    ('{"model": "m", "prompt": "a", "colour": "red"}', ":1: field 'colour' is no OpenAI or vLLM request field"),
    ('{"model": "m", "prompt": "a", "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}',
     ":1: 'response_format.json_schema' must be an object with the 'schema'"),
    ('{"model": "m", "prompt": "a", "structured_outputs": {"regex": "a", "json": {}}}',
     ":1: 'structured_outputs' must set exactly one of json, regex"),
    ('{"model": "m", "prompt": "a", "tools": [{"type": "function", "function": {"name": "f"}}]}',
     ":1: 'tools' needs chat 'messages'"),
    ('{"model": "m", "messages": [{"role": "user", "content": "a"}], "tool_choice": "required"}',
     ":1: 'tool_choice' 'required' needs 'tools'"),
    ('{"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}',
     ":1: 'messages[0].content' must be a string or a list of text parts (other parts, such as images"),
    ('{"model": "m", "n": 0, "prompt": "a"}', ":1: 'n' must be in [1, 128], got 0"),
    ('{"model": "m", "n": 2, "prompt": "a", "temperature": 0}', ":1: 'n' is 2 with temperature 0 (greedy): vLLM refuses"),
    # one endpoint a workload: a chat request with tools beside a completions prompt
    ('{"model": "m", "prompt": "a"}\n{"model": "m", "messages": [{"role": "user", "content": "b"}], '
     '"tools": [{"type": "function", "function": {"name": "f"}}]}',
     "request '1' needs /v1/chat/completions (tools) and request '0' is a prompt: one workload goes to one endpoint"),
])
def test_what_cannot_be_replayed_is_one_line_exit_2(tmp_path, row, fragment):
    p = _write(tmp_path, [row])
    with pytest.raises(BadInput) as e:
        load_workload(p)
    assert str(e.value).startswith(str(p)) and fragment in str(e.value) and "\n" not in str(e.value)
    r = CliRunner().invoke(app, ["workload", "inspect", str(p)])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
