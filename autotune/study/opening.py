"""Opening a study: its storage and sampler, the fingerprint a resumed study must match, and the
configs queued before the first ask (the baseline, --try, a warm start)."""

from __future__ import annotations

import warnings
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from autotune.core import attrs
from autotune.core.attrs import BASELINE, DEPLOYED
from autotune.measure.config import StudyConfig
from autotune.core.errors import BadInput
from autotune.measure.objectives import validate_objectives
from autotune.core.space import SearchSpace
from autotune.study.trials import SCHEDULE_KEY
from autotune.study.storage import open_storage
from autotune.study.view import StudyView
from autotune.core.workload import Workload



def sampler(seed: int, strategy: str = "tpe") -> optuna.samplers.BaseSampler:
    # Constraints are set on each trial (Trial.set_constraint); TPE and best_trials honour them.
    # predict and grid queue their own candidates (enqueue_trial); TPE only fills what they leave.
    if strategy == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True, n_startup_trials=5)


def quiet_optuna() -> None:
    # Our own progress display says what happens; Optuna's INFO lines, the warning that TPE's
    # ``group`` is experimental and the one that heartbeats are meant for ``optimize`` (we keep them
    # with ask/tell, see _work) would only interleave with it.
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")


def open_study(cfg: StudyConfig) -> optuna.Study:
    """Create the study, or load it to resume or to join other workers (same name and storage)."""
    directions = validate_objectives(cfg.objectives)
    quiet_optuna()
    storage = open_storage(cfg.storage_url)
    try:
        study = optuna.create_study(study_name=cfg.name, storage=storage, directions=directions,
                                    sampler=sampler(cfg.seed, cfg.strategy))
    except optuna.exceptions.DuplicatedStudyError:
        # Made by an earlier run or by another worker. The same seed would replay the same random
        # configs (all duplicates now); a seed moved on by the trials so far stays reproducible.
        study = optuna.load_study(study_name=cfg.name, storage=storage)
        study.sampler = sampler(cfg.seed + 1 + len(StudyView.of(study).trials), cfg.strategy)
    saved = StudyView.of(study).user_attrs.get(attrs.OBJECTIVES)
    if saved is not None and tuple(saved) != cfg.objectives:
        raise BadInput(f"--objectives: study {cfg.name!r} was created with {saved}, got {list(cfg.objectives)}")
    study.set_user_attr(attrs.OBJECTIVES, list(cfg.objectives))
    return study


# What each fingerprint key is set by, for the one line that refuses a run that differs.
_FINGERPRINT_FLAGS = {"model": "--model", "draft_model": "--draft-model", "eagle_head": "--eagle-head",
                      "eagle3_head": "--eagle3-head", "tokenizer": "--tokenizer", "dtype": "--dtype",
                      "max_model_len": "--max-model-len", "workload": "WORKLOAD (its requests)",
                      "space": "--space", "levels": "--load/--concurrency/--levels", "instrument": "--instrument",
                      "serve_flags": "serving flags (after --, or --serve-config)"}


