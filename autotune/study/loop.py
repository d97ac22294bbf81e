"""The Optuna study: ask a candidate, run it in a worker, judge it, tell Optuna.

Trial 0 is always the baseline (no speculation, the space's default engine settings).
Failed trials (crash, timeout, incomplete run) are Optuna FAIL states with their reason in
``user_attrs['failure']``; wrong outputs make a trial infeasible through ``Trial.set_constraint``.
Everything a report needs is kept in the Optuna storage, so an interrupted study resumes
with nothing completed lost and a study shared by several workers has one source of truth.
Here: the worker threads, asking, the budget and stale workers. Each step reads the study once
(autotune.study.view.StudyView) and passes that view down; after the step's own writes (stale
trials failed, work queued, a trace kept, a trial asked) it reads the study again. Opening a study is
autotune.study.opening, one trial from ask to tell autotune.study.record, fresh-engine rounds
autotune.study.remeasure, judging a trial autotune.run.evaluate.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import optuna
from optuna.trial import TrialState

from autotune.core import attrs
from autotune.core.attrs import BASELINE
from autotune.core.candidate import Candidate
from autotune.measure.config import Progress, Quiet, StudyConfig
from autotune.core.errors import BadInput, StudyFailed
from autotune.study.optuna_private import stale_trial_ids, storage_of, trial_id
from autotune.core.space import SearchSpace
from autotune.study.trials import SCHEDULE_KEY, counts
from autotune.study.strategy import ensure_eagle3_trace, needs_trace, plan, trace_draft
from autotune.study.select import selection_step
from autotune.study.storage import dead_here, has_heartbeat, worker_id
from autotune.study.view import StudyView
from autotune.core.workload import Workload
from autotune.run import launcher
from autotune.study import budget

from autotune.study.opening import describe, open_study, queue_first
from autotune.study.plan import Plan
from autotune.study.record import duplicate_of, mark_interrupted, run_one
from autotune.study.remeasure import extra_work

__all__ = ["open_study", "run_study"]

# The workers of one process (--workers) read the budget and ask as one step: two that read "3 of 4"
# at once would both ask and run 5 (Optuna counts an asked trial as running only once ask returns).
# Workers in other processes sharing the storage can still overrun by one each, as Optuna's own
# MaxTrialsCallback does.
_ASK = threading.Lock()


def _budget_used(view: StudyView, cfg: StudyConfig) -> bool:
    """Whether the trials finished and running within the budget (selection and holdout rounds come on
    top of it) reach ``--trials``."""
    running = [t for t in view.running if attrs.role(t) not in attrs.OUTSIDE_BUDGET]
    return len(view.finished) + len(running) >= cfg.n_trials


def _fail_stale(study: optuna.Study, view: StudyView) -> int:
    """Fail RUNNING trials whose worker is gone: a dead pid on this host, or (RDB storages) no
    heartbeat for GRACE_S, wherever it ran. Live workers' trials are left alone. Returns how many."""
    gone = [(t, "interrupted (its worker process is gone)") for t in dead_here(view)]
    if has_heartbeat(storage_of(study)):
        stale = stale_trial_ids(study)
        gone += [(t, "interrupted (its worker stopped: no heartbeat)") for t in view.running if trial_id(t) in stale]
    for t, failure in gone:
        mark_interrupted(study, t, failure)
    return len(gone)


def _retry_interrupted(study: optuna.Study, view: StudyView, *, left_out: bool = False) -> None:
    """Queue again each interrupted candidate that has not been measured since; with ``left_out``
    (a resumed study, whose budget may be larger now) each one left out when the budget ran out, too."""
    trials = view.trials
    done = {Candidate(t.user_attrs.get(attrs.CANDIDATE, {})).key() for t in trials
            if counts(t) or t.state in (TrialState.WAITING, TrialState.RUNNING)}
    for t in trials:
        key = Candidate(t.user_attrs.get(attrs.CANDIDATE, {})).key()
        again = t.user_attrs.get(attrs.INTERRUPTED) or (left_out and attrs.LEFT_OUT in t.user_attrs)
        if again and t.user_attrs.get(attrs.ROLE) != BASELINE and key not in done:
            study.enqueue_trial(t.params)
            done.add(key)


