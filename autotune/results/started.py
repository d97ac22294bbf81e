"""How the engines a comparison rests on came to exist: forked from autotune's launcher, or fresh.

Each measurement carries ``started`` (autotune.measure.metrics: the measured engine's process, the
served trial's `vllm serve` or the worker's own in-process engine). The pick's speedup pairs its
engines with the baseline's (first engines, fresh-engine re-measurements); where the launcher
refused one of them (autotune.run.launcher: an environment it could not reproduce), a forked
instance is compared with a fresh one, and best.json says so in one line (``started.mixed``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autotune.core import attrs

if TYPE_CHECKING:
    from autotune.study.view import StudyView


def _instances(view: StudyView, trial: Any) -> list[str]:
    """``started`` of every engine instance of a trial's config: those its current record pools (its first
    engine, then each selection round, which pools the round before it), then its holdout instances."""
    chain = view.record_chain(trial)
    first = chain[0].number
    held = [t for t in view.completed if attrs.role(t) == attrs.HOLDOUT and t.user_attrs.get(attrs.HOLDOUT_OF) == first]
    return [str(attrs.measurement(t).get("started") or "unknown") for t in chain + held
            if attrs.MEASUREMENT in t.user_attrs]


def started_report(view: StudyView, pick: Any, base: Any) -> dict[str, Any] | None:
    """{"baseline": [...], "pick": [...], "mixed": one line or None}, per engine instance; None without
    both. ``view``: the study as read once (autotune.study.view.StudyView)."""
    if pick is None or base is None:
        return None
    got = {"baseline": _instances(view, base), "pick": _instances(view, pick)}
    kinds = {s for v in got.values() for s in v if s in ("forked", "fresh")}
    mixed = None
    if kinds == {"forked", "fresh"}:
        mixed = (f"the pick's speedup pairs forked with fresh engines (baseline: {', '.join(got['baseline'])}; "
                 f"pick: {', '.join(got['pick'])}): the launcher could not fork some of them (said during the study)")
    return {**got, "mixed": mixed}
