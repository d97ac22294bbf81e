"""The Optuna study: ask a candidate, run it in a worker, judge it, tell Optuna.

Trial 0 is always the baseline (no speculation, the space's default engine settings).
Failed trials (crash, timeout, incomplete run) are Optuna FAIL states with their reason in
``user_attrs['failure']``; wrong outputs make a trial infeasible through ``Trial.set_constraint``.
Everything a report needs is kept in the Optuna storage, so an interrupted study resumes
with nothing completed lost and a study shared by several workers has one source of truth.
Over 300 lines: asking, duplicate and stale-worker bookkeeping and worker threads share the one
study object; judging a trial is autotune.evaluate, Optuna internals are autotune.optuna_private.
"""

from __future__ import annotations

import threading
import time
import warnings
from dataclasses import replace
from pathlib import Path
from collections.abc import Callable
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune import attrs
from autotune.attrs import BASELINE, DEPLOYED
from autotune.candidate import Candidate
from autotune.config import Progress, Quiet, StudyConfig
from autotune.errors import BadInput, StudyFailed
from autotune.evaluate import CONSTRAINTS, Evaluation, Reference, evaluate, slo_constraints, trial_job
from autotune.forecast import Forecast
from autotune.metrics import instances_of, pool
from autotune.objectives import validate_objectives
from autotune.optuna_private import heartbeat, set_trial_attr, stale_trial_ids, storage_of, trial_id
from autotune.space import SearchSpace
from autotune.schedule import SCHEDULE_KEY, scheduled_trial
from autotune.schedule import next_step as schedule_step
from autotune.strategy import forecast_for, needs_trace, plan, trace_draft
from autotune.storage import dead_here, has_heartbeat, open_storage, worker_id
from autotune.worker import PRUNED, TrialOutcome, explain, run_trial
from autotune.workload import Workload

__all__ = ["BASELINE", "DEPLOYED", "StudyConfig", "baseline_trial", "open_study", "run_study", "trial_dir",
           "trial_job"]


def _sampler(seed: int, strategy: str = "tpe") -> optuna.samplers.BaseSampler:
    # Constraints are set on each trial (Trial.set_constraint); TPE and best_trials honour them.
    # predict and grid queue their own candidates (enqueue_trial); TPE only fills what they leave.
    if strategy == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True, n_startup_trials=5)


def _quiet_optuna() -> None:
    # Our own progress display says what happens; Optuna's INFO lines, the warning that TPE's
    # ``group`` is experimental and the one that heartbeats are meant for ``optimize`` (we keep them
    # with ask/tell, see _work) would only interleave with it.
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")


def _mark_interrupted(study: optuna.Study, t: FrozenTrial | optuna.Trial, failure: str) -> None:
    """Fail a RUNNING trial that was cut short (Ctrl-C, a dead worker), recording why. It is not
    counted and not a duplicate: its candidate is measured again (``_retry_interrupted``)."""
    set_trial_attr(study, t, attrs.FAILURE, failure)
    set_trial_attr(study, t, attrs.INTERRUPTED, True)
    study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)


def open_study(cfg: StudyConfig) -> optuna.Study:
    """Create the study, or load it to resume or to join other workers (same name and storage)."""
    directions = validate_objectives(cfg.objectives)
    _quiet_optuna()
    storage = open_storage(cfg.storage_url)
    try:
        study = optuna.create_study(study_name=cfg.name, storage=storage, directions=directions,
                                    sampler=_sampler(cfg.seed, cfg.strategy))
    except optuna.exceptions.DuplicatedStudyError:
        # Made by an earlier run or by another worker. The same seed would replay the same random
        # configs (all duplicates now); a seed moved on by the trials so far stays reproducible.
        n = len(storage.get_all_trials(storage.get_study_id_from_name(cfg.name), deepcopy=False))
        study = optuna.load_study(study_name=cfg.name, storage=storage,
                                  sampler=_sampler(cfg.seed + 1 + n, cfg.strategy))
    saved = study.user_attrs.get(attrs.OBJECTIVES)
    if saved is not None and tuple(saved) != cfg.objectives:
        raise BadInput(f"--objectives: study {cfg.name!r} was created with {saved}, got {list(cfg.objectives)}")
    study.set_user_attr(attrs.OBJECTIVES, list(cfg.objectives))
    return study


