"""A speculative depth per batch size: vLLM's ``num_speculative_tokens_per_batch_size``.

Speculation's gain falls as more requests share a step, and the best depth falls with it. With
two or more load levels (``--levels 1,8``), every trial is measured at each level on its own
engine (and under a ramp from 1 to the top level and back). For the pick's family (the pick with
only its depth free, the baseline as depth 0), the study then

1. measures the depth the per-level forecast says is best at each level, if not measured yet
   (autotune.study.strategy.study_model at that level: the replayed acceptance is the same at every
   level, the step cost is fitted on what was measured there);
2. takes, per level, the best measured depth, a tie (within the measured noise) going to the
   smaller depth and 0 (no speculation) allowed; one range per level, split at the geometric
   middle between levels. Where one depth is within the noise of the best at every level there
   is no schedule: the tie rule alone would make one out of noise;
3. measures that schedule as one more candidate (role "schedule") and keeps it only if it is
   within the noise of the best fixed depth at every level and under the ramp; else the best
   fixed config stays the pick, and best.json says why.

The pure part (``best_depths``, ``ranges``, ``judge``) reads plain measurements; the rest reads a
live study.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from autotune.core import attrs
from autotune.study.trials import SCHEDULE_KEY
from autotune.measure.metrics import ratio_interval
from autotune.measure.objectives import WINDOWS, metric_key

TOP_BATCH = 256  # the last range's end; vLLM carries the last depth on past it anyway
METRIC = "output_tok_s"

if TYPE_CHECKING:
    from autotune.study.view import StudyView


def key_at(metric: str, level: str, primary: str, suffix: str = "") -> str:
    """A measurement key at a load level: the study's own level has the plain names."""
    return metric_key(metric, None if level == primary else level, suffix)


def batch_of(level: str) -> int | None:
    """The batch size a level label stands for (``concurrency=8`` -> 8); None for other patterns."""
    kind, _, arg = level.partition("=")
    return int(arg) if kind == "concurrency" and arg.isdigit() else None


@dataclass(frozen=True)
class LevelPick:
    """The depth chosen at one level, and the best one it tied with."""

    level: str
    batch: int
    k: int
    tok_s: float
    best_k: int
    best_tok_s: float


def best_depths(family: Mapping[int, Mapping[str, Any]], levels: Sequence[str], primary: str,
                noise: float) -> list[LevelPick]:
    """Per concurrency level, the smallest depth whose throughput is within ``noise`` of the best
    measured there (depth 0: the baseline). Levels no depth was measured at are left out."""
    out = []
    for level in levels:
        batch = batch_of(level)
        key = key_at(METRIC, level, primary)
        got = {k: m[key] for k, m in family.items() if isinstance(m.get(key), (int, float)) and math.isfinite(m[key])}
        if batch is None or not got:
            continue
        best_k = max(got, key=lambda k: (got[k], -k))
        k = min(k for k, v in got.items() if v >= got[best_k] * (1 - noise))
        out.append(LevelPick(level, batch, k, got[k], best_k, got[best_k]))
    return sorted(out, key=lambda p: p.batch)


def not_needed(picks: Sequence[LevelPick], family: Mapping[int, Mapping[str, Any]], primary: str,
               noise: float) -> str | None:
    """Why these per-level picks make no schedule (None: they do). A schedule has to beat every
    single depth somewhere by more than the noise: where one depth is within the noise of the best
    at every level, that depth is the answer, and the tie rule alone would make a schedule out of
    noise (seen here: depth 16 best at 1, 8 and 32 in flight gave 14, 7 and 15 by the tie rule, a
    schedule 12% slower at 1 in flight)."""
    if not picks:
        return "no depth of the pick's method was measured at a concurrency level"
    if len({p.best_k for p in picks}) == 1:
        return (f"depth {picks[0].best_k} measured best at every level (smaller depths within the noise, "
                f"{noise:.0%}, are no reason to switch)")
    worst: dict[int, tuple[float, str]] = {}  # depth -> its lowest ratio to a level's best, and where
    for k, m in family.items():
        at = [(m.get(key_at(METRIC, p.level, primary)), p) for p in picks]
        if all(isinstance(v, (int, float)) and math.isfinite(v) and p.best_tok_s > 0 for v, p in at):
            worst[k] = min((v / p.best_tok_s, p.level) for v, p in at)
    steady = [k for k, (r, _) in worst.items() if r >= 1 - noise]
    if steady:
        k = max(steady, key=lambda k: (worst[k][0], -k))
        r, level = worst[k]
        return (f"depth {k} is within the noise ({noise:.0%}) of the best at every level (at worst {r:.2f}x, "
                f"at {level}): no schedule beats it by more than the noise")
    return None


