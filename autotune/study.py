"""The Optuna study: ask a candidate, run it in a worker, judge it, tell Optuna.

Trial 0 is always the baseline (no speculation, the space's default engine settings).
Failed trials (crash, timeout, incomplete run) are Optuna FAIL states with their reason in
``user_attrs['failure']``; wrong outputs make a trial infeasible through ``Trial.set_constraint``.
Everything a report needs is kept in the Optuna storage, so an interrupted study resumes
with nothing completed lost and a study shared by several workers has one source of truth.
"""

from __future__ import annotations

import math
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import optuna
from optuna.storages._heartbeat import get_heartbeat_thread  # the thread Study.optimize uses
from optuna.trial import FrozenTrial, TrialState

from autotune.candidate import Candidate, Settings
from autotune.categories import by_category
from autotune.errors import BadInput, StudyFailed
from autotune.load import LoadPattern
from autotune.metrics import at_level, measure_run
from autotune.objectives import normalize_objectives, split_objective, validate_objectives  # noqa: F401 (re-exported)
from autotune.slo import SLO, goodput
from autotune.space import SearchSpace
from autotune.storage import dead_here, has_heartbeat, open_storage, worker_id
from autotune.validate import Tolerances, verdict
from autotune.worker import TrialOutcome, run_trial
from autotune.workload import UNCATEGORIZED, Workload, expand_turns

BASELINE = "baseline"
DEPLOYED = "deployed"  # the warm start's pick, re-measured in this run so `check` compares side by side


@dataclass(frozen=True)
class StudyConfig:
    """Everything that defines one study run (keyword-only by convention)."""

    name: str
    results_dir: Path
    settings: Settings
    objectives: tuple[str, ...] = ("output_tok_s", "e2e_ms_p50")
    n_trials: int = 10
    storage: str | None = None
    load: LoadPattern = field(default_factory=LoadPattern)
    extra_loads: tuple[LoadPattern, ...] = ()  # more load levels measured on the same engine (objective@level)
    repeats: int = 2  # measured windows per trial; objectives are their medians
    max_repeats: int = 0  # re-measure a noisy candidate up to this many windows (0: never)
    warmup: int = 2
    trial_timeout_s: float = 600.0
    tolerances: Tolerances = field(default_factory=Tolerances)
    seed: int = 0
    slos: tuple[SLO, ...] = ()  # constraints: a config that misses one is infeasible
    samples: int = 64  # draws per sampled request for the distribution test
    sample_tokens: int = 3  # leading tokens that form one outcome of the test
    lossy_min_gain: float = 0.03  # a lossy pick must beat the best lossless one by this, significantly
    engine_module: str = "autotune.engine"  # tests swap in a fake engine, named as such

    @property
    def storage_url(self) -> str:
        return self.storage or f"sqlite:///{(self.results_dir / 'study.db').resolve()}"


class Progress(Protocol):
    """What the study tells the person watching (the CLI draws it with Rich)."""

    def trial_started(self, number: int, label: str) -> None: ...
    def trial_event(self, number: int, event: dict[str, Any]) -> None: ...
    def trial_finished(self, number: int, label: str, summary: str) -> None: ...


class _Quiet:
    def trial_started(self, number: int, label: str) -> None: ...
    def trial_event(self, number: int, event: dict[str, Any]) -> None: ...
    def trial_finished(self, number: int, label: str, summary: str) -> None: ...


def _sampler(seed: int) -> optuna.samplers.BaseSampler:
    # Constraints are set on each trial (Trial.set_constraint); TPE and best_trials honour them.
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
    # Optuna has no public setter for a user attribute of a trial not in hand (a FrozenTrial).
    study._storage.set_trial_user_attr(t._trial_id, "failure", failure)
    study._storage.set_trial_user_attr(t._trial_id, "interrupted", True)
    study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)


def open_study(cfg: StudyConfig) -> optuna.Study:
    """Create the study, or load it to resume or to join other workers (same name and storage)."""
    directions = validate_objectives(cfg.objectives)
    _quiet_optuna()
    storage = open_storage(cfg.storage_url)
    try:
        study = optuna.create_study(study_name=cfg.name, storage=storage, directions=directions,
                                    sampler=_sampler(cfg.seed))
    except optuna.exceptions.DuplicatedStudyError:
        # Made by an earlier run or by another worker. The same seed would replay the same random
        # configs (all duplicates now); a seed moved on by the trials so far stays reproducible.
        n = len(storage.get_all_trials(storage.get_study_id_from_name(cfg.name), deepcopy=False))
        study = optuna.load_study(study_name=cfg.name, storage=storage, sampler=_sampler(cfg.seed + 1 + n))
    saved = study.user_attrs.get("objectives")
    if saved is not None and tuple(saved) != cfg.objectives:
        raise BadInput(f"--objectives: study {cfg.name!r} was created with {saved}, got {list(cfg.objectives)}")
    study.set_user_attr("objectives", list(cfg.objectives))
    return study


