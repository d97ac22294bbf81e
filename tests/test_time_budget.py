"""--time-budget and trial timeouts sized from the baseline (autotune.study.budget), on the FAKE engine."""

import csv
import json
import statistics
import time
from types import SimpleNamespace

from typer.testing import CliRunner

from autotune.cli.app import app
from autotune.core import attrs
from autotune.study import budget
from autotune.study.view import StudyView

SPACE = """name: budget
baseline: {method: none, kv_cache_dtype: auto}
params:
  method: {choices: [none, ngram]}
  num_speculative_tokens: {int: [1, 24], when: {method: [ngram]}}
  kv_cache_dtype: {choices: [auto]}
"""


def test_the_study_ends_within_its_time_budget_with_a_re_measured_pick(tmp_path, monkeypatch, fake_engine_env):
    monkeypatch.setattr("autotune.cli.search.ENGINE", "fake_engine")
    monkeypatch.setenv("AUTOTUNE_FAKE_DELAY_S", "3")  # each fake trial takes >= 3 s
    monkeypatch.setenv("AUTOTUNE_FAKE_NOISE", "0")
    monkeypatch.setenv("COLUMNS", "1000")  # each record whole on one line, to read it (a pipe wraps at 100)
    (tmp_path / "space.yaml").write_text(SPACE)
    minutes, trials = 0.75, 20  # 20 trials of >= 3 s never fit in 45 s; a loaded machine still fits a pick and its holdout
    t0 = time.monotonic()
    r = CliRunner().invoke(app, ["search", "examples/smoke.jsonl", "--model", "fake-model", "--results",
                                 str(tmp_path / "res"), "--samples", "0", "--repeats", "1", "--space",
                                 str(tmp_path / "space.yaml"), "--trials", str(trials), "--strategy", "grid",
                                 "--time-budget", str(minutes), "--pairs", "2"])
    took = time.monotonic() - t0
    assert r.exit_code == 0, r.output
    rows = list(csv.DictReader(open(tmp_path / "res" / "smoke" / "trials.csv")))
    walls = [float(x["wall_s"]) for x in rows if x["wall_s"]]
    in_budget = [x for x in rows if x["role"] in ("baseline", "candidate")]
    assert len(in_budget) < trials, "the time budget cut nothing"
    # Ends within the budget, give or take a trial: a trial's cost is an estimate (the median so far),
    # and writing the results (report, tables) comes after the study.
    assert took <= minutes * 60 + 2 * statistics.median(walls), (took, walls)
    report = json.loads((tmp_path / "res" / "smoke" / "best.json").read_text())
    assert report["best"] and report["figure"]["status"] == "measured", report["figure"]  # its two holdout rounds ran
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("time budget:"))
    assert f"of the {trials} --candidates measured, {trials - len(in_budget)} left out" in line
    assert report["strategy"]["stopped"] == line


def _round(role, rnd):
    t = _trial(role, 10.0)
    t.user_attrs["round"] = rnd
    return t


def _study(*trials):
    """The view of a study of ``trials`` (numbered in order), as the budget's helpers read it."""
    for i, t in enumerate(trials):
        t.number = i
    return StudyView.of(SimpleNamespace(study_name="s", directions=[], user_attrs={},
                                        get_trials=lambda deepcopy=False: list(trials)))


def _trial(role, wall, state="COMPLETE"):
    from optuna.trial import TrialState

    return SimpleNamespace(state=getattr(TrialState, state), user_attrs={attrs.ROLE: role, attrs.WALL_S: wall},
                           datetime_complete=None)