def run_study(cfg: StudyConfig, workload: Workload, space: SearchSpace, *,
              progress: Progress | None = None, resume: bool = False,
              enqueue: list[dict[str, Any]] = (), deployed: dict[str, Any] | None = None,
              worker_envs: list[dict[str, str]] = ({},), study_plan: Plan | None = None) -> optuna.Study:
    """Run (or continue, or join) the study until ``n_trials`` trials have finished.

    ``enqueue``: parameter sets to measure first, right after the baseline (Optuna ``enqueue_trial``).
    ``deployed``: the deployed config's parameters (a warm start): measured first of all after the
    baseline, as role "deployed", so that `autotune check` compares the new pick with it in one run.
    ``worker_envs``: one worker thread each, with that environment for its trials (its device set).
    ``study_plan``: what the study said it would run (autotune.study.plan): once the baseline is measured, the
    time it takes at the baseline's pace is said in one line.
    Other processes may work on the same study (same name and storage) at the same time.
    """
    progress = progress or Quiet()
    cfg.results_dir.mkdir(parents=True, exist_ok=True)
    study = open_study(cfg)
    _fail_stale(study, StudyView.of(study))
    view = StudyView.of(study)
    if resume:
        _retry_interrupted(study, view, left_out=True)
    elif view.finished:
        raise BadInput(f"--study: {cfg.name!r} already has trials in {cfg.results_dir}; "
                       "pass --resume to continue it (or to join its workers) or choose another --study name")
    describe(study, view, cfg, workload, space)
    queue_first(study, StudyView.of(study), space, enqueue, deployed)
    clock = budget.Clock(cfg.time_budget_s)  # --time-budget counts from here
    # vLLM imported once for every trial's worker and server; it preloads the real engine's imports,
    # so a study of another engine module (the tests' fake one) is not worth its start
    with launcher.active(cfg.launcher and cfg.engine_module == launcher.REAL_ENGINE):
        if len(worker_envs) == 1:
            _work(study, cfg, workload, space, progress, env=worker_envs[0], thread=0, stop=None, clock=clock,
                  study_plan=study_plan)
        else:
            _threads(study, cfg, workload, space, progress, worker_envs, clock, study_plan)
    return study


def _threads(study: optuna.Study, cfg: StudyConfig, workload: Workload, space: SearchSpace, progress: Progress,
             worker_envs: list[dict[str, str]], clock: budget.Clock, study_plan: Plan | None = None) -> None:
    """One worker thread per device environment, until the budget is used or Ctrl-C."""
    stop, errors = threading.Event(), []
    done = [threading.Event() for _ in worker_envs]

    def work(i: int) -> None:
        try:
            _work(study, cfg, workload, space, progress, env=worker_envs[i], thread=i, stop=stop, clock=clock,
                  study_plan=study_plan if i == 0 else None)
        except KeyboardInterrupt:
            pass  # stop was set: the trial in hand is marked interrupted
        except BaseException as e:  # a failed baseline ends every worker, as it ends a single one
            errors.append(e)
            stop.set()
        finally:
            done[i].set()

    for i in range(len(worker_envs)):
        threading.Thread(target=work, args=(i,), name=f"autotune-worker-{i}", daemon=True).start()
    try:
        for d in done:
            while not d.wait(0.2):  # a timed wait lets Ctrl-C through
                pass
    except KeyboardInterrupt:  # Ctrl-C reaches this thread only: stop the workers, which mark their trials
        # Not Thread.join: on CPython 3.11 a join interrupted by Ctrl-C marks the thread as ended.
        stop.set()
        for d in done:
            d.wait()
        raise
    if errors:
        raise errors[0]