def trial_job(cand: Candidate, workload: Workload, cfg: StudyConfig) -> dict[str, Any]:
    """The plain-data job a worker runs: engine kwargs, requests, replay settings."""
    reqs = [{"id": r.id, "prompt": r.prompt, "messages": list(r.messages) if r.messages else None,
             "turns": list(r.turns) if r.turns else None, "category": r.category,
             "sampling": r.sampling(), "expect": r.expect, "arrival_s": r.arrival_s} for r in workload.requests]
    for r in reqs:
        for key in ("prompt", "messages", "turns", "category", "arrival_s"):
            if r[key] is None:
                del r[key]
    return {"engine_kwargs": cand.engine_kwargs(cfg.settings), "requests": reqs,
            "replay": {"load": cfg.load.to_dict(), "extra_loads": [x.to_dict() for x in cfg.extra_loads],
                       "repeats": cfg.repeats, "max_repeats": cfg.max_repeats, "warmup": cfg.warmup, "samples": cfg.samples,
                       "sample_tokens": cfg.sample_tokens}, "engine_module": cfg.engine_module}


def _counts(t: FrozenTrial) -> bool:
    """A trial that used up budget: measured or failed on its own, not a duplicate, not interrupted."""
    return (t.state in (TrialState.COMPLETE, TrialState.FAIL) and "duplicate_of" not in t.user_attrs
            and not t.user_attrs.get("interrupted"))


def _finished(study: optuna.Study) -> list[FrozenTrial]:
    return [t for t in study.get_trials(deepcopy=False) if _counts(t)]


def _running(study: optuna.Study) -> list[FrozenTrial]:
    return study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))


def _fail_stale(study: optuna.Study) -> int:
    """Fail RUNNING trials whose worker is gone: a dead pid on this host, or (RDB storages) no
    heartbeat for GRACE_S, wherever it ran. Live workers' trials are left alone. Returns how many."""
    gone = [(t, "interrupted (its worker process is gone)") for t in dead_here(study)]
    if has_heartbeat(study._storage):
        # The query behind Optuna's fail_stale_trials; that function fails the trial first, after
        # which it can take no user attribute, so the reason could not be recorded.
        stale = set(study._storage._get_stale_trial_ids(study._study_id))
        gone += [(t, "interrupted (its worker stopped: no heartbeat)") for t in _running(study) if t._trial_id in stale]
    for t, failure in gone:
        _mark_interrupted(study, t, failure)
    return len(gone)


def _retry_interrupted(study: optuna.Study) -> None:
    """Queue again each interrupted candidate that has not been measured since."""
    trials = study.get_trials(deepcopy=False)
    done = {Candidate(t.user_attrs.get("candidate", {})).key() for t in trials
            if _counts(t) or t.state in (TrialState.WAITING, TrialState.RUNNING)}
    for t in trials:
        key = Candidate(t.user_attrs.get("candidate", {})).key()
        if t.user_attrs.get("interrupted") and t.user_attrs.get("role") != BASELINE and key not in done:
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
    progress = progress or _Quiet()
    cfg.results_dir.mkdir(parents=True, exist_ok=True)
    study = open_study(cfg)
    _fail_stale(study)
    if resume:
        _retry_interrupted(study)
    elif _finished(study):
        raise BadInput(f"--study: {cfg.name!r} already has trials in {cfg.results_dir}; "
                       "pass --resume to continue it (or to join its workers) or choose another --study name")
    study.set_user_attr("workload", workload.path)
    study.set_user_attr("space", space.name)
    study.set_user_attr("load", cfg.load.label)
    study.set_user_attr("concurrency", cfg.load.concurrency if cfg.load.kind == "concurrency" else None)
    study.set_user_attr("levels", [cfg.load.label, *(x.label for x in cfg.extra_loads)])
    study.set_user_attr("lossy_min_gain", cfg.lossy_min_gain)
    pending = study.get_trials(deepcopy=False, states=(TrialState.WAITING, TrialState.RUNNING))
    if baseline_trial(study) is None and not any(t.user_attrs.get("role") == BASELINE for t in pending):
        # First in line (not skip_if_exists: an interrupted baseline must run again).
        study.enqueue_trial(space.baseline_trial_params(), user_attrs={"role": BASELINE, "queued": True})
    if deployed is not None and not any(t.user_attrs.get("role") == DEPLOYED for t in study.get_trials(deepcopy=False)):
        study.enqueue_trial(deployed, user_attrs={"role": DEPLOYED})
    for params in enqueue:
        study.enqueue_trial(params, skip_if_exists=True)
    if len(worker_envs) == 1:
        _work(study, cfg, workload, space, progress, env=worker_envs[0], thread=0, stop=None)
        return study
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
    return study


