"""The Optuna study: ask a candidate, run it in a worker, judge it, tell Optuna.

Trial 0 is always the baseline (no speculation, the space's default engine settings).
Failed trials (crash, timeout, incomplete run) are Optuna FAIL states with their reason in
``user_attrs['failure']``; wrong outputs make a trial infeasible through ``Trial.set_constraint``.
Everything a report needs is kept in the Optuna storage, so an interrupted study resumes
with nothing completed lost and a study shared by several workers has one source of truth.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.candidate import Candidate, Settings
from autotune.errors import BadInput, StudyFailed
from autotune.load import LoadPattern
from autotune.metrics import DIRECTIONS, measure_run
from autotune.slo import SLO, goodput
from autotune.space import SearchSpace
from autotune.validate import Tolerances, verdict
from autotune.worker import TrialOutcome, run_trial
from autotune.workload import Workload

BASELINE = "baseline"


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
    repeats: int = 2  # measured windows per trial; objectives are their medians
    warmup: int = 2
    trial_timeout_s: float = 600.0
    tolerances: Tolerances = field(default_factory=Tolerances)
    seed: int = 0
    slos: tuple[SLO, ...] = ()  # constraints: a config that misses one is infeasible
    samples: int = 64  # draws per sampled request for the distribution test
    sample_tokens: int = 3  # leading tokens that form one outcome of the test
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


def validate_objectives(names: tuple[str, ...]) -> list[str]:
    """Optuna directions for the chosen objective names."""
    unknown = [n for n in names if n not in DIRECTIONS]
    if unknown or not names:
        raise BadInput(f"--objectives: unknown objective {unknown[0] if unknown else '(none)'!r}; "
                       f"expected names from {sorted(DIRECTIONS)}")
    return [DIRECTIONS[n] for n in names]


def open_study(cfg: StudyConfig) -> optuna.Study:
    """Create the study, or load it to resume (same name and storage)."""
    directions = validate_objectives(cfg.objectives)
    # Our own progress display says what happens; Optuna's INFO lines and the warning that
    # TPE's ``group`` is experimental would only interleave with it.
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    # Constraints are set on each trial (Trial.set_constraint); TPE and best_trials honour them.
    sampler = optuna.samplers.TPESampler(seed=cfg.seed, multivariate=True, group=True, n_startup_trials=5)
    study = optuna.create_study(study_name=cfg.name, storage=cfg.storage_url, directions=directions,
                                sampler=sampler, load_if_exists=True)
    saved = study.user_attrs.get("objectives")
    if saved is not None and tuple(saved) != cfg.objectives:
        raise BadInput(f"--objectives: study {cfg.name!r} was created with {saved}, got {list(cfg.objectives)}")
    study.set_user_attr("objectives", list(cfg.objectives))
    return study


def trial_job(cand: Candidate, workload: Workload, cfg: StudyConfig) -> dict[str, Any]:
    """The plain-data job a worker runs: engine kwargs, requests, replay settings."""
    reqs = [{"id": r.id, "prompt": r.prompt, "messages": list(r.messages) if r.messages else None,
             "sampling": r.sampling(), "expect": r.expect, "arrival_s": r.arrival_s} for r in workload.requests]
    for r in reqs:
        for key in ("prompt", "messages", "arrival_s"):
            if r[key] is None:
                del r[key]
    return {"engine_kwargs": cand.engine_kwargs(cfg.settings), "requests": reqs,
            "replay": {"load": cfg.load.to_dict(), "repeats": cfg.repeats, "warmup": cfg.warmup, "samples": cfg.samples,
                       "sample_tokens": cfg.sample_tokens}, "engine_module": cfg.engine_module}


def _counts(t: FrozenTrial) -> bool:
    """A trial that used up budget: measured or failed on its own, not a duplicate, not interrupted."""
    return (t.state in (TrialState.COMPLETE, TrialState.FAIL) and "duplicate_of" not in t.user_attrs
            and not t.user_attrs.get("interrupted"))


def _finished(study: optuna.Study) -> list[FrozenTrial]:
    return [t for t in study.get_trials(deepcopy=False) if _counts(t)]


def _fail_stale(study: optuna.Study) -> None:
    """Trials left RUNNING by an interrupted run (killed hard, so it could not mark them) become FAIL."""
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        # Optuna has no public setter for a user attribute of a trial not in hand.
        study._storage.set_trial_user_attr(t._trial_id, "failure", "interrupted (found running on resume)")
        study._storage.set_trial_user_attr(t._trial_id, "interrupted", True)
        study.tell(t.number, state=TrialState.FAIL)


def _retry_interrupted(study: optuna.Study) -> None:
    """Queue again each interrupted candidate that has not been measured since."""
    trials = study.get_trials(deepcopy=False)
    done = {Candidate(t.user_attrs.get("candidate", {})).key() for t in trials
            if _counts(t) or t.state == TrialState.WAITING}
    for t in trials:
        key = Candidate(t.user_attrs.get("candidate", {})).key()
        if t.user_attrs.get("interrupted") and t.user_attrs.get("role") != BASELINE and key not in done:
            study.enqueue_trial(t.params)
            done.add(key)


def run_study(cfg: StudyConfig, workload: Workload, space: SearchSpace, *,
              progress: Progress | None = None, resume: bool = False,
              enqueue: list[dict[str, Any]] = ()) -> optuna.Study:
    """Run (or continue) the study until ``n_trials`` trials have finished.

    ``enqueue``: parameter sets to measure first, right after the baseline (Optuna ``enqueue_trial``).
    """
    progress = progress or _Quiet()
    cfg.results_dir.mkdir(parents=True, exist_ok=True)
    study = open_study(cfg)
    if resume:
        _fail_stale(study)
        _retry_interrupted(study)
    elif _finished(study):
        raise BadInput(f"--study: {cfg.name!r} already has trials in {cfg.results_dir}; "
                       "pass --resume to continue it or choose another --study name")
    study.set_user_attr("workload", workload.path)
    study.set_user_attr("space", space.name)
    study.set_user_attr("load", cfg.load.label)
    study.set_user_attr("concurrency", cfg.load.concurrency if cfg.load.kind == "concurrency" else None)
    waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    if baseline_trial(study) is None and not any(t.user_attrs.get("role") == BASELINE for t in waiting):
        # Not skip_if_exists: an interrupted baseline must run again.
        study.enqueue_trial(space.baseline_trial_params(), user_attrs={"role": BASELINE})
    for params in enqueue:
        study.enqueue_trial(params, skip_if_exists=True)
    asks = 0
    # Each duplicate costs an ask, not a measurement; a small space can run out of new configs.
    while len(_finished(study)) < cfg.n_trials and asks < 4 * cfg.n_trials + 4:
        asks += 1
        trial = study.ask()
        is_base = trial.user_attrs.get("role") == BASELINE
        cand = space.baseline_candidate() if is_base else space.suggest(trial)
        trial.set_user_attr("candidate", cand.params)
        trial.set_user_attr("label", cand.label)
        dup = None if is_base else _duplicate(study, cand, trial.number)
        if dup is not None:  # never measure the same config twice without meaning to
            trial.set_user_attr("duplicate_of", dup)
            study.tell(trial, state=TrialState.PRUNED)
            continue
        _run_one(study, trial, cand, workload, cfg, progress, is_base)
        if is_base and baseline_trial(study) is None:
            reason = study.trials[trial.number].user_attrs.get("failure", "unknown")
            raise StudyFailed(f"the baseline trial failed, nothing to compare against: {reason}")
    return study


def baseline_trial(study: optuna.Study) -> FrozenTrial | None:
    """The completed baseline trial, if any."""
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if t.user_attrs.get("role") == BASELINE:
            return t
    return None


def _duplicate(study: optuna.Study, cand: Candidate, number: int) -> int | None:
    key = cand.key()
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL, TrialState.RUNNING)):
        if t.number != number and (_counts(t) or t.state == TrialState.RUNNING) and \
                Candidate(t.user_attrs.get("candidate", {})).key() == key:
            return t.number
    return None


def _run_one(study: optuna.Study, trial: optuna.Trial, cand: Candidate, workload: Workload,
             cfg: StudyConfig, progress: Progress, is_base: bool) -> None:
    n = trial.number
    progress.trial_started(n, cand.label)
    workdir = cfg.results_dir / "trials" / f"{n:04d}"
    job = trial_job(cand, workload, cfg)
    try:
        outcome = run_trial(job, workdir, timeout_s=cfg.trial_timeout_s,
                            on_event=lambda e: progress.trial_event(n, e))
    except KeyboardInterrupt:
        trial.set_user_attr("failure", "interrupted by the user")
        trial.set_user_attr("interrupted", True)  # not counted, not a duplicate: --resume measures it again
        study.tell(trial, state=TrialState.FAIL)
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
    records = outcome.raw["windows"][0]["requests"]  # every window replays the same requests
    outputs = [{"id": r["id"], "token_ids": r["token_ids"], "text": r["text"],
                "finish_reason": r["finish_reason"], "error": r["error"], "chunks": len(r["chunks"])}
               for r in records]
    base = baseline_trial(study)
    if base is None and not is_base:
        raise StudyFailed("no completed baseline trial to judge candidates against")
    v = verdict(requests, records, None if is_base else base.user_attrs["outputs"],
                lossy=cand.lossy, tol=cfg.tolerances, samples=outcome.raw.get("samples"),
                base_samples=None if is_base else base.user_attrs.get("samples"))
    trial.set_user_attr("measurement", m)
    trial.set_user_attr("verdict", v.to_dict())
    for key, value in zip(("token_disagreement_over_budget", "expectation_regressions", "incomplete",
                           "distribution_shift"), v.constraints):
        trial.set_constraint(key, value)
    missed = [slo.text for slo in cfg.slos if slo.violation(m[slo.metric]) > 0]
    for slo in cfg.slos:
        trial.set_constraint(f"slo:{slo.text}", slo.violation(m[slo.metric]))
    trial.set_user_attr("slo_missed", missed)
    trial.set_user_attr("vllm_version", outcome.raw.get("vllm_version"))
    if is_base:  # the reference every candidate is judged against
        trial.set_user_attr("outputs", outputs)
        trial.set_user_attr("samples", outcome.raw.get("samples") or {})
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
