"""One real-engine study over every speculative method vLLM runs on CPU (issue 25): ngram,
draft_model (the demo draft), EAGLE-3 (the shipped head) and suffix decoding (Arctic Inference),
on the demo workload, trials served as users serve them. Each method is forecast from the
baseline's own run before it is measured, measured, judged correct (greedy outputs identical to
the baseline's), and the pick is the fastest of all four.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from autotune.cli.app import app
from autotune.forecast.predict import suffix_available
from autotune.core.study_report import load_report

pytestmark = [pytest.mark.engine,
              pytest.mark.skipif(not suffix_available(), reason="Arctic Inference is not installed "
                                 "(scripts/setup.sh builds it; without it vLLM refuses method: suffix)")]
METHODS = {"ngram", "draft_model", "eagle3", "suffix"}
EDITS = 12


@pytest.fixture(scope="module")
def four(tmp_path_factory, engine_launcher):
    results = tmp_path_factory.mktemp("four")
    # The first EDITS edits of the demo workload, two windows each, one warm-up: what this test
    # judges (a forecast, a measurement and a verdict per method, the pick the fastest) needs no
    # more, and the whole demo workload with re-measured windows took 13 min of a 2-core machine.
    workload = results / "edits.jsonl"
    workload.write_text("".join(Path("examples/json_edit.jsonl").read_text().splitlines(keepends=True)[:EDITS]))
    r = CliRunner().invoke(app, ["search", str(workload), "--space", "tests/data/engine_space_four.yaml",
                                 "--trials", "5", "--results", str(results), "--study", "four", "--no-remeasure",
                                 "--no-schedule", "--no-prune", "--no-past-edge", "--trial-timeout", "300",
                                 "--max-repeats", "2", "--warmup", "1"])
    print(r.output)
    assert r.exit_code == 0, r.output
    return results / "four"


def test_every_method_is_forecast_measured_and_judged_correct(four):
    frame = pd.read_csv(four / "trials.csv")
    spec = frame[frame["param_method"].isin(METHODS)]
    assert set(spec["param_method"]) == METHODS, frame[["trial", "label", "state", "failure"]]
    for _, row in spec.iterrows():
        assert row["state"] == "COMPLETE" and row["correct"] and row["status"] == "ok", row["label"]
        assert row["token_agreement"] == pytest.approx(1.0), row["label"]  # lossless: the baseline's tokens
        # Forecast before it ran, from the baseline's tokens (a replay for each method, no engine).
        assert math.isfinite(row["predicted_speedup"]) and math.isfinite(row["predicted_mean_accepted_length"]), \
            row["label"]
        assert row["mean_accepted_length"] > 1.2, row["label"]  # each drafts and is accepted on these edits


def test_the_pick_is_the_fastest_of_all_four(four):
    frame = pd.read_csv(four / "trials.csv")
    spec = frame[frame["param_method"].isin(METHODS) & (frame["state"] == "COMPLETE")]
    report = load_report(four)
    best = report["best"]
    assert best["candidate"]["method"] in METHODS
    assert best["measurement"]["output_tok_s"] == pytest.approx(spec["output_tok_s"].max())
