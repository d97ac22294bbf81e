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
    (tmp_path / "res").mkdir()
    (tmp_path / "res" / "best.json").write_text(json.dumps({"schema_version": 1, "best": {"engine_kwargs": {"model": "m"}}}))
    results = tmp_path / "results"
    r = runner.invoke(app, [a.format(tmp=tmp_path) for a in args] + (["--results", str(results)] if args[0] == "search" else []))
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