def _work(study: optuna.Study, cfg: StudyConfig, workload: Workload, space: SearchSpace, progress: Progress,
          *, env: dict[str, str], thread: int, stop: threading.Event | None, clock: budget.Clock,
          study_plan: Plan | None = None) -> None:
    """One worker: ask, measure, tell, until the study's budget (trials, or time) is used (by every worker together)."""
    asks = duplicates = 0
    timed_out = ""  # the line that said the time budget ended the search, once said
    # Each duplicate costs an ask, not a measurement; a small space can run out of new configs. Work on
    # top of the budget (selection, holdout) is asked from the queue, never a duplicate: it does not count.
    while asks < 4 * cfg.n_trials + 4:
        if stop is not None and stop.is_set():
            raise KeyboardInterrupt
        view = StudyView.of(study)  # this step's reading of the study
        if _fail_stale(study, view):
            _retry_interrupted(study, StudyView.of(study))
            view = StudyView.of(study)
        running = view.running
        spent = _budget_used(view, cfg)
        if not spent and not timed_out and budget.out_of_time(view, cfg, clock):
            timed_out = budget.left_out_line(view, cfg, clock)
            study.set_user_attr(attrs.STOPPED, timed_out)
            progress.note(timed_out)
        spent = spent or bool(timed_out)
        # The budget is used: configs still queued are left out (each asked, then told why) before a depth
        # schedule and the fresh-engine re-measurements, which come on top of it, are queued behind them.
        if spent and not _queued_in_budget(view):
            if not _extra(study, view, space, cfg, clock):
                return
            view = StudyView.of(study)  # what was just queued goes first
        base = view.baseline
        if base is None and any(t.user_attrs.get(attrs.ROLE) == BASELINE for t in running):
            time.sleep(1.0)  # another worker measures the reference; candidates are judged against it
            continue
        if base is not None and not view.waiting:
            if line := ensure_eagle3_trace(study, view, space, cfg, env=env):
                progress.note(line)
            if needs_trace(space, cfg.settings):
                _trace_draft(study, view, space, cfg, env, progress)
            view = StudyView.of(study)  # the traces just kept (if any) are what the forecasts read
            # Once the strategy stopped, its stop stands for this run (a resumed study plans again:
            # autotune.study.opening): the selection rounds' engines refine the records, and a forecast
            # they moved would otherwise bring a candidate back between rounds and start the selection
            # over (claim_vs_served.json run 11: three engines more).
            step = None if view.user_attrs.get(attrs.STOPPED) else \
                plan(view, space, cfg.strategy, cfg.settings.max_model_len, past_edge=cfg.past_edge)
            if step is None or step.stop:
                if step is not None:
                    study.set_user_attr(attrs.STOPPED, step.why)
                if _extra(study, view, space, cfg, clock):
                    continue
                return
            if step.params is not None:
                study.enqueue_trial(step.params, user_attrs={attrs.PLANNED: step.why,
                                                             **({attrs.PAST_EDGE: step.beyond} if step.beyond else {})})
        with _ASK:
            if not spent and _budget_used(StudyView.of(study), cfg):
                continue  # another worker asked the budget's last trial since this step read the study
            trial = study.ask()
        asks += attrs.role(trial) not in attrs.OUTSIDE_BUDGET
        trial.set_user_attr(attrs.WORKER, worker_id(thread))
        is_base = base is None
        fixed = StudyView.of(study).trial(trial.number).system_attrs.get("fixed_params")  # a queued config's
        if is_base:  # the reference comes first; a candidate popped ahead of it goes back in line
            if fixed and trial.user_attrs.get(attrs.ROLE) != BASELINE:
                study.enqueue_trial(fixed)
            trial.set_user_attr(attrs.ROLE, BASELINE)
        elif trial.user_attrs.get(attrs.ROLE) == BASELINE:  # queued twice (two workers started at once)
            trial.set_user_attr(attrs.ROLE, attrs.EXTRA_BASELINE)
        cand = space.baseline_candidate() if is_base else space.suggest(trial)
        if attrs.SCHEDULE_RANGES in trial.user_attrs:  # not an Optuna parameter: a list
            cand = Candidate({**cand.params, SCHEDULE_KEY: trial.user_attrs[attrs.SCHEDULE_RANGES]})
        if attrs.PAST_EDGE in trial.user_attrs:  # outside the space's distributions, so not an Optuna parameter
            cand = Candidate({**cand.params, **trial.user_attrs[attrs.PAST_EDGE]})
        trial.set_user_attr(attrs.CANDIDATE, cand.params)
        trial.set_user_attr(attrs.LABEL, cand.label)
        if spent and _leave_out(study, trial, cand, cfg, progress, queued=bool(fixed), timed_out=bool(timed_out)):
            asks -= 1  # the queue is finite: leaving a config out asks the sampler nothing
            continue
        # Read after the candidate is recorded: of two workers that drew one config, the later sees the earlier.
        view = StudyView.of(study)
        dup = None if attrs.role(trial) in (attrs.REMEASURE, attrs.HOLDOUT) else \
            duplicate_of(view, cand, trial.number, is_base)
        if dup is not None:  # never measure the same config twice without meaning to
            trial.set_user_attr(attrs.DUPLICATE_OF, dup)
            study.tell(trial, state=TrialState.PRUNED)
            duplicates += 1
            continue
        if not is_base and not {attrs.EAGLE3_TRACE, attrs.DFLASH_TRACE} <= set(view.user_attrs):  # --try, grid: forecasts
            if line := ensure_eagle3_trace(study, view, space, cfg, cand.params, env=env):
                progress.note(line)
            view = StudyView.of(study)  # the trace just kept (if any) is what the forecast reads
        if not is_base and cand.method == "draft_model" and attrs.DRAFT_TRACE not in view.user_attrs \
                and needs_trace(space, cfg.settings):  # a draft_model trial asked for (--try) before any planning
            _trace_draft(study, view, space, cfg, env, progress)
            view = StudyView.of(study)
        run_one(study, view, trial, cand, workload, space, cfg, progress, is_base, env=env, stop=stop)
        if is_base and (after := StudyView.of(study)).baseline is None:
            reason = after.trial(trial.number).user_attrs.get(attrs.FAILURE, "unknown")
            raise StudyFailed(f"the baseline trial failed, nothing to compare against: {reason}")
        if is_base and study_plan is not None and (wall := after.baseline.user_attrs.get(attrs.WALL_S)):
            progress.note(study_plan.pace(float(wall)))
    why = (f"{duplicates} of {asks} asks drew a config already measured, with {len(StudyView.of(study).finished)} "
           f"of the {cfg.n_trials} trials used: the space may hold no new config for this sampler")
    study.set_user_attr(attrs.STOPPED, why)
    progress.note(f"stopped: {why}")