def ranges(picks: Sequence[LevelPick], top: int = TOP_BATCH) -> list[list[int]]:
    """vLLM's ``[first, last, k]`` ranges from per-level depths: each level owns the batch sizes up to
    the geometric middle between it and the next level; equal neighbours merge; the first starts at 1."""
    out: list[list[int]] = []
    start = 1
    for i, p in enumerate(picks):
        end = top if i == len(picks) - 1 else max(p.batch, min(picks[i + 1].batch - 1,
                                                                  math.isqrt(p.batch * picks[i + 1].batch)))
        end = max(end, start)
        if out and out[-1][2] == p.k:
            out[-1][1] = end
        else:
            out.append([start, end, p.k])
        start = end + 1
    return out


def check_ranges(ranges: Any, depth: Any) -> str | None:
    """Why ``ranges`` is not a schedule vLLM runs as written (None: it is). vLLM's own rules
    (vllm/v1/spec_decode/dynamic/utils.py): ``[first, last, k]`` entries, positive and ordered,
    not overlapping, the first from batch size 1, k >= 0; and vLLM caps every k at
    ``num_speculative_tokens``, so that must be given and at least the largest k."""
    if not isinstance(ranges, list) or not ranges or not all(
            isinstance(r, list) and len(r) == 3 and all(isinstance(x, int) and not isinstance(x, bool) for x in r)
            for r in ranges):
        return "expected a non-empty list of [first, last, k] integer ranges, e.g. [[1, 2, 4], [3, 256, 1]]"
    last = 0
    for first, end, k in sorted(ranges):
        if first <= last or end < first or k < 0:
            return f"expected ranges from 1 up, not overlapping, first <= last, k >= 0; got {ranges}"
        last = end
    if min(r[0] for r in ranges) != 1:
        return f"the first range must start at batch size 1; got {ranges}"
    top = max(r[2] for r in ranges)
    if not isinstance(depth, int) or depth < top:
        return f"num_speculative_tokens must be given and at least the schedule's largest k ({top}); got {depth}"
    return None


@dataclass(frozen=True)
class LevelCheck:
    """The schedule against the best fixed depth at one level (or under the ramp)."""

    level: str
    fixed: str  # label of the best fixed-depth config there
    schedule_tok_s: float
    fixed_tok_s: float
    ratio: float
    lo: float
    hi: float
    ok: bool


def judge(schedule: Mapping[str, Any], fixed: Mapping[str, tuple[str, Mapping[str, Any]]], primary: str,
          noise: float) -> list[LevelCheck]:
    """The schedule's throughput over the best fixed config's at each level (``fixed``: level ->
    (label, measurement)), with the 95% bootstrap interval over windows. It holds at a level when
    it is not worse by more than the noise: its ratio is at least 1 - ``noise``, or the interval
    reaches 1."""
    out = []
    for level, (label, m) in fixed.items():
        key = key_at(METRIC, level, primary)
        a, b = schedule.get(key), m.get(key)
        if not isinstance(a, (int, float)) or not isinstance(b, (int, float)) or not b:
            continue
        wkey = key_at(METRIC, level, primary, WINDOWS)
        lo, hi = ratio_interval(schedule.get(wkey, []), m.get(wkey, []))
        r = a / b
        out.append(LevelCheck(level, label, a, b, r, lo, hi, r >= 1 - noise or (hi == hi and hi >= 1)))
    return out


# --- a live study (as read once: autotune.study.view) ------------------------------------------

def levels_of(view: StudyView) -> list[str]:
    return list(view.user_attrs.get(attrs.LEVELS) or [])


def schedulable(view: StudyView) -> bool:
    """Two or more concurrency levels: a schedule has something to choose between."""
    return sum(batch_of(x) is not None for x in levels_of(view)) >= 2


def _family(view: StudyView, pick_params: Mapping[str, Any]) -> dict[int, Any]:
    """Depth -> the current record of each measured member of the pick's family (the baseline: 0)."""
    from autotune.study.trials import feasible

    rest = {k: v for k, v in pick_params.items() if k not in ("num_speculative_tokens", SCHEDULE_KEY)}
    out = {}
    ref = view.reference
    if ref is not None:
        out[0] = ref
    for t in view.current:
        c = attrs.candidate(t)
        if not feasible(t) or SCHEDULE_KEY in c or attrs.role(t) == attrs.BASELINE:
            continue
        if {k: v for k, v in c.items() if k != "num_speculative_tokens"} == rest and c.get("num_speculative_tokens"):
            k = int(c["num_speculative_tokens"])
            if k not in out or attrs.REMEASURE_OF in t.user_attrs:
                out[k] = t
    return out


