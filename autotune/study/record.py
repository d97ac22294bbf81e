"""One trial from ask to tell: duplicates and baselines given way to, the worker run, pruning, the
evaluation, pooling with an earlier record of the same config, and what Optuna is told."""

from __future__ import annotations

import threading
from dataclasses import replace
from collections.abc import Callable
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.core import attrs
from autotune.core.attrs import BASELINE
from autotune.core.candidate import Candidate
from autotune.measure.config import Progress, StudyConfig
from autotune.run.evaluate import CONSTRAINTS, Evaluation, Reference, evaluate, slo_constraints, trial_job
from autotune.forecast.forecast import Forecast
from autotune.measure.metrics import pool, unresolved_latency
from autotune.measure.objectives import objective_values
from autotune.study.optuna_private import heartbeat, set_trial_attr
from autotune.core.space import SearchSpace
from autotune.study.trials import SCHEDULE_KEY, counts, trial_dir
from autotune.study.strategy import forecast_for
from autotune.study.view import StudyView
from autotune.run.worker import PRUNED, TrialOutcome, explain, run_trial
from autotune.study.budget import baseline_timed_out, trial_timeout
from autotune.core.workload import Workload



def mark_interrupted(study: optuna.Study, t: FrozenTrial | optuna.Trial, failure: str) -> None:
    """Fail a RUNNING trial that was cut short (Ctrl-C, a dead worker), recording why. It is not
    counted and not a duplicate: its candidate is measured again (``_retry_interrupted``)."""
    set_trial_attr(study, t, attrs.FAILURE, failure)
    set_trial_attr(study, t, attrs.INTERRUPTED, True)
    study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)


def duplicate_of(view: StudyView, cand: Candidate, number: int, is_base: bool) -> int | None:
    """A trial already measuring or measured ``cand`` (for the baseline: the baseline that goes first).

    Workers record the candidate before this check, and ``view`` is read after that, so of two
    workers that drew the same config at once, the later to record it always sees the earlier one:
    it is never measured twice.
    """
    if is_base:
        return _other_baseline(view, number)
    key = cand.key()
    for t in view.in_state(TrialState.COMPLETE, TrialState.FAIL, TrialState.RUNNING, TrialState.PRUNED):
        if t.number != number and (counts(t) or t.state == TrialState.RUNNING) and \
                Candidate(t.user_attrs.get(attrs.CANDIDATE, {})).key() == key:
            return t.number
    return None


def _other_baseline(view: StudyView, number: int) -> int | None:
    """The baseline trial this one gives way to, if any. A queued baseline carries its role from the
    start, so among queued ones the lowest number goes first with no race; a baseline made on the
    fly (nothing queued was popped) gives way to any other. A failed one may be tried again."""
    trials = [t for t in view.in_state(TrialState.WAITING, TrialState.RUNNING, TrialState.COMPLETE)
              if t.user_attrs.get(attrs.ROLE) == BASELINE and attrs.DUPLICATE_OF not in t.user_attrs]
    me = next((t for t in trials if t.number == number), None)
    queued = me is not None and me.user_attrs.get(attrs.QUEUED)
    for t in trials:
        if t.number == number:
            continue
        if t.state == TrialState.COMPLETE or not queued or (t.user_attrs.get(attrs.QUEUED) and t.number < number):
            return t.number
    return None


def _reference(view: StudyView) -> Reference:
    ua = view.baseline.user_attrs
    return Reference(ua.get(attrs.OUTPUTS, []), ua.get(attrs.SAMPLES, {}), ua.get(attrs.SCORES, {}),
                     tuple(view.user_attrs.get(attrs.NUMERICS_FLOOR, ())), numerics=view.user_attrs.get(attrs.NUMERICS),
                     runner=attrs.measurement(view.baseline).get("model_runner"))


