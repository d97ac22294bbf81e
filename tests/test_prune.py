"""Stopping hopeless candidates early (issue 28): after its first window, a candidate that cannot
reach the best measured config even with twice the noise (and whose forecast's top agrees) is
stopped, recorded as pruned with why, counted against the budget and never planned again.
A pure test of the rule, then a study on the FAKE engine."""

from __future__ import annotations

import os

import pandas as pd
import pytest
from optuna.trial import TrialState

from autotune.measure.config import Settings, StudyConfig
from autotune.results.files import write_results
from autotune.core.space import load_space
from autotune.forecast.policy import hopeless
from autotune.study.loop import run_study
from autotune.core.workload import load_workload


@pytest.mark.parametrize("first, best, noise, hi, stops", [
    (0.8, 2.0, 0.05, None, True),    # far below, no forecast: the measurement alone decides
    (0.8, 2.0, 0.05, 1.2, True),     # and the forecast's top agrees
    (0.8, 2.0, 0.05, 2.1, False),    # the forecast says it could still win: keep measuring
    (1.85, 2.0, 0.05, None, False),  # within twice the noise of the best: not hopeless
    (1.7, 2.0, 0.05, None, True),    # 1.7 x 1.1 = 1.87 < 2.0
    (float("nan"), 2.0, 0.05, None, False),
])
def test_hopeless_needs_the_measurement_and_the_forecast_to_agree(first, best, noise, hi, stops):
    why = hopeless(first, best, noise, hi)
    assert (why is not None) == stops
    if stops:
        assert why.startswith(f"its first window measured {first:.2f}x the baseline")


# The FAKE engine, except that ngram k=4 runs three times slower than it would, tells its first
# window as the real engine does (window_done) and then takes a while, as a real trial would.
SLOW_K4 = '''
import time

import fake_engine
from autotune.measure.metrics import measure


def run_job(job, phase):
    out = fake_engine.run_job(job, phase)
    spec = job["engine_kwargs"].get("speculative_config") or {}
    if spec.get("num_speculative_tokens") == 4 and "windows" in out:
        for w in out["windows"]:
            w["window_s"] *= 3
            for r in w["requests"]:
                r["chunks"] = [[t * 3, n] for t, n in r["chunks"]]
        phase("window_done", {"window": 1, "output_tok_s": measure(out["windows"][0])["output_tok_s"]})
        time.sleep(8)  # the rest of the trial: the study stops it before this ends
    return out
'''


def _slow_k4_study(tmp_path, monkeypatch, *, prune: bool, enqueue=()):
    """A grid study (none, k=1, k=2, k=4) on the slow-k=4 FAKE engine; (study, its config)."""
    (tmp_path / "engines").mkdir()
    (tmp_path / "engines" / "slow_k4.py").write_text(SLOW_K4)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path / "engines"), os.environ["PYTHONPATH"]]))
    monkeypatch.setenv("AUTOTUNE_FAKE_NOISE", "0")
    # The fake engine's step costs make a degenerate fit (k=4 forecast at tens of x): without a
    # forecast the first window's measurement alone decides (the pure test above covers agreement).
    monkeypatch.setattr("autotune.study.record.forecast_for", lambda *a, **k: None)
    space = load_space("tests/data/fake_depths.yaml", platform="cpu", models=set())
    cfg = StudyConfig(name="prune", results_dir=tmp_path / "prune", settings=Settings(model="fake-model"),
                      objectives=("output_tok_s",), n_trials=4, trial_timeout_s=30, engine_module="slow_k4",
                      strategy="grid", prune=prune)
    return run_study(cfg, load_workload("examples/smoke.jsonl"), space, enqueue=list(enqueue)), cfg


@pytest.mark.parametrize("prune", [True, False])
def test_a_hopeless_candidate_is_pruned_after_its_first_window(tmp_path, fake_engine_env, monkeypatch, prune):
    study, cfg = _slow_k4_study(tmp_path, monkeypatch, prune=prune)
    by_label = {t.user_attrs.get("label"): t for t in study.trials}
    k4 = by_label["ngram k=4"]
    if not prune:
        assert k4.state == TrialState.COMPLETE and k4.user_attrs["wall_s"] >= 8
        return
    assert k4.state == TrialState.PRUNED and k4.user_attrs["wall_s"] < 8  # stopped, not waited for
    # Its first window (1.6x) against the best measured (k=2, 3.0x).
    assert k4.user_attrs["pruned"].startswith("its first window measured 1.60x the baseline")
    assert "below the best measured 3.00x" in k4.user_attrs["pruned"]
    # It used the budget (an engine ran): the four trials are none, k=1, k=2 and k=4 (pruned), no fifth.
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 3 + [TrialState.PRUNED]
    report = write_results(study, cfg.results_dir, settings=cfg.settings, platform={"platform": "cpu"},
                           objectives=list(cfg.objectives), storage_url=cfg.storage_url)
    assert report["trials"]["pruned"] == 1
    frame = pd.read_csv(cfg.results_dir / "trials.csv").set_index("label")
    assert frame.loc["ngram k=4", "state"] == "PRUNED" and frame.loc["ngram k=4", "failure"].startswith("pruned: ")


def test_a_config_asked_for_is_measured_whole(tmp_path, fake_engine_env, monkeypatch):
    """--try names a config the user wants measured: it is never pruned, however it starts."""
    study, _ = _slow_k4_study(tmp_path, monkeypatch, prune=True,
                              enqueue=[{"method": "ngram", "num_speculative_tokens": 2},
                                       {"method": "ngram", "num_speculative_tokens": 4}])
    k4 = next(t for t in study.trials if t.user_attrs.get("label") == "ngram k=4")
    assert k4.state == TrialState.COMPLETE and "pruned" not in k4.user_attrs and k4.user_attrs["wall_s"] >= 8
