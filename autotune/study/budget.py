"""Wall-clock bounds of a study: ``--time-budget`` and trial timeouts sized from the baseline.

At GPU scale one engine start (weights, torch.compile, graph capture) takes minutes, so a study is
bounded by time as well as by ``--candidates``. The rule: a new candidate starts only while the time
left holds one more trial and the first two holdout rounds of the pick (four fresh engines: the pick
and the baseline twice, the fewest pairs an interval rests on), each costed at the median wall time
of the trials measured so far; those always run once the choice is final, so the study ends with a
figure. Later work (selection rounds, more holdout rounds up to ``--pairs``) runs only while it
fits, a selection round before the choice only with the kept rounds' time after it; out of time in
the middle of the selection, the choice is made on what was measured (autotune.study.loop._extra).
What was left out is said in one line; a holdout cut short leaves the pick with no interval, and
best.json says why.

A trial timeout the user did not give is sized from the baseline's own start and replay: at least
the fixed default, and ``TIMEOUT_FACTOR`` times the baseline's wall time (a candidate may start a
draft model too, or compile where the baseline did not).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

from optuna.trial import TrialState

from autotune.core import attrs
from autotune.measure.config import StudyConfig
from autotune.study.view import StudyView

TIMEOUT_FACTOR = 3.0
REMEASURE_ENGINES = 2  # one round: the pick and the baseline, each on a fresh engine
KEPT_ROUNDS = 2  # holdout rounds whose time is kept: the fewest pairs a t-interval rests on


@dataclass
class Clock:
    """A study run's start (this process: a resumed study's budget counts from its resumption)."""

    budget_s: float | None
    start: float = field(default_factory=time.monotonic)
    started_at: float = field(default_factory=time.time)  # the same moment, as trials' datetimes count it

    def elapsed(self) -> float:
        return time.monotonic() - self.start


def _typical_wall(view: StudyView, clock: Clock) -> float | None:
    """What one more trial costs: the median worker wall time of the trials so far, or, where more,
    this run's time per finished trial (the study's own work between workers counts too)."""
    done = [t for t in view.in_state(TrialState.COMPLETE, TrialState.FAIL) if attrs.WALL_S in t.user_attrs]
    if not done:
        return None
    here = [t for t in done if t.datetime_complete is not None and t.datetime_complete.timestamp() >= clock.started_at]
    per = clock.elapsed() / len(here) if here else 0.0
    return max(statistics.median(float(t.user_attrs[attrs.WALL_S]) for t in done), per)


def _remeasured(view: StudyView) -> bool:
    return any(attrs.role(t) in (attrs.REMEASURE, attrs.HOLDOUT) for t in view.trials)


def _holdout_rounds(view: StudyView) -> int:
    return len({attrs.round_of(t) for t in view.trials if attrs.role(t) == attrs.HOLDOUT})


def out_of_time(view: StudyView, cfg: StudyConfig, clock: Clock) -> bool:
    """No time for another candidate and the pick's re-measurement after it (see the module docstring)."""
    if clock.budget_s is None:
        return False
    wall = _typical_wall(view, clock)
    if wall is None:  # nothing measured yet: the baseline always runs
        return False
    later = REMEASURE_ENGINES * KEPT_ROUNDS if cfg.remeasure and not _remeasured(view) else 0
    return clock.elapsed() + wall * (1 + later) > clock.budget_s


def extra_allowed(view: StudyView, cfg: StudyConfig, clock: Clock) -> bool:
    """Whether work on top of the trials (a schedule's, selection and holdout rounds) may be queued now:
    the first KEPT_ROUNDS holdout rounds always (their time was kept); before the choice is final, a
    round only while it fits with the kept rounds after it (the first selection round too: the
    study's time then holds the pick's figure, give or take the cost estimate); later rounds while one fits."""
    if clock.budget_s is None:
        return True
    held = _holdout_rounds(view)
    chosen = view.selected() is not None
    if held < KEPT_ROUNDS and (held or chosen):
        return True  # the kept holdout rounds, once the choice is final, whatever the selection rounds took
    if any(attrs.role(t) in attrs.OUTSIDE_BUDGET for t in view.waiting):
        return True  # a round already queued is finished
    wall = _typical_wall(view, clock) or 0.0
    kept = REMEASURE_ENGINES * KEPT_ROUNDS if cfg.remeasure and not chosen and not held else 0
    return clock.elapsed() + wall * (REMEASURE_ENGINES + kept) <= clock.budget_s


def left_out_line(view: StudyView, cfg: StudyConfig, clock: Clock) -> str:
    """One line: the time budget ended the search, with how much of --candidates was left."""
    done = len([t for t in view.in_state(TrialState.COMPLETE, TrialState.FAIL)
                if attrs.role(t) not in attrs.OUTSIDE_BUDGET])
    return (f"time budget: {clock.budget_s / 60:g} min, {clock.elapsed() / 60:.1f} used; {done} of the {cfg.n_trials} "
            f"--candidates measured, {max(cfg.n_trials - done, 0)} left out (a larger --time-budget with --resume "
            "measures them); the pick is the best measured so far")


def trial_timeout(view: StudyView, cfg: StudyConfig) -> float:
    """The time limit of the next trial: ``cfg.trial_timeout_s``, or, when the user gave none
    (``cfg.timeout_from_baseline``), at least that and TIMEOUT_FACTOR x the baseline's wall time."""
    if not cfg.timeout_from_baseline:
        return cfg.trial_timeout_s
    base = view.baseline
    wall = base.user_attrs.get(attrs.WALL_S) if base is not None else None
    return max(cfg.trial_timeout_s, TIMEOUT_FACTOR * float(wall)) if wall else cfg.trial_timeout_s


def baseline_timed_out(limit: float, cfg: StudyConfig) -> str:
    """The clause a timed-out baseline's failure ends with: the time it had, where that came from, and
    the flag that gives it more (a timed-out baseline ends the study)."""
    how = ("set by --trial-timeout" if not cfg.timeout_from_baseline
           else "sized from the model and platform, autotune.run.model_fetch")
    return f"; the baseline had {limit:.0f} s ({how}): give it more with --trial-timeout SECONDS"