def run_one(study: optuna.Study, view: StudyView, trial: optuna.Trial, cand: Candidate, workload: Workload,
            space: SearchSpace, cfg: StudyConfig, progress: Progress, is_base: bool, *, env: dict[str, str],
            stop: threading.Event | None) -> None:
    """Measure ``trial`` (asked, its candidate recorded) and tell Optuna. ``study``: for the heartbeat
    and the tell; ``view``: the study as read after the ask, which every judgement reads."""
    n = trial.number
    progress.trial_started(n, cand.label)
    reference = None if is_base else _reference(view)
    # none for the baseline's own config (trial 0 and its fresh engines): its speedup is 1 by definition
    again = view.baseline is not None and cand.key() == Candidate(attrs.candidate(view.baseline)).key()
    forecast = None if is_base or again or SCHEDULE_KEY in cand.params else \
        forecast_for(view, space, cand.params, cfg.settings.max_model_len)
    if forecast is not None:  # what the model expected, before the measurement can tell it
        trial.set_user_attr(attrs.PREDICTED, forecast.to_dict())
    job = trial_job(cand, workload, cfg, reference)
    trial.set_user_attr(attrs.DEVICES, env)
    prune, why = threading.Event(), []
    judge = _pruner(view, cfg, cand, trial, forecast, is_base)

    def on_event(e: dict[str, Any]) -> None:
        progress.trial_event(n, e)
        if judge is not None and e.get("phase") == "window_done" and e.get("window") == 1 and not prune.is_set():
            reason = judge(float(e.get("output_tok_s", float("nan"))))
            if reason:
                why.append(reason)
                prune.set()

    limit = trial_timeout(view, cfg)
    try:
        # Heartbeats (RDB storages) tell other workers this trial is alive; Optuna's own thread does it.
        with heartbeat(study, trial):
            outcome = run_trial(job, trial_dir(cfg.results_dir, n), timeout_s=limit, env=env,
                                stop=stop, on_event=on_event, prune=prune)
    except KeyboardInterrupt:
        mark_interrupted(study, trial, "interrupted by the user")  # --resume measures it again
        raise
    trial.set_user_attr(attrs.WALL_S, round(outcome.wall_s, 2))
    if outcome.failure == PRUNED and why:  # stopped after its first window: recorded with the reason
        trial.set_user_attr(attrs.PRUNED_WHY, why[0])
        study.tell(trial, state=TrialState.PRUNED)
        progress.trial_finished(n, cand.label, f"pruned after its first window: {why[0]}")
        return
    if is_base and outcome.failure and outcome.failure.startswith("timeout"):
        outcome = replace(outcome, failure=outcome.failure + baseline_timed_out(limit, cfg))
    summary = _record(study, view, trial, cand, outcome, job, cfg, reference)
    if attrs.REMEASURE_OF in trial.user_attrs:
        summary = (f"selection round {trial.user_attrs.get(attrs.ROUND)}, fresh engine, pooled with trial "
                   f"{trial.user_attrs[attrs.REMEASURE_OF]}: {summary}")
    elif attrs.role(trial) == attrs.HOLDOUT:  # never pooled: the figure's pairs, after the choice
        summary = f"holdout round {trial.user_attrs.get(attrs.ROUND)}, not pooled: {summary}"
    told = StudyView.of(study)  # read after the tell: the trial as told, the baseline's record as it is now
    if forecast is not None:
        summary += "; " + _against(told, trial.number, forecast)
    progress.trial_finished(n, cand.label, summary)
    if (line := left_out_once(told, n, cfg)) is not None:
        progress.note(line)


