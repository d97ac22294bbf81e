"""Every call autotune makes into Optuna's private API, in one place.

Optuna's public API has no setter for a user attribute of a trial not in hand (a FrozenTrial),
no heartbeat context for ask/tell (only ``Study.optimize`` starts one), and no query of stale
trials that leaves them RUNNING (``fail_stale_trials`` fails them first, after which a trial can
take no user attribute, so the reason could not be recorded). These helpers use what
``Study.optimize`` itself uses; pyproject.toml caps Optuna below its next major version, where
any of them may move. (The Pareto front over a subset of a study's trials, which ``Study.best_trials``
does not take, is computed locally: autotune.study.pareto.pareto_front.)
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import optuna
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial


def set_trial_attr(study: optuna.Study, t: FrozenTrial | optuna.Trial, key: str, value: Any) -> None:
    """Set a user attribute of any trial of ``study`` (a FrozenTrial too)."""
    study._storage.set_trial_user_attr(t._trial_id, key, value)


def heartbeat(study: optuna.Study, trial: optuna.Trial) -> AbstractContextManager:
    """Optuna's own heartbeat thread for ``trial`` (a no-op for storages without heartbeats)."""
    from optuna.storages._heartbeat import get_heartbeat_thread  # the thread Study.optimize uses

    return get_heartbeat_thread(trial._trial_id, study._storage)


def heartbeat_enabled(storage: BaseStorage) -> bool:
    """An RDB storage with ``heartbeat_interval`` set (the only kind that records heartbeats)."""
    from optuna.storages._heartbeat import is_heartbeat_enabled

    return is_heartbeat_enabled(storage)


def stale_trial_ids(study: optuna.Study) -> set[int]:
    """Storage ids of RUNNING trials whose heartbeat is older than the storage's grace period."""
    return set(study._storage._get_stale_trial_ids(study._study_id))


def trial_id(t: FrozenTrial | optuna.Trial) -> int:
    return t._trial_id


def storage_of(study: optuna.Study) -> BaseStorage:
    return study._storage