def _work(study: optuna.Study, cfg: StudyConfig, workload: Workload, space: SearchSpace, progress: Progress,
          *, env: dict[str, str], thread: int, stop: threading.Event | None) -> None:
    """One worker: ask, measure, tell, until the study's budget is used (by every worker together)."""
    asks = 0
    # Each duplicate costs an ask, not a measurement; a small space can run out of new configs.
    while asks < 4 * cfg.n_trials + 4:
        if stop is not None and stop.is_set():
            raise KeyboardInterrupt
        if _fail_stale(study):
            _retry_interrupted(study)
        running = _running(study)
        if len(_finished(study)) + len(running) >= cfg.n_trials:
            return
        base = baseline_trial(study)
        if base is None and any(t.user_attrs.get("role") == BASELINE for t in running):
            time.sleep(1.0)  # another worker measures the reference; candidates are judged against it
            continue
        asks += 1
        trial = study.ask()
        trial.set_user_attr("worker", worker_id(thread))
        is_base = base is None
        if is_base:  # the reference comes first; a candidate popped ahead of it goes back in line
            fixed = _frozen(study, trial.number).system_attrs.get("fixed_params")
            if fixed and trial.user_attrs.get("role") != BASELINE:
                study.enqueue_trial(fixed)
            trial.set_user_attr("role", BASELINE)
        elif trial.user_attrs.get("role") == BASELINE:  # queued twice (two workers started at once)
            trial.set_user_attr("role", "extra baseline")
        cand = space.baseline_candidate() if is_base else space.suggest(trial)
        trial.set_user_attr("candidate", cand.params)
        trial.set_user_attr("label", cand.label)
        dup = _duplicate(study, cand, trial.number, is_base)
        if dup is not None:  # never measure the same config twice without meaning to
            trial.set_user_attr("duplicate_of", dup)
            study.tell(trial, state=TrialState.PRUNED)
            continue
        _run_one(study, trial, cand, workload, cfg, progress, is_base, env=env, stop=stop)
        if is_base and baseline_trial(study) is None:
            reason = _frozen(study, trial.number).user_attrs.get("failure", "unknown")
            raise StudyFailed(f"the baseline trial failed, nothing to compare against: {reason}")


def _frozen(study: optuna.Study, number: int) -> FrozenTrial:
    return next(t for t in study.get_trials(deepcopy=False) if t.number == number)


def baseline_trial(study: optuna.Study) -> FrozenTrial | None:
    """The completed baseline trial, if any."""
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if t.user_attrs.get("role") == BASELINE:
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
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL, TrialState.RUNNING)):
        if t.number != number and (_counts(t) or t.state == TrialState.RUNNING) and \
                Candidate(t.user_attrs.get("candidate", {})).key() == key:
            return t.number
    return None


def _other_baseline(study: optuna.Study, number: int) -> int | None:
    """The baseline trial this one gives way to, if any. A queued baseline carries its role from the
    start, so among queued ones the lowest number goes first with no race; a baseline made on the
    fly (nothing queued was popped) gives way to any other. A failed one may be tried again."""
    trials = [t for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING, TrialState.RUNNING,
                                                                  TrialState.COMPLETE))
              if t.user_attrs.get("role") == BASELINE and "duplicate_of" not in t.user_attrs]
    me = next((t for t in trials if t.number == number), None)
    queued = me is not None and me.user_attrs.get("queued")
    for t in trials:
        if t.number == number:
            continue
        if t.state == TrialState.COMPLETE or not queued or (t.user_attrs.get("queued") and t.number < number):
            return t.number
    return None


def trial_dir(results_dir: Path, number: int) -> Path:
    """A trial's folder: its job, events, result and worker.log (``results/<study>/trials/NNNN``)."""
    return results_dir / "trials" / f"{number:04d}"


def _run_one(study: optuna.Study, trial: optuna.Trial, cand: Candidate, workload: Workload,
             cfg: StudyConfig, progress: Progress, is_base: bool, *, env: dict[str, str],
             stop: threading.Event | None) -> None:
    n = trial.number
    progress.trial_started(n, cand.label)
    workdir = trial_dir(cfg.results_dir, n)
    job = trial_job(cand, workload, cfg)
    if not is_base:  # candidates score the baseline's greedy tokens, teacher-forced (engine._score)
        job["reference"] = {rid: s["token_ids"] for rid, s in baseline_trial(study).user_attrs.get("scores", {}).items()}
    trial.set_user_attr("devices", env)
    try:
        # Heartbeats (RDB storages) tell other workers this trial is alive; Optuna's own thread does it.
        with get_heartbeat_thread(trial._trial_id, study._storage):
            outcome = run_trial(job, workdir, timeout_s=cfg.trial_timeout_s, env=env, stop=stop,
                                on_event=lambda e: progress.trial_event(n, e))
    except KeyboardInterrupt:
        _mark_interrupted(study, trial, "interrupted by the user")  # --resume measures it again
        raise
    trial.set_user_attr("wall_s", round(outcome.wall_s, 2))
    summary = _record(study, trial, cand, outcome, job["requests"], cfg, is_base)
    progress.trial_finished(n, cand.label, summary)