def left_out_once(view: StudyView, number: int, cfg: StudyConfig) -> str | None:
    """Said once a study, at its first complete trial (by number) with a TPOT or ITL objective or SLO its
    stream did not time (autotune.measure.coalescing): which, why, and what the pick rests on instead;
    None for any other trial. Such an objective is told as its worst value, an SLO as met (objective_values,
    autotune.measure.slo): numbers from no data, never shown."""
    def unmeasured(t: FrozenTrial) -> tuple[list[str], list[str]]:
        if t.state != TrialState.COMPLETE:
            return [], []
        m = attrs.measurement(t)
        return objective_values(m, cfg.objectives)[1], [s.text for s in cfg.slos if objective_values(m, [s.metric])[1]]
    objectives, slos = unmeasured(view.trial(number))
    if not (objectives or slos) or any(any(unmeasured(o)) for o in view.trials if o.number < number):
        return None  # measured, or an earlier trial said it
    names = ", ".join(dict.fromkeys([*objectives, *(s.metric for s in cfg.slos if s.text in slos)]))
    why = " (tokens reached the client in bursts)" if unresolved_latency(attrs.measurement(view.trial(number))) else ""
    ranked = ", ".join(o for o in cfg.objectives if o not in objectives) or "none measured: every trial ties"
    where = ([f"the objectives (the pick rests on {ranked})"] if objectives else []) + \
        ([f"--slo {', '.join(slos)}"] if slos else [])
    return f"latency: {names} not measured{why}: left out of {' and '.join(where)}"


def _pruner(view: StudyView, cfg: StudyConfig, cand: Candidate, trial: optuna.Trial, forecast: Forecast | None,
            is_base: bool) -> Callable[[float], str | None] | None:
    """For a candidate the study may stop early (``--prune``): a function of its first window's
    throughput that says why it cannot reach the best measured config (autotune.forecast.policy.hopeless),
    or None. Not for the baseline, re-measurements, a depth schedule's or a deployed config's trials,
    studies with several load levels (a config slow at one may win at another), a first objective
    other than throughput, or a config the user asked for (--try)."""
    from autotune.forecast.policy import hopeless
    from autotune.study.strategy import study_model

    if not cfg.prune or is_base or cfg.extra_loads or cfg.objectives[0] != "output_tok_s" \
            or attrs.role(trial) is not None or SCHEDULE_KEY in cand.params or trial.user_attrs.get(attrs.ASKED):
        return None  # a config the user asked for (--try) is measured whole
    got = study_model(view, None, cfg.settings.max_model_len)
    base = view.reference
    if got is None or base is None or not attrs.measurement(base).get("output_tok_s"):
        return None
    model, observations, _ = got
    feasible = [o for o in observations if o.feasible]
    best = max(feasible, key=lambda o: o.speedup) if feasible else None
    if best is None or best.speedup <= 1.0:
        return None  # nothing beats the baseline yet: every candidate may
    noise = best.rel_sd(model.noise)  # at least the model's noise, itself at least forecast.FLOOR
    base_tok_s = float(attrs.measurement(base)["output_tok_s"])
    hi = forecast.hi if forecast is not None and forecast.speedup is not None else None
    return lambda tok_s: hopeless(tok_s / base_tok_s, best.speedup, noise, hi)


def _against(view: StudyView, number: int, forecast: Forecast) -> str:
    """Predicted beside measured, in one line: measured is this line's tok/s over the baseline's first
    engine's, named (``over trial 0``), the figure trials.csv keeps as ``speedup_over_first_baseline``."""
    from autotune.study.pareto import over_first_baseline

    t, base = view.trial(number), view.baseline
    said = (f"predicted {forecast.speedup:.2f}x [{forecast.lo:.2f}-{forecast.hi:.2f}]" if forecast.speedup is not None
            else "no prediction")
    ratio = over_first_baseline(view, t) if base is not None else None
    return said if ratio is None else f"{said}, measured {ratio:.2f}x over trial {base.number}"