def fingerprint(cfg: StudyConfig, workload: Workload, space: SearchSpace) -> dict[str, Any]:
    """What defines a study's numbers: the models, the workload's requests (by content, so the same
    file from another checkout matches), the space's source, the load levels, the instrument and the
    user's serving flags (a study made before them has none saved, and any run may join it).
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
            "levels": [cfg.load.label, *(x.label for x in cfg.extra_loads)], "instrument": cfg.instrument,
            "serve_flags": dict(s.serve_flags)}


def check_fingerprint(view: StudyView, cfg: StudyConfig, mine: dict[str, Any]) -> None:
    """Refuse to resume or join a study that another model, workload, space, load or instrument made."""
    saved = view.user_attrs.get(attrs.FINGERPRINT)
    if saved is None:  # made before fingerprints (or just created): this run defines it
        return
    differ = [k for k in mine if k in saved and saved[k] != mine[k]]
    if differ:
        k = differ[0]
        raise BadInput(f"{_FINGERPRINT_FLAGS.get(k, k)}: study {cfg.name!r} was made with {k}={saved[k]!r}, this run "
                       f"has {mine[k]!r}" + (f" (also differ: {', '.join(differ[1:])})" if differ[1:] else "")
                       + "; use another --study name, or the study's own settings")


def describe(study: optuna.Study, view: StudyView, cfg: StudyConfig, workload: Workload, space: SearchSpace
             ) -> None:
    """What the results files and reports read from the study itself (``view``: the study as read
    before, whose fingerprint this run must match)."""
    mine = fingerprint(cfg, workload, space)
    check_fingerprint(view, cfg, mine)
    study.set_user_attr(attrs.FINGERPRINT, mine)
    study.set_user_attr(attrs.WORKLOAD, workload.path)
    study.set_user_attr(attrs.SPACE, space.name)
    study.set_user_attr(attrs.SPACE_RESOLVED, space.resolved)
    study.set_user_attr(attrs.MAX_MODEL_LEN, cfg.settings.max_model_len)  # what ngram replays cap drafts at
    study.set_user_attr(attrs.LOAD, cfg.load.label)
    study.set_user_attr(attrs.CONCURRENCY, cfg.load.concurrency if cfg.load.kind == "concurrency" else None)
    study.set_user_attr(attrs.LEVELS, [cfg.load.label, *(x.label for x in cfg.extra_loads)])
    study.set_user_attr(attrs.LOSSY_MIN_GAIN, cfg.lossy_min_gain)
    study.set_user_attr(attrs.HOLDOUT_PAIRS, cfg.pairs if cfg.remeasure else None)  # None: --no-remeasure
    study.set_user_attr(attrs.GATE_TOLERANCE, cfg.gate_tolerance)
    study.set_user_attr(attrs.STRATEGY, cfg.strategy)
    study.set_user_attr(attrs.STOPPED, None)  # a resumed study plans again


def queue_first(study: optuna.Study, view: StudyView, space: SearchSpace, enqueue: list[dict[str, Any]],
                deployed: dict[str, Any] | None) -> None:
    """The baseline first, then the deployed config, then the configs asked for."""
    pending = [*view.waiting, *view.running]
    if view.baseline is None and not any(attrs.role(t) == BASELINE for t in pending):
        # First in line (not skip_if_exists: an interrupted baseline must run again).
        study.enqueue_trial(space.baseline_trial_params(), user_attrs={attrs.ROLE: BASELINE, attrs.QUEUED: True})
    if deployed is not None and not any(attrs.role(t) == DEPLOYED for t in view.trials):
        study.enqueue_trial(optuna_params(deployed), user_attrs={attrs.ROLE: DEPLOYED, **ranges_attr(deployed)})
    for params in enqueue:
        study.enqueue_trial(optuna_params(params), user_attrs={attrs.ASKED: True, **ranges_attr(params)},
                            skip_if_exists=True)


def optuna_params(params: dict[str, Any]) -> dict[str, Any]:
    """The parameters Optuna asks for (a schedule's ranges are not one of them)."""
    return {k: v for k, v in params.items() if k != SCHEDULE_KEY}


def ranges_attr(params: dict[str, Any]) -> dict[str, Any]:
    """A queued config's depth schedule, kept as a trial attribute (the worker adds it back)."""
    return {attrs.SCHEDULE_RANGES: params[SCHEDULE_KEY]} if params.get(SCHEDULE_KEY) else {}



def enqueue_again(study: optuna.Study, t: FrozenTrial, user_attrs: dict[str, Any]) -> None:
    """Queue ``t``'s config once more (a fresh engine) with ``user_attrs``: a selection or holdout round."""
    params = attrs.candidate(t)  # the baseline has no Optuna params
    beyond = t.user_attrs.get(attrs.PAST_EDGE)  # past the space's edge: Optuna gets the in-space values
    study.enqueue_trial({**optuna_params(params), **{k: t.params[k] for k in beyond or {} if k in t.params}},
                        user_attrs={**user_attrs, **ranges_attr(params), **({attrs.PAST_EDGE: beyond} if beyond else {})})