def _counts(t: FrozenTrial) -> bool:
    """A trial that used up budget: measured, failed or pruned (an engine ran) on its own, not a
    duplicate, not interrupted."""
    return ((t.state in (TrialState.COMPLETE, TrialState.FAIL)
             or (t.state == TrialState.PRUNED and attrs.PRUNED_WHY in t.user_attrs))
            and attrs.DUPLICATE_OF not in t.user_attrs and not t.user_attrs.get(attrs.INTERRUPTED))


def _finished(study: optuna.Study) -> list[FrozenTrial]:
    """The trials that used the --trials budget (fresh-engine re-measurements and a depth schedule's
    measurements do not)."""
    return [t for t in study.get_trials(deepcopy=False) if _counts(t) and attrs.role(t) not in attrs.OUTSIDE_BUDGET]


def _running(study: optuna.Study) -> list[FrozenTrial]:
    return study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))


def _fail_stale(study: optuna.Study) -> int:
    """Fail RUNNING trials whose worker is gone: a dead pid on this host, or (RDB storages) no
    heartbeat for GRACE_S, wherever it ran. Live workers' trials are left alone. Returns how many."""
    gone = [(t, "interrupted (its worker process is gone)") for t in dead_here(study)]
    if has_heartbeat(storage_of(study)):
        stale = stale_trial_ids(study)
        gone += [(t, "interrupted (its worker stopped: no heartbeat)") for t in _running(study) if trial_id(t) in stale]
    for t, failure in gone:
        _mark_interrupted(study, t, failure)
    return len(gone)


def _retry_interrupted(study: optuna.Study, *, left_out: bool = False) -> None:
    """Queue again each interrupted candidate that has not been measured since; with ``left_out``
    (a resumed study, whose budget may be larger now) each one left out when the budget ran out, too."""
    trials = study.get_trials(deepcopy=False)
    done = {Candidate(t.user_attrs.get(attrs.CANDIDATE, {})).key() for t in trials
            if _counts(t) or t.state in (TrialState.WAITING, TrialState.RUNNING)}
    for t in trials:
        key = Candidate(t.user_attrs.get(attrs.CANDIDATE, {})).key()
        again = t.user_attrs.get(attrs.INTERRUPTED) or (left_out and attrs.LEFT_OUT in t.user_attrs)
        if again and t.user_attrs.get(attrs.ROLE) != BASELINE and key not in done:
            study.enqueue_trial(t.params)
            done.add(key)


def run_study(cfg: StudyConfig, workload: Workload, space: SearchSpace, *,
              progress: Progress | None = None, resume: bool = False,
              enqueue: list[dict[str, Any]] = (), deployed: dict[str, Any] | None = None,
              worker_envs: list[dict[str, str]] = ({},)) -> optuna.Study:
    """Run (or continue, or join) the study until ``n_trials`` trials have finished.

    ``enqueue``: parameter sets to measure first, right after the baseline (Optuna ``enqueue_trial``).
    ``deployed``: the deployed config's parameters (a warm start): measured first of all after the
    baseline, as role "deployed", so that `autotune check` compares the new pick with it in one run.
    ``worker_envs``: one worker thread each, with that environment for its trials (its device set).
    Other processes may work on the same study (same name and storage) at the same time.
    """
    progress = progress or Quiet()
    cfg.results_dir.mkdir(parents=True, exist_ok=True)
    study = open_study(cfg)
    _fail_stale(study)
    if resume:
        _retry_interrupted(study, left_out=True)
    elif _finished(study):
        raise BadInput(f"--study: {cfg.name!r} already has trials in {cfg.results_dir}; "
                       "pass --resume to continue it (or to join its workers) or choose another --study name")
    _describe(study, cfg, workload, space)
    _enqueue(study, space, enqueue, deployed)
    if len(worker_envs) == 1:
        _work(study, cfg, workload, space, progress, env=worker_envs[0], thread=0, stop=None)
    else:
        _threads(study, cfg, workload, space, progress, worker_envs)
    return study


