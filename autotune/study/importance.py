"""Optuna's parameter importances for a saved study (the report's importance chart)."""

from __future__ import annotations

import warnings
from pathlib import Path

import optuna

from autotune.core import attrs


def param_importances(db: Path, name: str, objectives: list[str], min_trials: int
                      ) -> tuple[int, dict[str, dict[str, float]] | None, str]:
    """``(completed trials with parameters, objective -> parameter -> importance, note)``; the
    importances are None (and the note says why) when the storage cannot be read or holds too few trials."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = optuna.load_study(study_name=name, storage=f"sqlite:///{db.resolve()}")
    except Exception as e:  # noqa: BLE001 - an optional plot: a storage it cannot read becomes a note
        return 0, None, f"{db}: Optuna could not load study {name!r} ({type(e).__name__}: {e})."
    # First measurements only: a selection round's pooled record or a holdout instance measures a config
    # already counted again, and would weigh it (and the knobs it has) once per engine.
    first = [t for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
             if t.params and attrs.REMEASURE_OF not in t.user_attrs
             and t.user_attrs.get(attrs.ROLE) not in (attrs.HOLDOUT, attrs.EXTRA_BASELINE)]
    n = len(first)
    if n < min_trials:
        return n, None, (f"Too few trials for parameter importances: {n} first measurements with parameters, "
                         f"at least {min_trials} needed.")
    # PED-ANOVA: no scikit-learn (fANOVA needs it), and it copes with conditional parameters (the
    # baseline has none, which leaves fANOVA nothing in common). Its top quantile must hold at
    # least two trials, or every parameter comes out equal.
    evaluator = optuna.importance.PedAnovaImportanceEvaluator(target_quantile=max(0.1, 2 / n))
    counted = optuna.create_study(directions=study.directions)  # in memory: the first measurements alone
    counted.add_trials(first)
    names = objectives or [f"objective {i}" for i in range(len(study.directions))]
    found: dict[str, dict[str, float]] = {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # ExperimentalWarning for the evaluator
            for i, objective in enumerate(names):
                found[objective] = optuna.importance.get_param_importances(
                    counted, evaluator=evaluator, target=lambda t, i=i: t.values[i])
    except (ValueError, RuntimeError) as e:
        return n, None, f"Optuna could not compute parameter importances: {e}"
    return n, found, ""