def test_trial_timeouts_are_sized_from_the_baselines_own_wall_time():
    cfg = SimpleNamespace(trial_timeout_s=600.0, timeout_from_baseline=True)
    base = _trial(attrs.BASELINE, 400.0)
    assert budget.trial_timeout(_study(base), cfg) == 1200.0  # an 8B model's start: minutes
    base.user_attrs[attrs.WALL_S] = 30.0
    assert budget.trial_timeout(_study(base), cfg) == 600.0  # never below the default
    cfg.timeout_from_baseline = False  # --trial-timeout given: as given
    base.user_attrs[attrs.WALL_S] = 400.0
    assert budget.trial_timeout(_study(base), cfg) == 600.0
    cfg.timeout_from_baseline = True
    assert budget.trial_timeout(_study(), cfg) == 600.0  # the baseline itself
    assert budget.trial_timeout(_study(_trial(attrs.BASELINE, 400.0, "RUNNING")), cfg) == 600.0  # not measured yet


def test_out_of_time_keeps_room_for_one_trial_and_two_holdout_rounds(monkeypatch):
    cfg = SimpleNamespace(remeasure=True)
    clock = budget.Clock(100.0, start=0.0)  # trials from before this run: their worker wall time is the cost
    study = _study(_trial(attrs.BASELINE, 10.0), _trial(None, 10.0))
    monkeypatch.setattr(budget.time, "monotonic", lambda: 49.0)
    assert not budget.out_of_time(study, cfg, clock)  # 49 + 10 x (1 + 2 x 2) = 99 <= 100
    monkeypatch.setattr(budget.time, "monotonic", lambda: 51.0)
    assert budget.out_of_time(study, cfg, clock)
    assert not budget.out_of_time(study, cfg, budget.Clock(None, start=0.0))  # no budget: never
    # before the choice, a first selection round only while it fits with the kept holdout rounds after it
    assert not budget.extra_allowed(study, cfg, clock)  # 51 + 10 x (2 + 2 x 2) = 111 > 100
    monkeypatch.setattr(budget.time, "monotonic", lambda: 39.0)
    assert budget.extra_allowed(study, cfg, clock)  # 39 + 60 = 99 <= 100
    assert budget.extra_allowed(study, SimpleNamespace(remeasure=False), budget.Clock(60.0, start=0.0))  # no holdout: 39 + 20
    # the first two holdout rounds always run (their time was kept: an interval rests on 2 pairs at least)
    monkeypatch.setattr(budget.time, "monotonic", lambda: 99.0)
    one = _study(_trial(attrs.BASELINE, 10.0), _trial(None, 10.0), _round(attrs.HOLDOUT, "h1.1"))
    assert budget.extra_allowed(one, cfg, clock)
    two = _study(_trial(attrs.BASELINE, 10.0), _trial(None, 10.0), _round(attrs.HOLDOUT, "h1.1"),
                 _round(attrs.HOLDOUT, "h1.2"))
    assert not budget.extra_allowed(two, cfg, clock)  # a third only while it fits


def test_the_kept_holdout_rounds_run_after_selection_rounds_took_their_time(monkeypatch):
    """The kept time is the holdout's: once the choice is final, its first two rounds run even where
    selection rounds used the time (before, the holdout then never started and the pick had no
    figure: tests/test_time_budget.py's study failed so about one run in four on a loaded machine)."""
    cfg = SimpleNamespace(remeasure=True)
    clock = budget.Clock(100.0, start=0.0)
    monkeypatch.setattr(budget.time, "monotonic", lambda: 99.0)
    def view(selected):
        trials = [_trial(attrs.BASELINE, 10.0), _trial(None, 10.0), _round(attrs.REMEASURE, "s2.1")]
        for i, t in enumerate(trials):
            t.number = i
        return StudyView.of(SimpleNamespace(study_name="s", directions=[], user_attrs=selected,
                                            get_trials=lambda deepcopy=False: trials))

    assert not budget.extra_allowed(view({}), cfg, clock)  # no choice yet: a second selection round must fit
    chosen = view({attrs.SELECTED: {"trial": 1, "candidates": 2}})
    assert chosen.selected() is not None
    assert budget.extra_allowed(chosen, cfg, clock)  # chosen: the kept holdout rounds run