# What each fingerprint key is set by, for the one line that refuses a run that differs.
_FINGERPRINT_FLAGS = {"model": "--model", "draft_model": "--draft-model", "eagle_head": "--eagle-head",
                      "eagle3_head": "--eagle3-head", "tokenizer": "--tokenizer", "dtype": "--dtype",
                      "max_model_len": "--max-model-len", "workload": "WORKLOAD (its requests)",
                      "space": "--space", "levels": "--load/--concurrency/--levels", "instrument": "--instrument"}


def fingerprint(cfg: StudyConfig, workload: Workload, space: SearchSpace) -> dict[str, Any]:
    """What defines a study's numbers: the models, the workload's requests (by content, so the same
    file from another checkout matches), the space's source, the load levels and the instrument.
    Candidate.key() leaves the model out, so without this a run with another model or workload
    would mix its trials into the study."""
    import hashlib
    import json

    s = cfg.settings
    requests = json.dumps([r.to_json() for r in workload.requests], sort_keys=True)
    return {"model": s.model, "draft_model": s.draft_model, "eagle_head": s.eagle_head, "eagle3_head": s.eagle3_head,
            "tokenizer": s.tokenizer, "dtype": s.dtype, "max_model_len": s.max_model_len,
            "workload": hashlib.sha256(requests.encode()).hexdigest()[:16],
            "space": space.resolved.get("source", space.name),
            "levels": [cfg.load.label, *(x.label for x in cfg.extra_loads)], "instrument": cfg.instrument}


def _check_fingerprint(study: optuna.Study, cfg: StudyConfig, mine: dict[str, Any]) -> None:
    """Refuse to resume or join a study that another model, workload, space, load or instrument made."""
    saved = study.user_attrs.get(attrs.FINGERPRINT)
    if saved is None:  # made before fingerprints (or just created): this run defines it
        return
    differ = [k for k in mine if k in saved and saved[k] != mine[k]]
    if differ:
        k = differ[0]
        raise BadInput(f"{_FINGERPRINT_FLAGS.get(k, k)}: study {cfg.name!r} was made with {k}={saved[k]!r}, this run "
                       f"has {mine[k]!r}" + (f" (also differ: {', '.join(differ[1:])})" if differ[1:] else "")
                       + "; use another --study name, or the study's own settings")


def _describe(study: optuna.Study, cfg: StudyConfig, workload: Workload, space: SearchSpace) -> None:
    """What the results files and reports read from the study itself."""
    mine = fingerprint(cfg, workload, space)
    _check_fingerprint(study, cfg, mine)
    study.set_user_attr(attrs.FINGERPRINT, mine)
    study.set_user_attr(attrs.WORKLOAD, workload.path)
    study.set_user_attr(attrs.SPACE, space.name)
    study.set_user_attr(attrs.SPACE_RESOLVED, space.resolved)
    study.set_user_attr(attrs.MAX_MODEL_LEN, cfg.settings.max_model_len)  # what ngram replays cap drafts at
    study.set_user_attr(attrs.LOAD, cfg.load.label)
    study.set_user_attr(attrs.CONCURRENCY, cfg.load.concurrency if cfg.load.kind == "concurrency" else None)
    study.set_user_attr(attrs.LEVELS, [cfg.load.label, *(x.label for x in cfg.extra_loads)])
    study.set_user_attr(attrs.LOSSY_MIN_GAIN, cfg.lossy_min_gain)
    study.set_user_attr(attrs.STRATEGY, cfg.strategy)
    study.set_user_attr(attrs.STOPPED, None)  # a resumed study plans again


