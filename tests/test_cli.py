"""CLI behaviour without an engine: exit codes, one-line errors, nothing written on bad input."""

import json
import re

import pytest
from typer.testing import CliRunner

from autotune import __version__
from autotune.cli.app import app

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
    (["search", "{tmp}/regex.jsonl"], "regex.jsonl:2: 'expect.regex' must be a valid regular expression (Python re), "
                                      "got '[0-9': unterminated character set at position 0"),
    (["search", "{tmp}/contains.jsonl"], "contains.jsonl:1: 'expect.contains' must be a non-empty string, got int 7"),
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
    (tmp_path / "regex.jsonl").write_text('{"prompt": "a"}\n{"prompt": "b", "expect": {"regex": "[0-9"}}\n')
    (tmp_path / "contains.jsonl").write_text('{"prompt": "a", "expect": {"contains": 7}}\n')
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
    assert r.exit_code == 0 and r.stdout.splitlines()[-1] == \
        "vllm serve /m/t --seed 0 --speculative-config '{\"method\":\"ngram\",\"num_speculative_tokens\":3}'"
    assert all(ln.startswith("# ") for ln in r.stdout.splitlines()[:-1])  # where each flag comes from
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
    from autotune.core.workload import load_workload

    assert load_workload(out).requests == load_workload("tests/data/formats/openai_batch.jsonl").requests


def test_verbose_adds_the_traceback_to_a_bad_input_line(tmp_path):
    r = runner.invoke(app, ["--verbose", "search", str(tmp_path / "missing.jsonl")])
    assert r.exit_code == 2
    assert "Traceback (most recent call last)" in r.stderr and "BadInput" in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("error: ") and "missing.jsonl: no such file" in r.stderr


@pytest.mark.parametrize("command", [["export", "{tmp}"], ["check", "{tmp}", "--against", "{tmp}"]])
def test_an_unexpected_error_is_one_line_and_with_verbose_its_traceback(tmp_path, monkeypatch, command):
    import autotune.core.study_report

    def broken(path):
        raise KeyError("planted")

    monkeypatch.setattr(autotune.core.study_report, "load_report", broken)
    args = [a.format(tmp=tmp_path) for a in command]
    r = runner.invoke(app, args)
    # Its own exit code: nightly CI tells a crash (3) from a regression or a failed study (1).
    assert r.exit_code == 3 and "Traceback" not in r.output
    assert r.stderr.startswith("error: internal error: KeyError: 'planted' (at test_cli.py:")
    assert len(r.stderr.strip().splitlines()) == 1
    r = runner.invoke(app, ["--verbose", *args])
    assert r.exit_code == 3 and "Traceback (most recent call last)" in r.stderr and "in broken" in r.stderr


def test_help_lists_the_exit_codes():
    r = runner.invoke(app, ["--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0
    text = " ".join(r.stdout.split())  # Rich draws the epilog as paragraphs; compare words
    for line in ("Exit codes:", "0 done", "1 a regression (check) or a study without a result",
                 "2 bad input", "3 an internal error", "130 interrupted"):
        assert line in text, (line, r.stdout)


def _fake_search(tmp_path, monkeypatch, *args):
    """`autotune search` through the CLI with trials on the FAKE engine (tests/fake_engine.py)."""
    monkeypatch.setattr("autotune.cli.search.ENGINE", "fake_engine")
    monkeypatch.setenv("COLUMNS", "1000")  # each record whole on one line, to read it (a pipe wraps at 100)
    return runner.invoke(app, [*args, "--model", "fake-model", "--results", str(tmp_path), "--samples", "0",
                               "--repeats", "1"])


CRASH = '{"method": "ngram", "num_speculative_tokens": 3, "kv_cache_dtype": "auto", "quantization": "crash"}'


@pytest.mark.parametrize("verbose", [False, True])
def test_verbose_shows_a_failed_trials_worker_log(tmp_path, monkeypatch, fake_engine_env, verbose):
    r = _fake_search(tmp_path, monkeypatch, *(["--verbose"] if verbose else []), "search", "examples/smoke.jsonl",
                     "--space", "tests/data/fake_space.yaml", "--trials", "2", "--try", CRASH)
    assert r.exit_code == 0, r.output
    log = tmp_path / "smoke" / "trials" / "0001" / "worker.log"
    assert "RuntimeError: fake engine init failed" in log.read_text()
    shown = [ln for ln in r.stdout.splitlines() if ln.startswith("  | ")]
    if verbose:
        assert f"  worker log: {log} (last " in r.stdout
        assert any("Traceback (most recent call last)" in ln for ln in shown)
        assert any("RuntimeError: fake engine init failed" in ln for ln in shown)
    else:
        assert "worker log:" not in r.stdout and not shown


def test_piped_output_wraps_at_100_columns_at_a_word(tmp_path, monkeypatch, fake_engine_env):
    """Not a terminal (CliRunner, as a pipe or a CI log): lines wrap at 100 columns, at a word (issue 60:
    a log's lines ran to 436 characters), and each record still starts a line of its own."""
    space = tmp_path / "long.yaml"
    space.write_text("baseline: {method: none, dtype: default, enforce_eager: true}\nparams:\n"
                     "  method: {choices: [none, ngram]}\n"
                     "  num_speculative_tokens: {int: [3, 3], when: {method: [ngram]}}\n"
                     "  prompt_lookup_max: {int: [4, 4], when: {method: [ngram]}}\n"
                     "  prompt_lookup_min: {int: [2, 2], when: {method: [ngram]}}\n"
                     "  dtype: {choices: [default, bfloat16]}\n  enforce_eager: {choices: [true]}\n")
    ngram = ('{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2, '
             '"dtype": "bfloat16", "enforce_eager": true}')
    monkeypatch.setattr("autotune.cli.search.ENGINE", "fake_engine")
    monkeypatch.delenv("COLUMNS", raising=False)
    r = runner.invoke(app, ["search", "examples/smoke.jsonl", "--space", str(space), "--trials", "2", "--try", ngram,
                            "--pairs", "2", "--model", "fake-model", "--results", str(tmp_path / "r"), "--samples", "0",
                            "--repeats", "1"])
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert max(map(len, lines)) <= 100, max(lines, key=len)
    label = "ngram k=3 lookup=2..4 bfloat16 eager"
    at = next(i for i, ln in enumerate(lines) if ln.startswith("trial   1 "))
    record = " ".join(x.strip() for x in lines[at:at + 3])
    assert label in record and "tok/s, e2e p50 " in record and "correct; predicted " in record
    assert re.search(r"\d\.\d+x over trial 0", record)  # a number is never cut in two


def test_a_config_queued_past_the_budget_is_said_to_be_left_out(tmp_path, monkeypatch, fake_engine_env):
    tries = [f'{{"method": "ngram", "num_speculative_tokens": {k}, "kv_cache_dtype": "auto", "quantization": "none"}}'
             for k in (2, 3)]
    r = _fake_search(tmp_path, monkeypatch, "search", "examples/smoke.jsonl", "--space", "tests/data/fake_space.yaml",
                     "--trials", "2", "--try", tries[0], "--try", tries[1])
    assert r.exit_code == 0, r.output
    assert ("left out: ngram k=3 (queued, but the --candidates budget of 2 is used; --resume with a larger --candidates "
            "measures it)") in r.stdout.splitlines()
    report = json.loads((tmp_path / "smoke" / "best.json").read_text())
    assert report["trials"]["left_out"] == ["ngram k=3"]
    assert report["figure"]["status"] == "measured", "the holdout did not run"
    assert report["figure"]["pairs"] == 4 and report["figure"]["source"] == "holdout"