def _record(study: optuna.Study, trial: optuna.Trial, cand: Candidate, outcome: TrialOutcome,
            requests: list[dict[str, Any]], cfg: StudyConfig, is_base: bool) -> str:
    if outcome.raw is None:
        trial.set_user_attr("failure", outcome.failure)
        study.tell(trial, state=TrialState.FAIL)
        return f"failed: {outcome.failure}"
    m = measure_run(outcome.raw)
    m["goodput"] = min(goodput(w["requests"], cfg.slos) for w in outcome.raw["windows"])
    m["remeasured_windows"] = max(0, m["windows"] - cfg.repeats)
    for level in cfg.extra_loads:  # every level's metrics under objective names (metric@level)
        at = measure_run({"windows": outcome.raw["levels"][level.label]})
        m.update(at_level(at, level.label))
        m["incomplete"] += at["incomplete"]
    turns = expand_turns(requests)  # the engine returns one record per turn of a conversation
    if any("category" in r for r in turns):
        spec = cand.engine_kwargs(cfg.settings).get("speculative_config")
        categories = {r["id"]: r.get("category", UNCATEGORIZED) for r in turns}
        m["by_category"] = by_category(outcome.raw["windows"], categories,
                                       spec.get("num_speculative_tokens") if spec else 0)
    records = outcome.raw["windows"][0]["requests"]  # every window replays the same requests
    # prompt_token_ids: vLLM's own tokenization, from which autotune.predict replays acceptance.
    outputs = [{"id": r["id"], "token_ids": r["token_ids"], "text": r["text"],
                "finish_reason": r["finish_reason"], "error": r["error"], "chunks": len(r["chunks"]),
                "prompt_token_ids": r.get("prompt_token_ids")}
               for r in records]
    base = baseline_trial(study)
    if base is None and not is_base:
        raise StudyFailed("no completed baseline trial to judge candidates against")
    v = verdict(turns, records, None if is_base else base.user_attrs["outputs"],
                lossy=cand.lossy, tol=cfg.tolerances, samples=outcome.raw.get("samples"),
                base_samples=None if is_base else base.user_attrs.get("samples"),
                scores=outcome.raw.get("scores"), base_scores=None if is_base else base.user_attrs.get("scores"))
    trial.set_user_attr("measurement", m)
    trial.set_user_attr("verdict", v.to_dict())
    for key, value in zip(("token_disagreement_over_budget", "expectation_regressions", "incomplete",
                           "distribution_shift", "logprob_drift_over_budget"), v.constraints):
        trial.set_constraint(key, value)
    missed = [slo.text for slo in cfg.slos if slo.violation(m[slo.metric]) > 0]
    for slo in cfg.slos:
        trial.set_constraint(f"slo:{slo.text}", slo.violation(m[slo.metric]))
    trial.set_user_attr("slo_missed", missed)
    trial.set_user_attr("vllm_version", outcome.raw.get("vllm_version"))
    if is_base:  # the reference every candidate is judged against
        trial.set_user_attr("outputs", outputs)
        trial.set_user_attr("samples", outcome.raw.get("samples") or {})
        trial.set_user_attr("scores", outcome.raw.get("scores") or {})
    if m["incomplete"]:
        trial.set_user_attr("failure", f"incomplete run: {m['incomplete']} of {m['requests']} requests "
                            f"did not finish ({v.reason})")
        study.tell(trial, state=TrialState.FAIL)
        return f"failed: incomplete run ({v.reason})"
    values = [m[o] for o in cfg.objectives]
    if any(not math.isfinite(x) for x in values):
        trial.set_user_attr("failure", f"objective not measurable: {dict(zip(cfg.objectives, values))}")
        study.tell(trial, state=TrialState.FAIL)
        return "failed: objective not measurable"
    study.tell(trial, values)
    return f"{m['output_tok_s']:.1f} ± {m['output_tok_s_mad']:.1f} tok/s, e2e p50 {m['e2e_ms_p50']:.0f} ms, " + \
        ("correct" if v.passed else f"INCORRECT: {v.reason}") + (f"; misses SLO {', '.join(missed)}" if missed else "")