def _enqueue(study: optuna.Study, space: SearchSpace, enqueue: list[dict[str, Any]],
             deployed: dict[str, Any] | None) -> None:
    """The baseline first, then the deployed config, then the configs asked for."""
    pending = study.get_trials(deepcopy=False, states=(TrialState.WAITING, TrialState.RUNNING))
    if baseline_trial(study) is None and not any(attrs.role(t) == BASELINE for t in pending):
        # First in line (not skip_if_exists: an interrupted baseline must run again).
        study.enqueue_trial(space.baseline_trial_params(), user_attrs={attrs.ROLE: BASELINE, attrs.QUEUED: True})
    if deployed is not None and not any(attrs.role(t) == DEPLOYED for t in study.get_trials(deepcopy=False)):
        study.enqueue_trial(_optuna_params(deployed), user_attrs={attrs.ROLE: DEPLOYED, **_ranges_attr(deployed)})
    for params in enqueue:
        study.enqueue_trial(_optuna_params(params), user_attrs={attrs.ASKED: True, **_ranges_attr(params)},
                            skip_if_exists=True)


def _threads(study: optuna.Study, cfg: StudyConfig, workload: Workload, space: SearchSpace, progress: Progress,
             worker_envs: list[dict[str, str]]) -> None:
    """One worker thread per device environment, until the budget is used or Ctrl-C."""
    stop, errors = threading.Event(), []
    done = [threading.Event() for _ in worker_envs]

    def work(i: int) -> None:
        try:
            _work(study, cfg, workload, space, progress, env=worker_envs[i], thread=i, stop=stop)
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
          *, env: dict[str, str], thread: int, stop: threading.Event | None) -> None:
    """One worker: ask, measure, tell, until the study's budget is used (by every worker together)."""
    asks = duplicates = 0
    # Each duplicate costs an ask, not a measurement; a small space can run out of new configs.
    while asks < 4 * cfg.n_trials + 4:
        if stop is not None and stop.is_set():
            raise KeyboardInterrupt
        if _fail_stale(study):
            _retry_interrupted(study)
        running = _running(study)
        spent = len(_finished(study)) + len([t for t in running if attrs.role(t) not in attrs.OUTSIDE_BUDGET]) \
            >= cfg.n_trials
        # The budget is used: configs still queued are left out (each asked, then told why) before a depth
        # schedule and the fresh-engine re-measurements, which come on top of it, are queued behind them.
        if spent and not _queued_in_budget(study) and not _extra_work(study, space, cfg):
            return
        base = baseline_trial(study)
        if base is None and any(t.user_attrs.get(attrs.ROLE) == BASELINE for t in running):
            time.sleep(1.0)  # another worker measures the reference; candidates are judged against it
            continue
        if base is not None and not _waiting(study):
            if needs_trace(space, cfg.settings) and (failure := trace_draft(study, space, cfg, env, cfg.results_dir)):
                progress.note(f"draft trace failed: {failure}; draft_model candidates are measured without a "
                              f"forecast (worker log: {cfg.results_dir / 'draft-trace' / 'worker.log'})")
            step = plan(study, space, cfg.strategy, cfg.settings.max_model_len, past_edge=cfg.past_edge)
            if step.stop:
                study.set_user_attr(attrs.STOPPED, step.why)
                if _extra_work(study, space, cfg):
                    continue
                return
            if step.params is not None:
                study.enqueue_trial(step.params, user_attrs={attrs.PLANNED: step.why,
                                                             **({attrs.PAST_EDGE: step.beyond} if step.beyond else {})})
        asks += 1
        trial = study.ask()
        trial.set_user_attr(attrs.WORKER, worker_id(thread))
        is_base = base is None
        if is_base:  # the reference comes first; a candidate popped ahead of it goes back in line
            fixed = _frozen(study, trial.number).system_attrs.get("fixed_params")
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
        if spent and _leave_out(study, trial, cand, cfg, progress):
            asks -= 1  # the queue is finite: leaving a config out asks the sampler nothing
            continue
        dup = None if attrs.role(trial) == attrs.REMEASURE else _duplicate(study, cand, trial.number, is_base)
        if dup is not None:  # never measure the same config twice without meaning to
            trial.set_user_attr(attrs.DUPLICATE_OF, dup)
            study.tell(trial, state=TrialState.PRUNED)
            duplicates += 1
            continue
        _run_one(study, trial, cand, workload, space, cfg, progress, is_base, env=env, stop=stop)
        if is_base and baseline_trial(study) is None:
            reason = _frozen(study, trial.number).user_attrs.get(attrs.FAILURE, "unknown")
            raise StudyFailed(f"the baseline trial failed, nothing to compare against: {reason}")
    why = (f"{duplicates} of {asks} asks drew a config already measured, with {len(_finished(study))} of the "
           f"{cfg.n_trials} trials used: the space may hold no new config for this sampler")
    study.set_user_attr(attrs.STOPPED, why)
    progress.note(f"stopped: {why}")


