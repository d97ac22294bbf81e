"""Which trials count: a typed view of a study's trials that every other module of the study floor reads.

One home for the rules "which record is current" (a config re-measured on fresh engines is its
latest pooled record), "which trials used the budget", "which is the baseline" and "is this a
depth schedule", so the loop, the Pareto choice, the strategies and the schedule agree.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.core import attrs
from autotune.core.attrs import BASELINE, DEPLOYED
from autotune.core.candidate import Candidate

SCHEDULE_KEY = "num_speculative_tokens_per_batch_size"  # vLLM's speculative_config key for a depth schedule


def counts(t: FrozenTrial) -> bool:
    """A trial that used up budget: measured, failed or pruned (an engine ran) on its own, not a
    duplicate, not interrupted."""
    return ((t.state in (TrialState.COMPLETE, TrialState.FAIL)
             or (t.state == TrialState.PRUNED and attrs.PRUNED_WHY in t.user_attrs))
            and attrs.DUPLICATE_OF not in t.user_attrs and not t.user_attrs.get(attrs.INTERRUPTED))


def finished(study: optuna.Study) -> list[FrozenTrial]:
    """The trials that used the --trials budget (fresh-engine re-measurements and a depth schedule's
    measurements do not)."""
    return [t for t in study.get_trials(deepcopy=False) if counts(t) and attrs.role(t) not in attrs.OUTSIDE_BUDGET]


def first_record_number(study: optuna.Study, t: FrozenTrial) -> int:
    return first_record(study, t).number


def baseline_trial(study: optuna.Study) -> FrozenTrial | None:
    """The completed baseline trial, if any."""
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if t.user_attrs.get(attrs.ROLE) == BASELINE:
            return t
    return None


def trial_dir(results_dir: Path, number: int) -> Path:
    """A trial's folder: its job, events, result and worker.log (``results/<study>/trials/NNNN``)."""
    return results_dir / "trials" / f"{number:04d}"


def feasible(t: FrozenTrial) -> bool:
    return t.state == TrialState.COMPLETE and all(c <= 0 for c in t.constraints.values())


def superseded(study: optuna.Study) -> dict[int, int]:
    """Trial -> the re-measurement that pools its windows with a fresh engine's (the later record)."""
    out: dict[int, int] = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if attrs.REMEASURE_OF in t.user_attrs:
            out[t.user_attrs[attrs.REMEASURE_OF]] = t.number
    return out


def latest(study: optuna.Study, t: FrozenTrial | None) -> FrozenTrial | None:
    """``t``'s current record: its last re-measurement on a fresh engine where there is one (each
    round of fresh engines pools with the record before it)."""
    if t is None:
        return None
    by, n = superseded(study), t.number
    while n in by:
        n = by[n]
    return t if n == t.number else next(x for x in study.get_trials(deepcopy=False) if x.number == n)


def record_chain(study: optuna.Study, t: FrozenTrial) -> list[FrozenTrial]:
    """``t``'s config's records up to ``t``, its first engine first: each re-measurement round pools
    the record before it (``REMEASURE_OF``), so the chain is one trial per engine instance."""
    trials = {x.number: x for x in study.get_trials(deepcopy=False)}
    chain = [t]
    while attrs.REMEASURE_OF in chain[-1].user_attrs and chain[-1].user_attrs[attrs.REMEASURE_OF] in trials:
        chain.append(trials[chain[-1].user_attrs[attrs.REMEASURE_OF]])
    return chain[::-1]


def first_record(study: optuna.Study, t: FrozenTrial) -> FrozenTrial:
    """The trial that measured ``t``'s config on its first engine (``t`` itself unless a re-measurement)."""
    return record_chain(study, t)[0]


def reference_trial(study: optuna.Study) -> FrozenTrial | None:
    """The baseline's current record (speedups are ratios to its measurement)."""
    return latest(study, baseline_trial(study))


def is_schedule(t: FrozenTrial) -> bool:
    """A depth schedule's trial (autotune.study.schedule), or its re-measurement."""
    return SCHEDULE_KEY in attrs.candidate(t)


def deployed_trial(study: optuna.Study) -> FrozenTrial | None:
    """The trial that measured the deployed config (a warm start) in this study, if any.

    The re-measurement may be another trial: the baseline (the deployed config had no speculation,
    so it was a duplicate), or a retry after an interruption.
    """
    trials = study.get_trials(deepcopy=False)
    marked = next((t for t in trials if t.user_attrs.get(attrs.ROLE) == DEPLOYED), None)
    if marked is None:
        return None
    key = Candidate(marked.user_attrs.get(attrs.CANDIDATE, {})).key()
    measured = [t for t in trials if counts(t) and Candidate(t.user_attrs.get(attrs.CANDIDATE, {})).key() == key]
    return next((t for t in measured if t.state == TrialState.COMPLETE), measured[0] if measured else None)


def completed(study: optuna.Study) -> list[FrozenTrial]:
    """The study's completed trials (feasible or not, current records or not)."""
    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))


def left_out(study: Any) -> list[str]:
    """The labels of configs queued (--try, a warm start) but never measured: the budget was used first."""
    trials = study.get_trials(deepcopy=False)
    measured = {Candidate(attrs.candidate(t)).key() for t in trials
                if counts(t)}
    return list(dict.fromkeys(attrs.label(t) for t in trials
                              if attrs.LEFT_OUT in t.user_attrs and Candidate(attrs.candidate(t)).key() not in measured))



def waiting(study: optuna.Study) -> bool:
    return bool(study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))

