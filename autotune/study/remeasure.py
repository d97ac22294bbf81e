"""Fresh-engine re-measurements: after the budget, the pick and the baseline are measured again on
fresh engines, in rounds, until the pick's paired speedup is resolved (autotune.measure.resolution)."""

from __future__ import annotations


import optuna
from optuna.trial import TrialState

from autotune.core import attrs
from autotune.measure.config import StudyConfig
from autotune.measure.metrics import instances_of
from autotune.core.space import SearchSpace
from autotune.study.opening import optuna_params, ranges_attr
from autotune.study.trials import SCHEDULE_KEY
from autotune.study.schedule import scheduled_trial
from autotune.study.schedule import next_step as schedule_step
from autotune.study.view import StudyView



MAX_REMEASURES = 4  # fresh-engine re-measurements beyond 2 x --pairs after which no new pick starts its rounds


def extra_work(study: optuna.Study, view: StudyView, space: SearchSpace, cfg: StudyConfig) -> bool:
    """Queue what comes on top of --trials: a depth schedule's measurements (two or more load
    levels), then the fresh-engine re-measurements. True while any is queued. ``study``: for
    queueing (and the schedule's plan) only; ``view``: the study as this step read it."""
    waiting = view.waiting
    if waiting and all(attrs.role(t) in attrs.OUTSIDE_BUDGET for t in waiting):
        return True
    step = schedule_step(study, view, space, cfg.settings.max_model_len) if cfg.schedule else None
    if step is not None:
        params = {**step["params"], SCHEDULE_KEY: step["ranges"]} if "ranges" in step else step["params"]
        study.enqueue_trial(optuna_params(params),
                            user_attrs={attrs.ROLE: step["role"], attrs.PLANNED: step["why"], **ranges_attr(params)})
        return True
    # The schedule's plan just noted (if any) is not in ``view``; what follows reads it only through a
    # schedule trial, which the note never adds.
    return cfg.remeasure and queue_remeasure(study, view, cfg.pairs)


def queue_remeasure(study: optuna.Study, view: StudyView, pairs: int = 1) -> bool:
    """Queue a round of fresh engines for the pick and the baseline: the pick's own record and the
    baseline's pool each new instance's windows (autotune.measure.metrics.pool), so the pick's interval
    includes the spread between engine instances. Rounds go on, up to ``pairs``, while the pick's
    speedup over the baseline, with instance pairs as the unit (autotune.measure.resolution), still
    straddles the tie band, after at least FIGURE_PAIRS (the pick's figure leaves out the trial that
    selected it, so it rests on these rounds alone). True if queued.

    The pick may change once rounds began (its pooled record regressed). A cap on all rounds would
    then leave the new pick with fewer pairs than its figure needs, so the caps count rounds: no new
    pick starts its rounds, and no round past min(``pairs``, FIGURE_PAIRS) is added, once the study
    made 2 x ``pairs`` + MAX_REMEASURES re-measurements; a pick that began its rounds finishes
    min(``pairs``, FIGURE_PAIRS) of its own, within a safety cap of that many more."""
    from autotune.measure.resolution import FIGURE_PAIRS, resolve
    from autotune.study.pareto import choose

    again = [t for t in view.trials if attrs.role(t) == attrs.REMEASURE and not attrs.is_interrupted(t)]
    if any(t.state in (TrialState.WAITING, TrialState.RUNNING) for t in again) or view.waiting:
        return False  # a round in flight; configs asked for (--try) go first
    needed = min(pairs, FIGURE_PAIRS)  # the rounds a pick's figure rests on (fewer where --pairs says so)
    soft_cap = 2 * pairs + MAX_REMEASURES
    if len(again) >= soft_cap + 2 * needed:
        return False  # the safety cap: however often the pick changed
    choice, base = choose(view), view.reference
    if choice is None or base is None or view.first_record(choice.trial).number == view.first_record(base).number:
        return False  # the baseline (or its pooled record) is the pick: nothing to confirm against it
    chosen = scheduled_trial(view) or choice.trial  # a recommended depth schedule is the pick
    rounds = len(instances_of(attrs.measurement(chosen))) - 1
    if len(again) >= soft_cap and not 0 < rounds < needed:
        return False  # only a pick part-way through the rounds its figure needs goes on
    if any(t.user_attrs.get(attrs.REMEASURE_OF) == chosen.number for t in again):
        return False  # its round failed: the record stands as it is
    if rounds == 0:
        sign = view.sign
        pooled = [t for t in again if t.state == TrialState.COMPLETE and attrs.REMEASURE_OF in t.user_attrs
                  and view.first_record(t).number != view.first_record(base).number]
        if pooled and all(sign * chosen.values[0] <= sign * t.values[0] for t in pooled):
            return False  # a pooled pick stands unless another beats it outright (not a tie)
    else:
        res = resolve(attrs.measurement(chosen), attrs.measurement(base))
        # the figure needs FIGURE_PAIRS pairs besides the selecting trial; more only while undecided
        if rounds >= pairs or (rounds >= FIGURE_PAIRS and (res is None or res.decided)):
            return False
    # ABBA over rounds: with the first measurements (baseline first), round 1 runs the pick's fresh
    # engine first, round 2 the baseline's, and so on, so a drift of the machine's speed over the
    # study lands on both sides of the pooled ratio alike.
    order = (chosen, base) if rounds % 2 == 0 else (base, chosen)
    for t in order:
        params = attrs.candidate(t)  # the baseline has no Optuna params
        beyond = t.user_attrs.get(attrs.PAST_EDGE)  # past the space's edge: Optuna gets the in-space values
        study.enqueue_trial({**optuna_params(params), **{k: t.params[k] for k in beyond or {} if k in t.params}},
                            user_attrs={attrs.ROLE: attrs.REMEASURE, attrs.REMEASURE_OF: t.number, **ranges_attr(params),
                                        **({attrs.PAST_EDGE: beyond} if beyond else {})})
    return True
