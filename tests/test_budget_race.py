"""Two workers of one process (--workers 2) never run past --trials: reading the budget and asking are
one step (autotune.study.loop._ASK). A FAKE study in memory (tests/sim_study.py), its asks slowed so
that both workers read "3 of 4" before either's trial exists, which the suite's load once did by chance."""

from __future__ import annotations

import time

import optuna
from optuna.trial import TrialState

from autotune.core import attrs
from autotune.core.space import load_space
from autotune.core.workload import load_workload
from autotune.measure.config import Settings, StudyConfig
from machine_noise import Noise
from sim_study import SPACE, WORKLOAD, Truth, in_memory


def test_two_workers_never_run_past_the_trial_budget(monkeypatch, tmp_path):
    from autotune.study import loop

    ask = optuna.Study.ask

    def slow_ask(self, *a, **k):
        time.sleep(0.4)  # the window between reading the budget and the asked trial counting as running
        return ask(self, *a, **k)

    monkeypatch.setattr(optuna.Study, "ask", slow_ask)
    cfg = StudyConfig(name="race", results_dir=tmp_path,
                      settings=Settings(model="fake-model"), objectives=("output_tok_s",), n_trials=4, strategy="grid",
                      remeasure=False, engine_module="fake_engine", samples=0, seed=0)

    with in_memory(0, Noise(phi=0.0), Truth.drawn(0)):
        measure = loop.run_one  # the FAKE study's engine instance, made to take a little time as one does

        def run_one(*a, **k):
            time.sleep(0.1)
            return measure(*a, **k)

        loop.run_one = run_one  # not monkeypatch: in_memory restores the real one on leaving, after this
        try:
            space = load_space(str(SPACE), platform="cpu", models=set())
            study = loop.run_study(cfg, load_workload(str(WORKLOAD)), space, worker_envs=({}, {}))
        finally:
            loop.run_one = measure
    # --trials 4: the baseline and three candidates. A fifth asked is the overrun: here the grid drew a
    # config already taken and the duplicate check pruned it; with a sampler it is a fifth measurement.
    candidates = [t for t in study.trials if t.user_attrs.get(attrs.LABEL) != "none"]
    assert len(candidates) == 3, [(t.number, t.state.name, t.user_attrs.get(attrs.LABEL)) for t in study.trials]
    measured = [t for t in study.trials if t.state == TrialState.COMPLETE and attrs.DUPLICATE_OF not in t.user_attrs]
    assert len(measured) == 4
    assert len({t.user_attrs[attrs.WORKER] for t in measured}) == 2
