"""CLI behaviour without an engine: exit codes, one-line errors, nothing written on bad input."""

import json

import pytest
from typer.testing import CliRunner

from autotune import __version__
from autotune.cli import app

runner = CliRunner()


def test_version():
    r = runner.invoke(app, ["--version"])
    assert r.exit_code == 0 and r.stdout.strip() == f"autotune {__version__}"


@pytest.mark.parametrize("command", ["search", "export", "serve"])
def test_help_has_examples(command):
    r = runner.invoke(app, [command, "--help"])
    assert r.exit_code == 0 and "Examples" in r.stdout


@pytest.mark.parametrize("args, fragment", [
    (["search", "{tmp}/missing.jsonl"], "missing.jsonl: no such file"),
    (["search", "{tmp}"], ": is a directory"),
    (["search", "{tmp}/empty.jsonl"], "empty.jsonl: no requests"),
    (["search", "{tmp}/notjson.jsonl"], "notjson.jsonl:2: not valid JSON"),
    (["search", "{tmp}/noprompt.jsonl"], "noprompt.jsonl:1: expected exactly one of 'prompt'"),
    (["search", "{tmp}/types.jsonl"], "types.jsonl:1: 'temperature' must be a number"),
    (["search", "{tmp}/absurd.jsonl"], "absurd.jsonl:1: 'max_tokens' must be in [1, 1e+06], got 99999999"),
    (["search", "{tmp}/huge.jsonl"], "huge.jsonl:1: line is"),
    (["search", "examples/smoke.jsonl", "--space", "{tmp}/method.yaml"], "key 'params.method.choices': expected methods"),
    (["search", "examples/smoke.jsonl", "--try", "{{\"warp\": 9}}"], "--try: key 'warp'"),
    (["workload", "inspect", "{tmp}/notjson.jsonl"], "notjson.jsonl:2: not valid JSON"),
    (["search", "examples/smoke.jsonl", "--format", "xml"], "--format: expected one of"),
    (["search", "{tmp}/bad.jsonl"], "bad.jsonl:2: 'max_tokens' must be in [1, 1e+06], got -5"),
    (["search", "examples/smoke.jsonl", "--space", "{tmp}/space.yaml"], "space.yaml: key 'params.warp'"),
    (["search", "examples/smoke.jsonl", "--space", "nope"], "nope: no such search space"),
    (["search", "examples/smoke.jsonl", "--objectives", "speed"], "--objectives: unknown objective 'speed'"),
    (["export", "{tmp}/nothing"], "nothing: no such results file"),
    (["export", "{tmp}/res", "--format", "toml"], "--format: expected one of command, yaml, json"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, args, fragment):
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a"}\n{"prompt": "b", "max_tokens": -5}\n')
    (tmp_path / "space.yaml").write_text("params:\n  method: {choices: [none]}\n  warp: {choices: [1]}\n")
    (tmp_path / "method.yaml").write_text("params:\n  method: {choices: [none, telepathy]}\n")
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "notjson.jsonl").write_text('{"prompt": "a"}\n{prompt: b}\n')
    (tmp_path / "noprompt.jsonl").write_text('{"max_tokens": 4}\n')
    (tmp_path / "types.jsonl").write_text('{"prompt": "a", "temperature": "hot"}\n')
    (tmp_path / "absurd.jsonl").write_text('{"prompt": "a", "max_tokens": 99999999}\n')
    (tmp_path / "huge.jsonl").write_text('{"prompt": "' + "x" * (8 * 1024 * 1024) + '"}\n')
    (tmp_path / "res").mkdir()
    (tmp_path / "res" / "best.json").write_text(json.dumps({"schema_version": 1, "best": {"engine_kwargs": {"model": "m"}}}))
    results = tmp_path / "results"
    r = runner.invoke(app, [a.format(tmp=tmp_path) for a in args] + (["--results", str(results)] if args[0] == "search" else []))
    assert len(r.stderr.strip().splitlines()) <= 3  # one message (Rich may wrap a long line)
    assert r.exit_code == 2, r.output
    assert fragment in r.stderr.replace("\n", "")
    assert "Traceback" not in r.output and r.stderr.startswith("error: ")
    assert not results.exists()  # nothing written on bad input


def test_export_formats_from_a_saved_report(tmp_path):
    kw = {"model": "/m/t", "seed": 0, "speculative_config": {"method": "ngram", "num_speculative_tokens": 3}}
    (tmp_path / "best.json").write_text(json.dumps({"schema_version": 1, "best": {"engine_kwargs": kw}}))
    r = runner.invoke(app, ["export", str(tmp_path)])
    assert r.exit_code == 0 and r.stdout == \
        "vllm serve /m/t --seed 0 --speculative-config '{\"method\":\"ngram\",\"num_speculative_tokens\":3}'\n"
    r = runner.invoke(app, ["export", str(tmp_path), "--format", "json"])
    assert json.loads(r.stdout) == kw


def test_bom_and_crlf_workloads_are_valid_input(tmp_path):
    p = tmp_path / "w.jsonl"
    p.write_bytes(b'\xef\xbb\xbf{"prompt": "edit this", "max_tokens": 8}\r\n{"prompt": "b"}\r\n')
    r = runner.invoke(app, ["workload", "inspect", str(p), "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["requests"] == 2


def test_workload_convert_writes_native_form(tmp_path):
    out = tmp_path / "native.jsonl"
    r = runner.invoke(app, ["workload", "convert", "tests/data/formats/openai_batch.jsonl", "-o", str(out)])
    assert r.exit_code == 0
    from autotune.workload import load_workload

    assert load_workload(out).requests == load_workload("tests/data/formats/openai_batch.jsonl").requests
