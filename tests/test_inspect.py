"""`autotune workload inspect` as read (issue 52): counts as integers, the tokenizer the prompt
tokens were counted with named on their line, and the load to tune at from the log."""

from __future__ import annotations

import json
import re

from typer.testing import CliRunner

from autotune.cli.app import app

runner = CliRunner()
WIDE = {"COLUMNS": "200"}


def _inspect(tmp_path, rows, *args):
    p = tmp_path / "w.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = runner.invoke(app, ["workload", "inspect", str(p), *args], env=WIDE)
    assert r.exit_code == 0, r.output
    return {m.group(1).strip(): m.group(2).strip() for m in re.finditer(r"│ ([a-z ]+?)\s+│ (.+?)\s+│", r.stdout)}


def test_counts_are_integers_and_the_demo_tokenizer_is_named(tmp_path):
    # 3010 and 1507 characters: .3g printed them as 3.01e+03 and 1.51e+03
    rows = [{"prompt": "x" * 3010, "max_tokens": 2048}, {"prompt": "y" * 1507, "max_tokens": 1000}]
    got = _inspect(tmp_path, rows)
    assert got["prompt chars"] == "p50 2258  p90 2860  min 1507  max 3010", got
    assert got["max tokens"] == "p50 1524  p90 1943  min 1000  max 2048", got
    assert "e+" not in "".join(got.values())
    assert got["prompt tokens"].endswith("(counted with the demo model's tokenizer; give --model for yours)")
    assert got["load to tune at"].startswith("--levels 1,2 (without arrival_s")


def test_a_timed_log_is_replayed(tmp_path):
    got = _inspect(tmp_path, [{"prompt": "a b c", "arrival_s": 0.0}, {"prompt": "d e f", "arrival_s": 2.5}], "--json")
    assert not got  # --json: no table
    r = runner.invoke(app, ["workload", "inspect", str(tmp_path / "w.jsonl"), "--json"])
    assert json.loads(r.stdout)["load"]["search"] == "replay"