def _queued_in_budget(study: optuna.Study) -> bool:
    """Configs waiting in the queue that would use the --trials budget (not a schedule's, not a re-measurement)."""
    return any(attrs.role(t) not in attrs.OUTSIDE_BUDGET
               for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))


def _leave_out(study: optuna.Study, trial: optuna.Trial, cand: Candidate, cfg: StudyConfig,
               progress: Progress) -> bool:
    """A config from the queue (--try, a warm start, a plan) asked after the budget was used: told
    as not measured, with one line saying so, so that what comes on top of the budget (the
    fresh-engine re-measurements) is not starved behind it. False for anything else."""
    role = attrs.role(trial)
    if role in (BASELINE, attrs.EXTRA_BASELINE, *attrs.OUTSIDE_BUDGET) or \
            not _frozen(study, trial.number).system_attrs.get("fixed_params"):
        return False
    why = (f"left out: {cand.label} (queued, but the --trials budget of {cfg.n_trials} is used; "
           "--resume with a larger --trials measures it)")
    trial.set_user_attr(attrs.LEFT_OUT, why)
    study.tell(trial, state=TrialState.PRUNED)
    progress.note(why)
    return True


MAX_REMEASURES = 4  # fresh-engine re-measurements beyond 2 x --pairs a study makes at most (the pick may change)


def _extra_work(study: optuna.Study, space: SearchSpace, cfg: StudyConfig) -> bool:
    """Queue what comes on top of --trials: a depth schedule's measurements (two or more load
    levels), then the fresh-engine re-measurements. True while any is queued."""
    waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    if waiting and all(attrs.role(t) in attrs.OUTSIDE_BUDGET for t in waiting):
        return True
    step = schedule_step(study, space, cfg.settings.max_model_len) if cfg.schedule else None
    if step is not None:
        params = {**step["params"], SCHEDULE_KEY: step["ranges"]} if "ranges" in step else step["params"]
        study.enqueue_trial(_optuna_params(params),
                            user_attrs={attrs.ROLE: step["role"], attrs.PLANNED: step["why"], **_ranges_attr(params)})
        return True
    return cfg.remeasure and _queue_remeasure(study, cfg.pairs)


def _optuna_params(params: dict[str, Any]) -> dict[str, Any]:
    """The parameters Optuna asks for (a schedule's ranges are not one of them)."""
    return {k: v for k, v in params.items() if k != SCHEDULE_KEY}


def _ranges_attr(params: dict[str, Any]) -> dict[str, Any]:
    """A queued config's depth schedule, kept as a trial attribute (the worker adds it back)."""
    return {attrs.SCHEDULE_RANGES: params[SCHEDULE_KEY]} if params.get(SCHEDULE_KEY) else {}


