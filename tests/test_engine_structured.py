"""Structured outputs replayed as the service uses them, on the real vLLM engine (CPU build) with the
demo pair (issue 52): a log of OpenAI request bodies with a json_schema response format, read, sent
constrained, every output valid JSON of the schema, the candidate's outputs judged against the
baseline's as any others. In-process (completions bodies: vLLM's StructuredOutputsParams in the
engine) and served (chat bodies: /v1/chat/completions, the server's own structured outputs); a
request with n = 2 loads the engine with both completions. Outputs only, never speed (UNTIMED_ENV).

The backend is the user's serving flag: vLLM's default (xgrammar) degenerates into whitespace on the
demo model's byte-level tokenizer (the same prompt, 60 tokens of newlines, with or without
disable_any_whitespace), where guidance (llguidance) writes the record the model writes unconstrained.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from autotune.cli.app import app
from autotune.run.engine import UNTIMED_ENV

pytestmark = pytest.mark.engine
NGRAM = ('{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2, '
         '"kv_cache_dtype": "auto", "quantization": "none", "enforce_eager": true}')
ITEM = {"type": "object", "properties": {"sku": {"type": "string"}, "name": {"type": "string"},
                                         "qty": {"type": "integer"}, "price": {"type": "number"}},
        "required": ["sku", "name", "qty", "price"], "additionalProperties": False}
# "status" open or closed: the demo model writes pending, paid, shipped...; only the constraint writes these.
SCHEMA = {"type": "object", "properties": {"order_id": {"type": "string"}, "customer": {"type": "string"},
                                           "city": {"type": "string"},
                                           "status": {"type": "string", "enum": ["open", "closed"]},
                                           "items": {"type": "array", "items": ITEM}},
          "required": ["order_id", "customer", "city", "status", "items"], "additionalProperties": False}
FORMAT = {"type": "json_schema", "json_schema": {"name": "order", "schema": SCHEMA, "strict": True}}
BACKEND = ["--", "--structured-outputs-config", '{"backend": "guidance"}']


def _fits(value, schema) -> bool:
    """``value`` against the (object, array, string, integer, number, enum) schema above."""
    if "enum" in schema and value not in schema["enum"]:
        return False
    kind = schema["type"]
    if kind == "object":
        props = schema["properties"]
        return (isinstance(value, dict) and set(schema["required"]) <= set(value) and set(value) <= set(props)
                and all(_fits(v, props[k]) for k, v in value.items()))
    if kind == "array":
        return isinstance(value, list) and all(_fits(v, schema["items"]) for v in value)
    return {"string": isinstance(value, str), "integer": isinstance(value, int) and not isinstance(value, bool),
            "number": isinstance(value, (int, float)) and not isinstance(value, bool)}[kind]


def _log(tmp_path, chat: bool):
    """Three order edits of examples/json_edit.jsonl as a gateway logs them; the second one sampled, n = 2."""
    edits = [json.loads(x) for x in open("examples/json_edit.jsonl") if "order record" in x][:3]
    rows = []
    for i, e in enumerate(edits):
        prompt = {"messages": [{"role": "user", "content": e["prompt"]}]} if chat else {"prompt": e["prompt"]}
        rows.append({"model": "demo", **prompt, "max_tokens": 160, "stream": True, "response_format": FORMAT,
                     **({"n": 2, "temperature": 0.7, "seed": 3} if i == 1 else {"temperature": 0.0})})
    p = tmp_path / ("chat.jsonl" if chat else "completions.jsonl")
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def _study(tmp_path, monkeypatch, workload, *args):
    for k, v in UNTIMED_ENV.items():
        monkeypatch.setenv(k, v)
    r = CliRunner().invoke(app, ["search", str(workload), "--space", "tests/data/engine_space.yaml", "--trials", "2",
                                 "--try", NGRAM, "--results", str(tmp_path), "--study", "s", "--repeats", "1",
                                 "--max-repeats", "0", "--warmup", "1", "--samples", "0", "--trial-timeout", "400",
                                 "--no-remeasure", *args, *BACKEND])
    print(r.output)
    assert r.exit_code == 0, r.output
    out = tmp_path / "s"
    frame = pd.read_csv(out / "trials.csv").set_index("trial")
    assert (frame["completed"] == 3).all(), frame
    windows = {t: json.loads((out / "trials" / f"{t:04d}" / "result.json").read_text())["windows"][0]["requests"]
               for t in (0, 1)}
    for t, recs in windows.items():
        for rec in recs:  # every output that ended, the baseline's and the candidate's: JSON of the schema
            if rec["id"] != "1":  # greedy: each ends (a sampled draw may run to max_tokens, cut mid-record)
                assert rec["finish_reason"] == "stop", (t, rec["id"], rec["text"])
            if rec["finish_reason"] == "stop":
                assert _fits(json.loads(rec["text"]), SCHEMA), (t, rec["id"], rec["text"])
        sampled = next(x for x in recs if x["id"] == "1")  # n = 2: both completions were generated
        assert sum(c[1] for c in sampled["chunks"]) > len(sampled["token_ids"])
    # the greedy edits, constrained alike, are the baseline's token for token
    assert frame.loc[1, "token_agreement"] == 1.0, frame.loc[1]
    return out, r.output


def test_a_json_schema_log_replays_constrained_in_process(tmp_path, monkeypatch):
    _, output = _study(tmp_path, monkeypatch, _log(tmp_path, chat=False), "--instrument", "inprocess")
    assert "workload: ignored (no effect on generation): model on 3, stream on 3" in output


def test_a_json_schema_chat_log_replays_through_the_chat_endpoint(tmp_path, monkeypatch):
    out, _ = _study(tmp_path, monkeypatch, _log(tmp_path, chat=True))  # served, the default instrument
    log = (out / "trials" / "0001" / "server.log").read_text(errors="replace")
    assert "/v1/chat/completions" in log and "/v1/completions HTTP" not in log
    # confirm's vllm bench serve: the same endpoint, each row with its messages and response format
    r = CliRunner().invoke(app, ["confirm", str(out), "--rounds", "1", "--min-pass-s", "0"])  # one pass a server
    print(r.output)
    assert r.exit_code == 0, r.output
    rows = [json.loads(x) for x in (out / "confirm" / "workload.jsonl").read_text().splitlines()]
    assert all(x["request_overrides"]["response_format"] == FORMAT for x in rows) and rows[1]["request_overrides"]["n"] == 2
    for side in ("baseline", "pick"):  # every measured request there (confirm's warm-up goes to /v1/completions)
        served = (out / "confirm" / f"round-1-{side}.log").read_text(errors="replace")
        assert served.count('"POST /v1/chat/completions HTTP/1.1" 200') == 3, side