def pooled(ev: Evaluation, before: FrozenTrial, cfg: StudyConfig) -> Evaluation:
    """A fresh engine's evaluation as the record of every instance so far: each metric from all
    windows (autotune.measure.metrics.pool), the SLOs judged on those pooled metrics, and each correctness
    constraint the worse of the two records' (both engines' outputs must pass)."""
    m = pool(attrs.measurement(before), ev.measurement)
    constraints = dict(ev.constraints)
    earlier = dict(zip(CONSTRAINTS, attrs.verdict(before).get("constraints") or ()))
    for key, value in earlier.items():
        constraints[key] = max(constraints.get(key, value), value)
    slos, missed = slo_constraints(m, cfg)
    # a TPOT/ITL objective neither instance's stream timed gets its worst value (objective_values)
    return replace(ev, measurement=m, values=objective_values(m, cfg.objectives)[0],
                   constraints={**constraints, **slos}, slo_missed=missed)


def _record(study: optuna.Study, view: StudyView, trial: optuna.Trial, cand: Candidate, outcome: TrialOutcome,
            job: dict[str, Any], cfg: StudyConfig, reference: Reference | None) -> str:
    """Judge the outcome and tell Optuna: values, constraints, and everything a report reads."""
    if outcome.raw is None:
        cause = explain(outcome.log_path)
        trial.set_user_attr(attrs.FAILURE, outcome.failure + cause)
        study.tell(trial, state=TrialState.FAIL)
        return f"failed: {outcome.failure}{cause}"
    of = trial.user_attrs.get(attrs.REMEASURE_OF)
    base = view.baseline
    # the baseline on a fresh engine (a selection or holdout round): its flips are the study's numerics floor
    again = of if of is not None else trial.user_attrs.get(attrs.HOLDOUT_OF)
    second = reference is not None and again is not None and base is not None and again == base.number
    ev = evaluate(outcome.raw, job["requests"], cand, cfg, reference, second_baseline=second)
    if second:  # the baseline's floor: it widens every later verdict's near-tie threshold, up to the cap
        # ``view`` holds every earlier floor: a round is queued only when the one before it has ended
        cap = (view.user_attrs.get(attrs.NUMERICS) or {}).get("cap", float("inf"))
        floor = [*view.user_attrs.get(attrs.NUMERICS_FLOOR, ()), *(m for m in ev.verdict.flip_margins if m < cap)]
        study.set_user_attr(attrs.NUMERICS_FLOOR, floor)
        if ev.verdict.numerics_findings:  # flips above the cap: reported, widening nothing
            found = [*view.user_attrs.get(attrs.NUMERICS_FINDINGS, ()), *ev.verdict.numerics_findings]
            study.set_user_attr(attrs.NUMERICS_FINDINGS, found)
    # The round this instance was measured in (selection, holdout), so that pairs are those measured side by side.
    ev.measurement["output_tok_s_rounds"] = [trial.user_attrs.get(attrs.ROUND)]
    if of is not None and not ev.failure:  # one record of both engine instances (autotune.measure.metrics.pool)
        ev = pooled(ev, view.trial(of), cfg)
    trial.set_user_attr(attrs.MEASUREMENT, ev.measurement)
    trial.set_user_attr(attrs.VERDICT, ev.verdict.to_dict())
    for key, value in ev.constraints.items():
        trial.set_constraint(key, value)
    trial.set_user_attr(attrs.SLO_MISSED, ev.slo_missed)
    trial.set_user_attr(attrs.VLLM_VERSION, outcome.raw.get("vllm_version"))
    if reference is None:  # the baseline: the reference every candidate is judged against
        trial.set_user_attr(attrs.OUTPUTS, ev.reference.outputs)
        trial.set_user_attr(attrs.SAMPLES, ev.reference.samples)
        trial.set_user_attr(attrs.SCORES, ev.reference.scores)
        study.set_user_attr(attrs.NUMERICS, ev.reference.numerics)  # what every later verdict allows
    if ev.failure:
        cause = explain(outcome.log_path)
        trial.set_user_attr(attrs.FAILURE, ev.failure + cause)
        study.tell(trial, state=TrialState.FAIL)
        return ev.summary() + cause
    study.tell(trial, ev.values)
    return ev.summary()