def _extra(study: optuna.Study, view: StudyView, space: SearchSpace, cfg: StudyConfig, clock: budget.Clock) -> bool:
    """Queue work on top of the trials (autotune.study.remeasure.extra_work) while --time-budget allows it.
    Out of time in the middle of the selection, the choice is recorded on what was measured (no more
    rounds) so that the holdout's kept rounds still run (autotune.study.budget): the study ends with a figure."""
    if budget.extra_allowed(view, cfg, clock):
        return extra_work(study, view, space, cfg)
    if view.running or view.waiting or view.selected() is not None or not cfg.remeasure:
        return False
    selection_step(study, view, cfg, more_rounds=False)
    after = StudyView.of(study)
    return budget.extra_allowed(after, cfg, clock) and extra_work(study, after, space, cfg)


def _queued_in_budget(view: StudyView) -> bool:
    """Configs waiting in the queue that would use the --candidates budget (not a schedule's, not a re-measurement)."""
    return any(attrs.role(t) not in attrs.OUTSIDE_BUDGET for t in view.waiting)


def _leave_out(study: optuna.Study, trial: optuna.Trial, cand: Candidate, cfg: StudyConfig,
               progress: Progress, *, queued: bool, timed_out: bool = False) -> bool:
    """A config from the queue (``queued``: --try, a warm start, a plan) asked after the budget was
    used: told as not measured, with one line saying so, so that what comes on top of the budget
    (the fresh-engine re-measurements) is not starved behind it. False for anything else."""
    role = attrs.role(trial)
    if role in (BASELINE, attrs.EXTRA_BASELINE, *attrs.OUTSIDE_BUDGET) or not queued:
        return False
    used = "the --time-budget is used; --resume with a larger --time-budget" if timed_out else \
        f"the --candidates budget of {cfg.n_trials} is used; --resume with a larger --candidates"
    why = f"left out: {cand.label} (queued, but {used} measures it)"
    trial.set_user_attr(attrs.LEFT_OUT, why)
    study.tell(trial, state=TrialState.PRUNED)
    progress.note(why)
    return True


def _trace_draft(study: Any, view: StudyView, space: Any, cfg: StudyConfig, env: dict[str, str], progress: Any) -> None:
    """The draft's trace over the baseline (autotune.study.strategy.trace_draft), its failure said once."""
    if failure := trace_draft(study, view, space, cfg, env, cfg.results_dir):
        progress.note(f"draft trace failed: {failure}; draft_model candidates are measured without a "
                      f"forecast (worker log: {cfg.results_dir / 'draft-trace' / 'worker.log'})")
