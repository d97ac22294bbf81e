"""The study read once: a typed, frozen view of an Optuna study's trials and what the study floor
derives from them (the baseline, each config's current record and its chain of engine instances,
the deployed config), built once per step of the loop and passed down. The pick is
autotune.study.pareto.choose over a view (which imports this module, so it is not a field here).

Why: every helper used to re-query Optuna (``get_trials`` a dozen times a step, each a copy of the
storage's state at another moment), so two helpers of one step could see two different studies.
Here the trials are read once; the helpers take this view and never query the study themselves
(tests/test_study_view.py). Code that writes (ask, tell, enqueue, set an attribute) keeps the
Optuna study for writing only, and a writer that must see what it wrote builds a new view.

One home for the rules "which record is current" (a config re-measured on fresh engines is its
latest pooled record), "which trials used the budget", "which is the baseline" and "which config
was deployed", so the loop, the Pareto choice, the strategies, the schedule and the results agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from autotune.core import attrs
from autotune.core.attrs import BASELINE, DEPLOYED
from autotune.core.candidate import Candidate
from autotune.study.trials import counts


@dataclass(frozen=True, eq=False)
class StudyView:
    """An Optuna study as read at one moment (``StudyView.of``): its trials and their lookups."""

    name: str
    directions: tuple[StudyDirection, ...]
    user_attrs: Mapping[str, Any]  # the study's own attributes (objectives, levels, traces, ...)
    trials: tuple[FrozenTrial, ...]  # every trial, in number order
    by_number: Mapping[int, FrozenTrial]
    superseded: Mapping[int, int]  # trial -> the re-measurement that pools its windows with a fresh engine's
    baseline: FrozenTrial | None  # the completed baseline trial (its first engine)

    @classmethod
    def of(cls, study: Any) -> StudyView:
        """Read ``study`` (an Optuna study, or anything with its reading face) once."""
        trials = tuple(study.get_trials(deepcopy=False))
        done = [t for t in trials if t.state == TrialState.COMPLETE]
        superseded = {t.user_attrs[attrs.REMEASURE_OF]: t.number for t in done if attrs.REMEASURE_OF in t.user_attrs}
        baseline = next((t for t in done if t.user_attrs.get(attrs.ROLE) == BASELINE), None)
        by_number = {t.number: t for t in trials}
        return cls(name=study.study_name, directions=tuple(study.directions),
                   user_attrs=MappingProxyType(dict(study.user_attrs)), trials=trials,
                   by_number=MappingProxyType(by_number), superseded=MappingProxyType(superseded),
                   baseline=baseline)

    # --- trials by state and by use ----------------------------------------------------------

    def in_state(self, *states: TrialState) -> list[FrozenTrial]:
        return [t for t in self.trials if t.state in states]

    @property
    def completed(self) -> list[FrozenTrial]:
        """The completed trials (feasible or not, current records or not)."""
        return self.in_state(TrialState.COMPLETE)

    @property
    def running(self) -> list[FrozenTrial]:
        return self.in_state(TrialState.RUNNING)

    @property
    def waiting(self) -> list[FrozenTrial]:
        """Trials queued (enqueue_trial) and not asked yet."""
        return self.in_state(TrialState.WAITING)

    @property
    def finished(self) -> list[FrozenTrial]:
        """The trials that used the --candidates budget (fresh-engine re-measurements and a depth
        schedule's measurements do not)."""
        return [t for t in self.trials if counts(t) and attrs.role(t) not in attrs.OUTSIDE_BUDGET]

    @property
    def current(self) -> list[FrozenTrial]:
        """Each completed config's current record (not superseded by a pooled re-measurement); a holdout
        trial is no record (it never enters the choice: autotune.study.holdout)."""
        return [t for t in self.completed if t.number not in self.superseded and attrs.role(t) != attrs.HOLDOUT]

    def trial(self, number: int) -> FrozenTrial:
        return self.by_number[number]

    # --- records of one config -----------------------------------------------------------------

    def latest(self, t: FrozenTrial | None) -> FrozenTrial | None:
        """``t``'s current record: its last re-measurement on a fresh engine where there is one (each
        round of fresh engines pools with the record before it)."""
        if t is None:
            return None
        n = t.number
        while n in self.superseded:
            n = self.superseded[n]
        return t if n == t.number else self.by_number[n]

    def record_chain(self, t: FrozenTrial) -> list[FrozenTrial]:
        """``t``'s config's records up to ``t``, its first engine first: each re-measurement round pools
        the record before it (``REMEASURE_OF``), so the chain is one trial per engine instance."""
        chain = [t]
        while attrs.REMEASURE_OF in chain[-1].user_attrs and chain[-1].user_attrs[attrs.REMEASURE_OF] in self.by_number:
            chain.append(self.by_number[chain[-1].user_attrs[attrs.REMEASURE_OF]])
        return chain[::-1]

    def first_record(self, t: FrozenTrial) -> FrozenTrial:
        """The trial that measured ``t``'s config on its first engine (``t`` itself unless a re-measurement)."""
        return self.record_chain(t)[0]

    @property
    def reference(self) -> FrozenTrial | None:
        """The baseline's current record (speedups are ratios to its measurement)."""
        return self.latest(self.baseline)

    # --- the study's choices ---------------------------------------------------------------------

    @property
    def sign(self) -> int:
        """1 where the first (primary) objective is maximized, -1 where minimized."""
        return 1 if self.directions[0] == StudyDirection.MAXIMIZE else -1

    def selected(self) -> dict[str, Any] | None:
        """The final choice (autotune.study.select), where the selection phase has ended since the last
        candidate was measured (a resumed study with a larger budget chooses again)."""
        sel = self.user_attrs.get(attrs.SELECTED)
        if not sel or sel.get("trial") not in self.by_number or sel.get("candidates") != len(self.finished):
            return None
        return dict(sel)

    def deployed(self) -> FrozenTrial | None:
        """The trial that measured the deployed config (a warm start) in this study, if any.

        The re-measurement may be another trial: the baseline (the deployed config had no speculation,
        so it was a duplicate), or a retry after an interruption.
        """
        marked = next((t for t in self.trials if t.user_attrs.get(attrs.ROLE) == DEPLOYED), None)
        if marked is None:
            return None
        key = Candidate(marked.user_attrs.get(attrs.CANDIDATE, {})).key()
        measured = [t for t in self.trials
                    if counts(t) and Candidate(t.user_attrs.get(attrs.CANDIDATE, {})).key() == key]
        return next((t for t in measured if t.state == TrialState.COMPLETE), measured[0] if measured else None)

    def left_out(self) -> list[str]:
        """The labels of configs queued (--try, a warm start) but never measured: the budget was used first."""
        measured = {Candidate(attrs.candidate(t)).key() for t in self.trials if counts(t)}
        return list(dict.fromkeys(attrs.label(t) for t in self.trials
                                  if attrs.LEFT_OUT in t.user_attrs
                                  and Candidate(attrs.candidate(t)).key() not in measured))
