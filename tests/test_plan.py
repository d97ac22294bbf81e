"""The plan a study says before its first trial (issue 52): how many engine runs it will make at most,
never exceeded. FAKE engine through the CLI; the in-memory study (tests/sim_study.py) for many seeds."""

from __future__ import annotations

import re

import pandas as pd
import pytest
from typer.testing import CliRunner

from autotune.cli.app import app
from autotune.measure.config import Settings, StudyConfig
from autotune.study.plan import plan_of

runner = CliRunner()


def _runs(text: str) -> int:
    return int(re.search(r"at most (\d+) engine runs", text).group(1))


def test_the_plan_line_is_printed_first_and_never_exceeded(tmp_path, monkeypatch, fake_engine_env):
    monkeypatch.setattr("autotune.cli.search.ENGINE", "fake_engine")
    monkeypatch.setenv("COLUMNS", "300")
    r = runner.invoke(app, ["search", "examples/smoke.jsonl", "--model", "fake-model", "--space",
                            "tests/data/fake_space.yaml", "--results", str(tmp_path), "--samples", "0", "--repeats", "1",
                            "--trials", "3", "--pairs", "2"])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    plan = next(ln for ln in lines if ln.startswith("plan: 3 candidates"))
    first_trial = next(i for i, ln in enumerate(lines) if ln.startswith("trial "))
    assert lines.index(plan) < first_trial  # said before anything runs
    assert "--trials is now --candidates" in r.output  # the old name works, with one note
    assert any(ln.startswith("plan: the baseline took ") and "at its pace" in ln for ln in lines)
    frame = pd.read_csv(tmp_path / "smoke" / "trials.csv")
    assert 0 < len(frame) <= _runs(plan), (len(frame), plan)


@pytest.mark.parametrize("deployed", [False, True])
def test_simulated_studies_never_run_more_engines_than_their_plan(deployed):
    from optuna.trial import TrialState

    from machine_noise import Noise
    from sim_study import Truth, simulate

    cfg = StudyConfig(name="p", results_dir=None, settings=Settings(model="fake-model"), n_trials=6, remeasure=True,
                      pairs=4)
    most = plan_of(cfg, deployed=deployed).runs
    worst = 0
    for seed in range(40):
        truth = Truth({1: 3.0, 2: 2.98, 3: 2.9, 4: 2.0, 5: 1.9})  # close contenders: selection and gate rounds
        view = simulate(seed, Noise(phi=0.5), truth=truth,
                        deployed={"method": "ngram", "num_speculative_tokens": 2} if deployed else None)
        ran = [t for t in view.trials if t.state in (TrialState.COMPLETE, TrialState.FAIL)]
        assert not view.waiting
        worst = max(worst, len(ran))
    assert worst <= most, (worst, most)
    assert worst >= most - (2 * 3 if deployed else 0) - 9  # the bound is reached, give or take a rarer branch