def _models(view: StudyView, max_model_len: int | None) -> dict[str, Any]:
    """Level -> the study's model calibrated at that level (autotune.study.strategy.study_model), or None."""
    from autotune.study.strategy import study_model

    levels = levels_of(view)
    return {x: study_model(view, None, max_model_len, level=None if x == levels[0] else x) for x in levels}


def _noise(models: Mapping[str, Any]) -> float:
    """The widest noise the levels' models measured, at least the forecast's floor."""
    from autotune.forecast.forecast import FLOOR

    return max((max(FLOOR, got[0].noise) if got else FLOOR) for got in models.values())


def instance_spread(view: StudyView) -> float:
    """The most one config's throughput moved between two engine instances in this study (its selection
    rounds' pooled records, autotune.measure.metrics.pool, and its holdout instances against its first
    engine), 0 where none was measured again. The
    schedule and the fixed depths it is judged against each ran on one engine, so their ratio
    carries that spread whatever the windows inside one engine say."""
    pooled = [float(attrs.measurement(t).get("instance_spread") or 0.0) for t in view.completed]
    held = []  # holdout instances (autotune.study.holdout) are never pooled: each against its config's first engine
    for t in view.completed:
        first = view.by_number.get(t.user_attrs.get(attrs.HOLDOUT_OF)) if attrs.role(t) == attrs.HOLDOUT else None
        a, b = attrs.measurement(t).get("output_tok_s"), attrs.measurement(first).get("output_tok_s") if first else None
        if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b > 0:
            held.append(abs(a / b - 1.0))
    return max(pooled + held, default=0.0)


def next_step(study: Any, view: StudyView, space: Any, max_model_len: int | None) -> dict[str, Any] | None:
    """What the schedule needs measured next: ``{"params", "role", "why", "ranges"?}``, or None when
    nothing (no levels, a pick no replay covers, or done). Records the outcome in the study
    (``study``: for that only; ``view``: the study as this step read it)."""
    from optuna.trial import TrialState

    from autotune.forecast.forecast import SCHEDULED
    from autotune.study.pareto import choose

    if not schedulable(view):
        return None
    trials = view.trials
    if any(attrs.role(t) in (attrs.SCHEDULE, attrs.DEPTH) and t.state in (TrialState.WAITING, TrialState.RUNNING)
           for t in trials):
        return None
    if any(attrs.role(t) == attrs.SCHEDULE and not attrs.is_interrupted(t) for t in trials):
        return None  # measured (or failed) once: judged in the results
    choice = choose(view)
    if choice is None:
        return None
    pick = attrs.candidate(choice.trial)
    if pick.get("method") not in SCHEDULED or not pick.get("num_speculative_tokens"):
        _note(study, "not needed", f"the pick ({choice.trial.user_attrs.get(attrs.LABEL)}) has no depth to schedule")
        return None
    levels, primary = levels_of(view), levels_of(view)[0]
    # the pick's own depth knob (a space may hold one per method: MTP's from the model's layers)
    depths = next((p.values() for p in space.params if p.name == "num_speculative_tokens" and p.active(pick)), ())
    family = _family(view, pick)
    tried = {int(attrs.candidate(t).get("num_speculative_tokens") or 0) for t in trials if attrs.role(t) == attrs.DEPTH}
    models = _models(view, max_model_len)
    # 1. The forecast-best depth at each level, if not measured yet.
    for level in (x for x in levels if batch_of(x) is not None):
        got = models[level]
        if got is None:
            continue
        scored = [(f.speedup, k) for k in depths
                  if (f := got[0].forecast({**pick, "num_speculative_tokens": k})).speedup is not None]
        if not scored:
            continue
        s, k = max(scored, key=lambda x: (x[0], -x[1]))  # a tie goes to the smaller depth
        if k not in family and k not in tried:
            return {"params": {**pick, "num_speculative_tokens": k}, "role": attrs.DEPTH,
                    "why": f"best depth at {level} by forecast: predicted {s:.2f}x"}
    # 2. The schedule from what was measured.
    noise = _noise(models)
    family_m = {k: attrs.measurement(t) for k, t in family.items()}
    picks = best_depths(family_m, levels, primary, noise)
    if why := not_needed(picks, family_m, primary, noise):
        _note(study, "not needed", why, picks=[asdict(p) for p in picks])
        return None
    rs = ranges(picks)
    top = max(p.k for p in picks)
    study.set_user_attr(attrs.SCHEDULE_PLAN, {"ranges": rs, "picks": [asdict(p) for p in picks], "noise": noise})
    return {"params": {**pick, "num_speculative_tokens": top}, "role": attrs.SCHEDULE, "ranges": rs,
            "why": "depth schedule " + ", ".join(f"k={p.k} at {p.level}" for p in picks)}


