"""Which trials count, one trial at a time: the predicates on a single trial that the study floor's
view (autotune.study.view.StudyView) and its helpers share, and where a trial's files live.

What a study derives from all its trials together (the baseline, each config's current record,
the trials that used the budget) is the view's, read once per step.
"""

from __future__ import annotations

from pathlib import Path

from optuna.trial import FrozenTrial, TrialState

from autotune.core import attrs

SCHEDULE_KEY = "num_speculative_tokens_per_batch_size"  # vLLM's speculative_config key for a depth schedule


def counts(t: FrozenTrial) -> bool:
    """A trial that used up budget: measured, failed or pruned (an engine ran) on its own, not a
    duplicate, not interrupted."""
    return ((t.state in (TrialState.COMPLETE, TrialState.FAIL)
             or (t.state == TrialState.PRUNED and attrs.PRUNED_WHY in t.user_attrs))
            and attrs.DUPLICATE_OF not in t.user_attrs and not t.user_attrs.get(attrs.INTERRUPTED))


def trial_dir(results_dir: Path, number: int) -> Path:
    """A trial's folder: its job, events, result and worker.log (``results/<study>/trials/NNNN``)."""
    return results_dir / "trials" / f"{number:04d}"


def feasible(t: FrozenTrial) -> bool:
    return t.state == TrialState.COMPLETE and all(c <= 0 for c in t.constraints.values())


def is_schedule(t: FrozenTrial) -> bool:
    """A depth schedule's trial (autotune.study.schedule), or its re-measurement."""
    return SCHEDULE_KEY in attrs.candidate(t)
