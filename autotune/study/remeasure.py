"""What comes on top of the candidates (--candidates), in this order: a depth schedule's measurements (two
or more load levels), the selection rounds that end the selection phase (autotune.study.select), then
the holdout the pick's figure comes from (autotune.study.holdout). Choose, then estimate: nothing
queued after the choice is final can change it."""

from __future__ import annotations

import optuna

from autotune.core import attrs
from autotune.measure.config import StudyConfig
from autotune.core.space import SearchSpace
from autotune.study.holdout import holdout_step
from autotune.study.opening import optuna_params, ranges_attr
from autotune.study.select import selection_step
from autotune.study.trials import SCHEDULE_KEY
from autotune.study.schedule import next_step as schedule_step
from autotune.study.view import StudyView


def extra_work(study: optuna.Study, view: StudyView, space: SearchSpace, cfg: StudyConfig) -> bool:
    """Queue the next piece of work on top of the candidates; True while any is queued. ``study``: for
    queueing (and recording the schedule's plan and the final choice) only; ``view``: the study as
    this step read it."""
    waiting = view.waiting
    if waiting and all(attrs.role(t) in attrs.OUTSIDE_BUDGET for t in waiting):
        return True
    if view.running:
        return False  # another worker's trial may still change the records the next step reads
    step = schedule_step(study, view, space, cfg.settings.max_model_len) if cfg.schedule else None
    if step is not None:
        params = {**step["params"], SCHEDULE_KEY: step["ranges"]} if "ranges" in step else step["params"]
        study.enqueue_trial(optuna_params(params),
                            user_attrs={attrs.ROLE: step["role"], attrs.PLANNED: step["why"], **ranges_attr(params)})
        return True
    # What the schedule just noted (if any) is not in ``view``; the selection reads it through a
    # schedule trial only, which the note never adds.
    if selection_step(study, view, cfg):
        return True
    return holdout_step(study, StudyView.of(study), cfg)  # read again: the choice just recorded, if any