def _note(study: Any, status: str, why: str, **extra: Any) -> None:
    study.set_user_attr(attrs.SCHEDULE_PLAN, {"status": status, "why": why, **extra})


def verdict(view: StudyView) -> dict[str, Any] | None:
    """best.json's ``schedule``: the ranges, each level's check against the best fixed depth, and
    whether the schedule is the pick (``status`` "recommended", "fell back", "failed", "not needed").

    The schedule judged is the study's own (role "schedule") or else one given with ``--try``
    (``source`` says which); with neither, why the study planned none."""
    from optuna.trial import TrialState

    from autotune.study.trials import counts, feasible, is_schedule

    plan = view.user_attrs.get(attrs.SCHEDULE_PLAN) or {}
    old = view.superseded
    measured = [t for t in view.trials if is_schedule(t) and t.number not in old and counts(t)]
    if not measured:
        if "ranges" in plan:
            return {**plan, "status": "not measured", "why": "the schedule was planned but not measured"}
        return dict(plan) or None
    t = max(measured, key=lambda x: (attrs.role(x) == attrs.SCHEDULE or attrs.REMEASURE_OF in x.user_attrs, x.number))
    pick = attrs.candidate(t)
    own = attrs.role(t) == attrs.SCHEDULE or attrs.REMEASURE_OF in t.user_attrs
    out = {**(plan if own else {}), "ranges": pick[SCHEDULE_KEY], "source": "planned" if own else "tried",
           "trial": t.number, "label": t.user_attrs.get(attrs.LABEL)}
    if t.state != TrialState.COMPLETE:
        return {**out, "status": "failed", "why": t.user_attrs.get(attrs.FAILURE, "unknown")}
    if not feasible(t):
        return {**out, "status": "fell back", "why": "the scheduled config's outputs failed the correctness checks"}
    levels, primary = levels_of(view), levels_of(view)[0]
    noise = plan.get("noise") if own and plan.get("noise") else \
        _noise(_models(view, view.user_attrs.get(attrs.MAX_MODEL_LEN)))
    spread = instance_spread(view)
    noise = max(noise, spread)
    out["noise"], out["instance_spread"] = noise, spread
    members = _family(view, pick)
    fixed = {}
    for level in levels:
        key = key_at(METRIC, level, primary)
        have = {k: x for k, x in members.items() if isinstance(attrs.measurement(x).get(key), (int, float))}
        if have:
            k = max(have, key=lambda k: attrs.measurement(have[k])[key])
            fixed[level] = (have[k].user_attrs.get(attrs.LABEL), attrs.measurement(have[k]))
    checks = judge(attrs.measurement(t), fixed, primary, noise)
    out["checks"] = [asdict(c) for c in checks]
    bad = [c for c in checks if not c.ok]
    remeasured = any(attrs.REMEASURE_OF in x.user_attrs for x in view.trials)
    said = f"{noise:.0%}" + (", the most a config moved between engine instances here" if spread >= noise else
                             "; no config was measured on a second engine, so how far engine instances differ is "
                             "not in it" if not remeasured else "")
    if bad or len(checks) < len(levels):
        worst = min(bad, key=lambda c: c.ratio) if bad else None
        why = (f"at {worst.level} the schedule measured {worst.ratio:.2f}x the best fixed depth ({worst.fixed}), "
               f"[{worst.lo:.2f}-{worst.hi:.2f}], worse than the noise ({said}) allows: the best fixed "
               "config stays the pick") if worst else "no fixed depth of its method was measured at every level"
        return {**out, "status": "fell back", "why": why}
    return {**out, "status": "recommended",
            "why": f"within the noise ({said}) of the best fixed depth at every level and under the ramp"}


def scheduled_trial(view: StudyView, v: dict[str, Any] | None = None) -> Any | None:
    """The schedule's trial when it is recommended (the pick), else None; ``v``: its ``verdict``
    where the caller has it already."""
    v = verdict(view) if v is None else v
    if not v or v.get("status") != "recommended":
        return None
    return view.trial(v["trial"])
