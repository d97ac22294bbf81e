import json

import pytest
from typer.testing import CliRunner

from autotune.check import compare, parse_tolerance
from autotune.cli import app
from autotune.errors import BadInput


def report(tok_s, e2e, passed=True, label="ngram k=3", vllm="0.32.0"):
    return {"schema_version": 1, "objectives": ["output_tok_s", "e2e_ms_p50"], "vllm_version": vllm,
            "platform": {"platform": "cpu"}, "workload": "w.jsonl", "concurrency": 1,
            "best": {"label": label, "engine_kwargs": {"model": "m"},
                     "measurement": {"output_tok_s": tok_s, "e2e_ms_p50": e2e},
                     "verdict": {"passed": passed, "reason": "ok" if passed else "greedy mismatch"}}}


@pytest.mark.parametrize("text, value", [("5%", 0.05), ("0.1", 0.1), ("0", 0.0)])
def test_parse_tolerance(text, value):
    assert parse_tolerance(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["five", "150%", "-1"])
def test_bad_tolerance(text):
    with pytest.raises(BadInput, match="--tolerance"):
        parse_tolerance(text)


def test_within_tolerance_is_ok_and_context_changes_are_noted():
    r = compare(report(97, 102, vllm="0.33.0"), report(100, 100), tolerance=0.05)
    assert r.ok and [c.name for c in r.objectives] == ["output_tok_s", "e2e_ms_p50"]
    assert r.objectives[0].change == pytest.approx(-0.03) and r.objectives[1].change == pytest.approx(-0.02)
    assert r.changed_context == {"vllm_version": ("0.32.0", "0.33.0")}


def test_regression_and_incorrect_pick_fail():
    r = compare(report(80, 100), report(100, 100), tolerance=0.05)
    assert not r.ok and r.reasons == ["output_tok_s is 20.0% worse (100 -> 80), beyond the 5% tolerance"]
    r = compare(report(120, 90, passed=False), report(100, 100), tolerance=0.05)
    assert not r.ok and "failed its correctness checks" in r.reasons[0]
    r = compare({"schema_version": 1, "best": None}, report(100, 100), tolerance=0.05)
    assert not r.ok and "no feasible" in r.reasons[0]


def test_cli_exit_codes_summary_and_json(tmp_path, monkeypatch):
    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    (tmp_path / "old" / "best.json").write_text(json.dumps(report(100, 100)))
    (tmp_path / "new" / "best.json").write_text(json.dumps(report(70, 100)))
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    runner = CliRunner()
    r = runner.invoke(app, ["check", str(tmp_path / "new"), "--against", str(tmp_path / "old")])
    assert r.exit_code == 1 and r.stdout.startswith("## autotune check: REGRESSION")
    assert "output_tok_s is 30.0% worse" in summary.read_text()
    r = runner.invoke(app, ["check", str(tmp_path / "new"), "--against", str(tmp_path / "old"), "--tolerance", "40%",
                            "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["ok"] is True
    r = runner.invoke(app, ["check", str(tmp_path / "new"), "--against", str(tmp_path / "missing")])
    assert r.exit_code == 2 and "no such results file" in r.stderr
