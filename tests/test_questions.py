"""A Spec-Bench / MT-Bench style question file (a few categories, multi-turn) through `workload
inspect`, `workload convert`, a short study and the report: the CLI with the FAKE engine
(tests/fake_engine.py, speculation set to lose on one category). The real engine runs such a file
in tests/test_engine_questions.py.
"""

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from autotune import demo
from autotune.core.study_report import load_report

QUESTIONS = "tests/data/formats/questions.jsonl"
NGRAM = '{"method": "ngram", "num_speculative_tokens": 3}'
runner = CliRunner()
pytestmark = pytest.mark.skipif(not demo.available(), reason="the demo models are not trained")


def _app():
    from autotune.cli.app import app

    return app


def test_inspect_counts_and_lengths_per_category_in_model_tokens():
    r = runner.invoke(_app(), ["workload", "inspect", QUESTIONS, "--turns", "all", "--json"])
    assert r.exit_code == 0, r.output
    info = json.loads(r.stdout)
    assert info["tokenizer"] == str(demo.TARGET) and info["context"] == demo.MAX_MODEL_LEN
    assert info["multi_turn_requests"] == 3 and info["too_long"] == []
    assert {k: (c["requests"], c["turns"]) for k, c in info["categories"].items()} == \
        {"editing": (2, 3), "math": (2, 3), "rag": (2, 3)}
    assert info["categories"]["math"]["prompt_tokens"]["max"] > 0
    r = runner.invoke(_app(), ["workload", "inspect", QUESTIONS])
    assert r.exit_code == 0 and "By category" in r.stdout and "prompt tokens" in r.stdout


def test_convert_writes_native_turns_and_categories(tmp_path):
    out = tmp_path / "native.jsonl"
    r = runner.invoke(_app(), ["workload", "convert", QUESTIONS, "--turns", "all", "-o", str(out)])
    assert r.exit_code == 0, r.output
    first = json.loads(out.read_text().splitlines()[0])
    assert first["id"] == "81" and first["category"] == "editing" and len(first["turns"]) == 2
    assert "question_id" not in first


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """`autotune search QUESTIONS --turns all` with the fake engine: baseline, then ngram k=3."""
    import os
    from pathlib import Path

    results = tmp_path_factory.mktemp("results")
    tests = Path(__file__).resolve().parent
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tests), os.environ.get("PYTHONPATH")])))
        mp.setattr("autotune.cli.search.ENGINE", "fake_engine")
        mp.setenv("AUTOTUNE_FAKE_NO_ACCEPT", "math")
        r = runner.invoke(_app(), ["search", QUESTIONS, "--turns", "all", "--space", "tests/data/fake_space.yaml",
                                   "--trials", "2", "--try", NGRAM, "--results", str(results), "--study", "q",
                                   "--repeats", "1", "--warmup", "0", "--samples", "0", "--output-len", "12",
                                   "--no-remeasure", "--explain"])  # the table by category: --explain
    return r, results / "q"


def test_study_writes_and_shows_results_by_category(study):
    r, out = study
    assert r.exit_code == 0, r.output
    assert "By category: trial 1 ngram k=3" in r.output
    frame = pd.read_csv(out / "by_category.csv")
    assert sorted(set(frame["category"])) == ["editing", "math", "rag"]
    cand = frame[frame["trial"] == 1].set_index("category")
    assert (cand["requests"] == 3).all()  # every turn of a conversation is a request of its category
    # Which kinds gain and which lose: the fake engine's speculation rejects every draft on math, whose
    # steps then cost 1.2 baseline steps for one token, while editing gets 4 tokens a step. Each
    # speedup alone carries the noise between two fake engine instances (one window a side: 1.13x
    # for math with one seed, 0.83x without noise), but the kinds share their window's noise, so
    # the ratio between them is exact.
    sp = cand["speedup_output_tok_s"]
    assert sp["editing"] > 1 and sp["rag"] == pytest.approx(sp["editing"])
    assert sp["math"] / sp["editing"] == pytest.approx(1 / (4 * 1.2), rel=1e-6)
    assert cand.loc["math", "mean_accepted_length"] == 1
    assert cand.loc["editing", "mean_accepted_length"] == pytest.approx(4)
    assert cand.loc["editing", "acceptance_by_pos"] == "1.000 1.000 1.000"
    best = load_report(out)["best"]
    assert best["trial"] == 1 and set(best["speedup_by_category"]) == {"editing", "math", "rag"}
    by = best["speedup_by_category"]
    assert by["math"]["output_tok_s"] < by["editing"]["output_tok_s"] / 4
    assert "## By category: trial 1" in (out / "report.md").read_text()


def test_later_turns_are_judged_against_the_baselines_same_turn(study):
    _, out = study
    frame = pd.read_csv(out / "trials.csv").set_index("trial")
    assert frame.loc[1, "correct"] and frame.loc[1, "completed"] == 9  # 6 questions, 9 turns


def test_report_draws_the_picks_speedup_by_category(study):
    _, out = study
    r = runner.invoke(_app(), ["report", str(out)])
    assert r.exit_code == 0, r.output
    page = (out / "report" / "report.html").read_text()
    assert "Speedup of the pick by category: trial 1 ngram k=3" in page and (out / "report" / "category.png").is_file()
    assert "mean_accepted_length" in page  # the numbers behind the bars


def test_a_prompt_over_the_context_is_refused_up_front_or_dropped(tmp_path, monkeypatch, fake_engine_env):
    w = tmp_path / "long.jsonl"
    w.write_text(json.dumps({"id": "241", "prompt": "word " * 1200, "category": "rag"}) + "\n"
                 + json.dumps({"id": "ok", "prompt": "Add 2 and 3.", "max_tokens": 8, "category": "math"}) + "\n")
    results = tmp_path / "results"
    args = ["search", str(w), "--space", "tests/data/fake_space.yaml", "--trials", "1", "--results", str(results),
            "--repeats", "1", "--warmup", "0", "--samples", "0"]
    r = runner.invoke(_app(), args)
    assert r.exit_code == 2, r.output
    assert "1 of 2 requests do not fit the model's context of 1024 tokens (max_model_len): '241' (" in \
        " ".join(r.stderr.split()) and "--drop-too-long" in r.stderr
    assert not results.exists()  # refused before any engine started
    monkeypatch.setattr("autotune.cli.search.ENGINE", "fake_engine")
    r = runner.invoke(_app(), args + ["--drop-too-long"])
    assert r.exit_code == 0, r.output
    said = " ".join(r.output.split())  # as wrapped at the console's width, which the path's length moves
    assert "--drop-too-long: dropped 1 request(s) over the context of 1024 tokens, e.g. '241'" in said
    assert "1 requests from" in said
    assert pd.read_csv(results / "long" / "trials.csv").loc[0, "completed"] == 1
