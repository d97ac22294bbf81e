"""DFlash on the real vLLM engine (CPU build: Model Runner V1, the DFlash kernel vLLM's CPU platform
registers): a study searches the demo target's DFlash drafter (autotune/demo/models/dflash, trained by
scripts/train_dflash.py), given as --draft-model and searched as dflash because its config says so,
forecasts it (the drafter mirrored in torch, autotune.forecast.dflash_drafter, its blocks replayed
along the baseline's tokens), measures it and judges it: lossless (the baseline's tokens), drafts
accepted, and the forecast's acceptance is vLLM's (its counters over the measured windows) within 3%.

Speed is measured (a study), so the engines run as the study starts them.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from autotune import demo
from autotune.cli.app import app

pytestmark = [pytest.mark.engine, pytest.mark.skipif(not demo.dflash_available(), reason="no shipped DFlash drafter")]
EDITS = 12
K = 4


@pytest.fixture(scope="module")
def study(tmp_path_factory, engine_launcher):
    results = tmp_path_factory.mktemp("dflash")
    workload = results / "edits.jsonl"
    workload.write_text("".join(Path("examples/json_edit.jsonl").read_text().splitlines(keepends=True)[:EDITS]))
    r = CliRunner().invoke(app, ["search", str(workload), "--draft-model", str(demo.DFLASH),
                                 "--space", "tests/data/engine_space_dflash.yaml", "--trials", "2",
                                 "--results", str(results), "--study", "dflash", "--no-remeasure", "--no-schedule",
                                 "--no-prune", "--no-past-edge", "--trial-timeout", "300", "--max-repeats", "2",
                                 "--warmup", "1"])
    print(r.output)
    assert r.exit_code == 0, r.output
    return results / "dflash", r.output


def test_a_dflash_drafter_is_searched_forecast_measured_and_judged_lossless(study):
    folder, output = study
    frame = pd.read_csv(folder / "trials.csv")
    row = frame[frame["param_method"] == "dflash"].iloc[0]
    assert row["state"] == "COMPLETE" and row["correct"] and row["status"] == "ok", row.to_dict()
    assert row["token_agreement"] == pytest.approx(1.0)  # lossless: the baseline's tokens
    assert row["mean_accepted_length"] > 1.5, row.to_dict()  # a trained drafter: a random one accepts ~nothing
    # forecast before it ran, from the drafter's blocks traced along the baseline's tokens
    assert math.isfinite(row["predicted_speedup"]) and "dflash forecast skipped" not in output


def test_the_forecast_is_vllms_acceptance(study):
    """The drafter mirrored in torch, replayed along the baseline's tokens, against vLLM's counters
    over the trial's measured windows: the mirror is what vLLM runs."""
    import optuna

    folder, _ = study
    frame = pd.read_csv(folder / "trials.csv")
    row = frame[frame["param_method"] == "dflash"].iloc[0]
    print(f"k={K}: forecast {row['predicted_mean_accepted_length']:.4f}, vLLM {row['mean_accepted_length']:.4f}")
    assert row["predicted_mean_accepted_length"] == pytest.approx(row["mean_accepted_length"], rel=0.03)
    s = optuna.load_study(study_name="dflash", storage=f"sqlite:///{folder / 'study.db'}")
    kept = s.user_attrs["dflash_trace"]
    assert kept["depths"] == [K] and "failure" not in kept