def _queue_remeasure(study: optuna.Study, pairs: int = 1) -> bool:
    """Queue a round of fresh engines for the pick and the baseline: the pick's own record and the
    baseline's pool each new instance's windows (autotune.metrics.pool), so the pick's interval
    includes the spread between engine instances. Rounds go on, up to ``pairs``, while the pick's
    speedup over the baseline, with instance pairs as the unit (autotune.resolution), still
    straddles the tie band. True if queued."""
    from autotune.pareto import choose, reference_trial
    from autotune.resolution import resolve

    trials = study.get_trials(deepcopy=False)
    again = [t for t in trials if attrs.role(t) == attrs.REMEASURE and not attrs.is_interrupted(t)]
    if any(t.state in (TrialState.WAITING, TrialState.RUNNING) for t in again) \
            or len(again) >= 2 * pairs + MAX_REMEASURES or _waiting(study):  # configs asked for (--try) go first
        return False
    choice, base = choose(study), reference_trial(study)
    if choice is None or base is None or first_record_number(study, choice.trial) == first_record_number(study, base):
        return False  # the baseline (or its pooled record) is the pick: nothing to confirm against it
    chosen = scheduled_trial(study) or choice.trial  # a recommended depth schedule is the pick
    rounds = len(instances_of(attrs.measurement(chosen))) - 1
    if any(t.user_attrs.get(attrs.REMEASURE_OF) == chosen.number for t in again):
        return False  # its round failed: the record stands as it is
    if rounds == 0:
        sign = 1 if study.directions[0] == optuna.study.StudyDirection.MAXIMIZE else -1
        pooled = [t for t in again if t.state == TrialState.COMPLETE and attrs.REMEASURE_OF in t.user_attrs
                  and first_record_number(study, t) != first_record_number(study, base)]
        if pooled and all(sign * chosen.values[0] <= sign * t.values[0] for t in pooled):
            return False  # a pooled pick stands unless another beats it outright (not a tie)
    else:
        res = resolve(attrs.measurement(chosen), attrs.measurement(base))
        if rounds >= pairs or res is None or res.decided:
            return False
    # ABBA over rounds: with the first measurements (baseline first), round 1 runs the pick's fresh
    # engine first, round 2 the baseline's, and so on, so a drift of the machine's speed over the
    # study lands on both sides of the pooled ratio alike.
    order = (chosen, base) if rounds % 2 == 0 else (base, chosen)
    for t in order:
        params = attrs.candidate(t)  # the baseline has no Optuna params
        beyond = t.user_attrs.get(attrs.PAST_EDGE)  # past the space's edge: Optuna gets the in-space values
        study.enqueue_trial({**_optuna_params(params), **{k: t.params[k] for k in beyond or {} if k in t.params}},
                            user_attrs={attrs.ROLE: attrs.REMEASURE, attrs.REMEASURE_OF: t.number, **_ranges_attr(params),
                                        **({attrs.PAST_EDGE: beyond} if beyond else {})})
    return True


def first_record_number(study: optuna.Study, t: FrozenTrial) -> int:
    from autotune.pareto import first_record

    return first_record(study, t).number


def _waiting(study: optuna.Study) -> bool:
    return bool(study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))


def _frozen(study: optuna.Study, number: int) -> FrozenTrial:
    return next(t for t in study.get_trials(deepcopy=False) if t.number == number)


def baseline_trial(study: optuna.Study) -> FrozenTrial | None:
    """The completed baseline trial, if any."""
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if t.user_attrs.get(attrs.ROLE) == BASELINE:
            return t
    return None


def _duplicate(study: optuna.Study, cand: Candidate, number: int, is_base: bool) -> int | None:
    """A trial already measuring or measured ``cand`` (for the baseline: the baseline that goes first).

    Workers record the candidate before this check, so of two workers that drew the same config
    at once, the later to record it always sees the earlier one: it is never measured twice.
    """
    if is_base:
        return _other_baseline(study, number)
    key = cand.key()
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL, TrialState.RUNNING,
                                                      TrialState.PRUNED)):
        if t.number != number and (_counts(t) or t.state == TrialState.RUNNING) and \
                Candidate(t.user_attrs.get(attrs.CANDIDATE, {})).key() == key:
            return t.number
    return None


def _other_baseline(study: optuna.Study, number: int) -> int | None:
    """The baseline trial this one gives way to, if any. A queued baseline carries its role from the
    start, so among queued ones the lowest number goes first with no race; a baseline made on the
    fly (nothing queued was popped) gives way to any other. A failed one may be tried again."""
    trials = [t for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING, TrialState.RUNNING,
                                                                  TrialState.COMPLETE))
              if t.user_attrs.get(attrs.ROLE) == BASELINE and attrs.DUPLICATE_OF not in t.user_attrs]
    me = next((t for t in trials if t.number == number), None)
    queued = me is not None and me.user_attrs.get(attrs.QUEUED)
    for t in trials:
        if t.number == number:
            continue
        if t.state == TrialState.COMPLETE or not queued or (t.user_attrs.get(attrs.QUEUED) and t.number < number):
            return t.number
    return None


def trial_dir(results_dir: Path, number: int) -> Path:
    """A trial's folder: its job, events, result and worker.log (``results/<study>/trials/NNNN``)."""
    return results_dir / "trials" / f"{number:04d}"


def _reference(study: optuna.Study) -> Reference:
    ua = baseline_trial(study).user_attrs
    return Reference(ua.get(attrs.OUTPUTS, []), ua.get(attrs.SAMPLES, {}), ua.get(attrs.SCORES, {}))


def _run_one(study: optuna.Study, trial: optuna.Trial, cand: Candidate, workload: Workload,
             space: SearchSpace, cfg: StudyConfig, progress: Progress, is_base: bool, *, env: dict[str, str],
             stop: threading.Event | None) -> None:
    n = trial.number
    progress.trial_started(n, cand.label)
    reference = None if is_base else _reference(study)
    forecast = None if is_base or SCHEDULE_KEY in cand.params else \
        forecast_for(study, space, cand.params, cfg.settings.max_model_len)
    if forecast is not None:  # what the model expected, before the measurement can tell it
        trial.set_user_attr(attrs.PREDICTED, forecast.to_dict())
    job = trial_job(cand, workload, cfg, reference)
    trial.set_user_attr(attrs.DEVICES, env)
    prune, why = threading.Event(), []
    judge = _pruner(study, cfg, cand, trial, forecast, is_base)

    def on_event(e: dict[str, Any]) -> None:
        progress.trial_event(n, e)
        if judge is not None and e.get("phase") == "window_done" and e.get("window") == 1 and not prune.is_set():
            reason = judge(float(e.get("output_tok_s", float("nan"))))
            if reason:
                why.append(reason)
                prune.set()

    try:
        # Heartbeats (RDB storages) tell other workers this trial is alive; Optuna's own thread does it.
        with heartbeat(study, trial):
            outcome = run_trial(job, trial_dir(cfg.results_dir, n), timeout_s=cfg.trial_timeout_s, env=env,
                                stop=stop, on_event=on_event, prune=prune)
    except KeyboardInterrupt:
        _mark_interrupted(study, trial, "interrupted by the user")  # --resume measures it again
        raise
    trial.set_user_attr(attrs.WALL_S, round(outcome.wall_s, 2))
    if outcome.failure == PRUNED and why:  # stopped after its first window: recorded with the reason
        trial.set_user_attr(attrs.PRUNED_WHY, why[0])
        study.tell(trial, state=TrialState.PRUNED)
        progress.trial_finished(n, cand.label, f"pruned after its first window: {why[0]}")
        return
    summary = _record(study, trial, cand, outcome, job, cfg, reference)
    if attrs.REMEASURE_OF in trial.user_attrs:
        summary = f"fresh engine, pooled with trial {trial.user_attrs[attrs.REMEASURE_OF]}: {summary}"
    if forecast is not None:
        summary += "; " + _against(study, trial.number, forecast)
    progress.trial_finished(n, cand.label, summary)


def _pruner(study: optuna.Study, cfg: StudyConfig, cand: Candidate, trial: optuna.Trial, forecast: Forecast | None,
            is_base: bool) -> Callable[[float], str | None] | None:
    """For a candidate the study may stop early (``--prune``): a function of its first window's
    throughput that says why it cannot reach the best measured config (autotune.strategy.hopeless),
    or None. Not for the baseline, re-measurements, a depth schedule's or a deployed config's trials,
    studies with several load levels (a config slow at one may win at another), a first objective
    other than throughput, or a config the user asked for (--try)."""
    from autotune.pareto import reference_trial
    from autotune.strategy import NOISE_MIN, hopeless, study_model

    if not cfg.prune or is_base or cfg.extra_loads or cfg.objectives[0] != "output_tok_s" \
            or attrs.role(trial) is not None or SCHEDULE_KEY in cand.params or trial.user_attrs.get(attrs.ASKED):
        return None  # a config the user asked for (--try) is measured whole
    got = study_model(study, None, cfg.settings.max_model_len)
    base = reference_trial(study)
    if got is None or base is None or not attrs.measurement(base).get("output_tok_s"):
        return None
    model, observations, _ = got
    feasible = [o for o in observations if o.feasible]
    best = max(feasible, key=lambda o: o.speedup) if feasible else None
    if best is None or best.speedup <= 1.0:
        return None  # nothing beats the baseline yet: every candidate may
    noise = max(NOISE_MIN, best.rel_sd(model.noise))
    base_tok_s = float(attrs.measurement(base)["output_tok_s"])
    hi = forecast.hi if forecast is not None and forecast.speedup is not None else None
    return lambda tok_s: hopeless(tok_s / base_tok_s, best.speedup, noise, hi)


def _against(study: optuna.Study, number: int, forecast: Forecast) -> str:
    """Predicted beside measured, in one line."""
    from autotune.pareto import reference_trial

    t, base = _frozen(study, number), reference_trial(study)
    said = (f"predicted {forecast.speedup:.2f}x [{forecast.lo:.2f}-{forecast.hi:.2f}]" if forecast.speedup is not None
            else "no prediction")
    if t.state != TrialState.COMPLETE or not attrs.measurement(base).get("output_tok_s"):
        return said
    return f"{said}, measured {attrs.measurement(t)['output_tok_s'] / attrs.measurement(base)['output_tok_s']:.2f}x"


def _pooled(ev: Evaluation, before: FrozenTrial, cfg: StudyConfig) -> Evaluation:
    """A fresh engine's evaluation as the record of every instance so far: each metric from all
    windows (autotune.metrics.pool), the SLOs judged on those pooled metrics, and each correctness
    constraint the worse of the two records' (both engines' outputs must pass)."""
    m = pool(attrs.measurement(before), ev.measurement)
    constraints = dict(ev.constraints)
    earlier = dict(zip(CONSTRAINTS, attrs.verdict(before).get("constraints") or ()))
    for key, value in earlier.items():
        constraints[key] = max(constraints.get(key, value), value)
    slos, missed = slo_constraints(m, cfg)
    return replace(ev, measurement=m, values=[m[o] for o in cfg.objectives], constraints={**constraints, **slos},
                   slo_missed=missed)


def _record(study: optuna.Study, trial: optuna.Trial, cand: Candidate, outcome: TrialOutcome,
            job: dict[str, Any], cfg: StudyConfig, reference: Reference | None) -> str:
    """Judge the outcome and tell Optuna: values, constraints, and everything a report reads."""
    if outcome.raw is None:
        cause = explain(outcome.log_path)
        trial.set_user_attr(attrs.FAILURE, outcome.failure + cause)
        study.tell(trial, state=TrialState.FAIL)
        return f"failed: {outcome.failure}{cause}"
    ev = evaluate(outcome.raw, job["requests"], cand, cfg, reference)
    of = trial.user_attrs.get(attrs.REMEASURE_OF)
    if of is not None and not ev.failure:  # one record of both engine instances (autotune.metrics.pool)
        ev = _pooled(ev, _frozen(study, of), cfg)
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
    if ev.failure:
        cause = explain(outcome.log_path)
        trial.set_user_attr(attrs.FAILURE, ev.failure + cause)
        study.tell(trial, state=TrialState.FAIL)
        return ev.summary() + cause
    study.tell(trial, ev.values)
    return ev.summary()
