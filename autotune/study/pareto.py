"""From a finished Optuna study to tables: one row per trial, the feasible Pareto front, the pick."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from autotune.core import attrs
from autotune.core.candidate import Candidate
from autotune.measure.metrics import instances_of, paired_interval, ratio_interval
from autotune.measure.objectives import metric_key, parse_key, windows_key
from autotune.study.trials import feasible, is_schedule
from autotune.study.view import StudyView

METRIC_COLUMNS = ("output_tok_s", "output_tok_s_mad", "windows", "req_s", "ttft_ms_p50", "ttft_ms_p95",
                  "tpot_ms_p50", "itl_ms_p50", "e2e_ms_p50", "e2e_ms_p95", "acceptance_rate", "mean_accepted_length",
                  "engine_init_s", "completed", "incomplete", "kv_cache_blocks", "preemptions")


LEVEL_COLUMNS = ("output_tok_s", "windows", "noisy", "ttft_ms_p50", "tpot_ms_p50", "e2e_ms_p50", "e2e_ms_p95",
                 "acceptance_rate")


def pareto_front(trials: Sequence[FrozenTrial], directions: Sequence[StudyDirection]) -> list[FrozenTrial]:
    """The trials no other of ``trials`` dominates (at least as good on every objective and better on
    one), as Optuna's ``Study.best_trials`` defines it, over any set of trials: equal values keep both."""
    signs = [1 if d == StudyDirection.MAXIMIZE else -1 for d in directions]

    def dominates(a: FrozenTrial, b: FrozenTrial) -> bool:
        pairs = [(s * x, s * y) for s, x, y in zip(signs, a.values, b.values)]
        return all(x >= y for x, y in pairs) and any(x > y for x, y in pairs)

    return [t for t in trials if not any(dominates(o, t) for o in trials if o is not t)]


def pareto_trials(view: StudyView, *, schedules: bool = True) -> list[FrozenTrial]:
    """The Pareto front of the current records, feasible ones only (a wrong config is never on it):
    a trial measured again on a fresh engine is there as its pooled re-measurement. ``schedules=False``:
    the front of fixed-depth configs (a schedule is the pick only by autotune.study.schedule's checks)."""
    current = [t for t in view.current if feasible(t) and (schedules or not is_schedule(t))]
    return sorted(pareto_front(current, view.directions), key=lambda t: t.number)


LOSSY_MIN_GAIN = 0.03  # default --lossy-min-gain


def _windows(t: FrozenTrial, objective: str) -> list[float]:
    return t.user_attrs[attrs.MEASUREMENT].get(windows_key(objective)) or []


def lossy_gain(lossy: FrozenTrial, lossless: FrozenTrial, objective: str, maximize: bool) -> tuple[float, float]:
    """95% bootstrap interval of the lossy trial's gain over the lossless one on ``objective``
    (a ratio, > 1 when the lossy one is better), over their measured windows."""
    a, b = _windows(lossy, objective), _windows(lossless, objective)
    return ratio_interval(a, b) if maximize else ratio_interval(b, a)


@dataclass(frozen=True)
class Choice:
    """The pick, and the lossy trial it was chosen over (if any) with that trial's gain interval."""

    trial: FrozenTrial
    passed_over: FrozenTrial | None = None
    gain: tuple[float, float] = (float("nan"), float("nan"))
    min_gain: float = LOSSY_MIN_GAIN


def choose(view: StudyView, *, lossy_min_gain: float | None = None) -> Choice | None:
    """The Pareto trial that is best on the first (primary) objective, lossless first.

    A lossy pick (KV dtype, dtype, quantization) stands only where its gain over the best feasible
    lossless trial is significant: the bootstrap interval of the ratio lies above 1 + ``lossy_min_gain``
    (default: the study's ``lossy_min_gain`` attribute, else LOSSY_MIN_GAIN). Otherwise that lossless
    trial is the pick; the Pareto front still shows both.
    """
    front = pareto_trials(view, schedules=False)
    if not front:
        return None
    sign = view.sign
    maximize = sign == 1
    # On a tie, the record with more evidence (pooled over fresh engines) goes first.
    best = _held(view, front, max(front, key=lambda t: (sign * t.values[0], attrs.REMEASURE_OF in t.user_attrs)),
                 sign)
    lossless = [t for t in view.current
                if feasible(t) and not Candidate(t.user_attrs[attrs.CANDIDATE]).lossy and not is_schedule(t)]
    if not Candidate(best.user_attrs[attrs.CANDIDATE]).lossy or not lossless:
        return Choice(best)
    rival = max(lossless, key=lambda t: sign * t.values[0])
    gain = view.user_attrs.get(attrs.LOSSY_MIN_GAIN, LOSSY_MIN_GAIN) if lossy_min_gain is None else lossy_min_gain
    objective = (view.user_attrs.get(attrs.OBJECTIVES) or ["output_tok_s"])[0]
    lo, hi = lossy_gain(best, rival, objective, maximize)
    if lo == lo and lo > 1 + gain:
        return Choice(best, min_gain=gain)
    return Choice(rival, passed_over=best, gain=(lo, hi), min_gain=gain)


def _held(view: StudyView, front: list[FrozenTrial], best: FrozenTrial, sign: int) -> FrozenTrial:
    """``best``, unless it rests on one engine and the front's best record pooled over fresh engines
    is within the study's measured spread between instances of it (issue 24): fresh engines of one
    config differ by 8-20% on a shared machine, so such a lead is noise, and re-measuring the new
    leader only to see it regress cost up to 6 trials a study. A lead beyond the spread still wins."""
    if attrs.REMEASURE_OF in best.user_attrs:
        return best
    pooled = [t for t in front if attrs.REMEASURE_OF in t.user_attrs]
    if not pooled:
        return best
    held = max(pooled, key=lambda t: sign * t.values[0])
    spread = max((attrs.measurement(t).get("instance_spread") or 0.0)
                 for t in view.completed if attrs.REMEASURE_OF in t.user_attrs)
    return best if sign * (best.values[0] - held.values[0]) > spread * abs(held.values[0]) else held


def pick_best(view: StudyView, *, lossy_min_gain: float | None = None) -> FrozenTrial | None:
    """The chosen trial (see ``choose``)."""
    c = choose(view, lossy_min_gain=lossy_min_gain)
    return c.trial if c else None


def speedup(m: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """Ratios to the baseline, each > 1 when the candidate is better; the throughput ratio with its
    95% interval (``output_tok_s_lo`` .. ``_hi``) and the unit it is over (``output_tok_s_unit``).

    Where both were measured again on fresh engines in rounds (the pick and the baseline), the
    throughput ratio is that of the re-measurement pairs alone (autotune.measure.metrics.paired_interval,
    unit: paired instances): the trial that selected the pick never enters its figure (no winner's
    curse), and pooling every baseline instance instead would let the machine's drift over the study
    into the ratio. The pooled ratio stays as ``output_tok_s_pooled``. Otherwise the bootstrap over
    the windows of one instance each (unit: windows of one instance, far narrower than instances
    differ)."""
    from autotune.measure.intervals import UNIT_PAIRS, UNIT_WINDOWS

    def ratio(a: float, b: float) -> float:
        return a / b if b and math.isfinite(a) and math.isfinite(b) else float("nan")
    lo, hi = ratio_interval(m.get("output_tok_s_windows", []), base.get("output_tok_s_windows", []))
    point = ratio(m["output_tok_s"], base["output_tok_s"])
    paired: dict[str, Any] = {"output_tok_s_unit": UNIT_WINDOWS}
    if len(instances_of(m)) > 1 and len(instances_of(base)) > 1:
        r, p_lo, p_hi, pairs = paired_interval(instances_of(m), instances_of(base))
        if pairs and math.isfinite(r):
            paired = {"output_tok_s_pooled": point, "output_tok_s_pairs": pairs, "output_tok_s_unit": UNIT_PAIRS}
            point, lo, hi = r, p_lo, p_hi
    out = {"output_tok_s": point, **paired,
           "output_tok_s_lo": lo, "output_tok_s_hi": hi,
           "e2e_ms_p50": ratio(base["e2e_ms_p50"], m["e2e_ms_p50"]),
           "tpot_ms_p50": ratio(base["tpot_ms_p50"], m["tpot_ms_p50"])}
    for key in m:  # throughput at every load level the study measured (speculation can lose at high load)
        if key != "output_tok_s" and parse_key(key)[:2] == ("output_tok_s", "") and key in base:
            out[key] = ratio(m[key], base[key])
    return out


PREDICTED_COLUMNS = ("speedup", "lo", "hi", "step_cost", "tokens_per_step", "mean_accepted_length", "basis")


def trials_frame(view: StudyView) -> pd.DataFrame:
    """One row per measured or failed trial: params, metrics, verdict, failure reason, speedup."""
    base = view.reference
    base_m = base.user_attrs[attrs.MEASUREMENT] if base else None
    front = {t.number for t in pareto_trials(view)}
    old = view.superseded
    # Every objective gets a column, so that a report can draw the front from this table alone.
    # Extra load levels (objective@level): the headline metrics at each level as well.
    at_levels = [metric_key(k, lvl) for lvl in view.user_attrs.get(attrs.LEVELS, [])[1:] for k in LEVEL_COLUMNS]
    metrics = dict.fromkeys((*METRIC_COLUMNS, *view.user_attrs.get(attrs.OBJECTIVES, []), *at_levels))
    rows = []
    for t in view.trials:
        pruned = t.state == TrialState.PRUNED and attrs.PRUNED_WHY in t.user_attrs  # stopped early, with why
        if attrs.DUPLICATE_OF in t.user_attrs or (t.state not in (TrialState.COMPLETE, TrialState.FAIL) and not pruned):
            continue
        ua = t.user_attrs
        m, v = ua.get(attrs.MEASUREMENT, {}), ua.get(attrs.VERDICT, {})
        row: dict[str, Any] = {"trial": t.number, "state": t.state.name, "role": ua.get(attrs.ROLE, "candidate"),
                               "label": ua.get(attrs.LABEL), "pareto": t.number in front}
        row.update({f"param_{k}": val for k, val in ua.get(attrs.CANDIDATE, {}).items()})
        row.update({k: m.get(k) for k in metrics})
        row["acceptance_by_pos"] = " ".join(f"{x:.3f}" for x in m.get("acceptance_by_pos", []))
        if m and base_m:
            row.update({f"speedup_{k}": val for k, val in speedup(m, base_m).items()})
        pred = ua.get(attrs.PREDICTED) or {}  # what the forecast said before this trial ran
        row.update({f"predicted_{k}": pred.get(k) for k in PREDICTED_COLUMNS})
        row["planned"] = ua.get(attrs.PLANNED)
        row["remeasure_of"] = ua.get(attrs.REMEASURE_OF)  # pools its windows with that trial's
        row["superseded_by"] = old.get(t.number)
        row["correct"] = v.get("passed")
        row["status"] = v.get("status", "ok" if v.get("passed") else ("failed" if v else None))  # ok, failed, unverified
        row["token_agreement"] = v.get("token_agreement")
        # greedy outputs that differ, by first divergence (autotune.measure.nearties); absent before issue 43
        row["outputs_differ"] = v["greedy_requests"] - v["greedy_identical"] if "greedy_requests" in v else None
        for key in ("near_ties", "flip_faults", "flips_unscored", "near_tie_threshold", "near_tie_source",
                    "excused_positions", "excused_expected", "excused_p", "distribution_p", "distribution_p_band"):
            row[key] = v.get(key)
        row["verdict"] = v.get("reason")
        row["goodput"] = m.get("goodput")
        row["slo_missed"] = ", ".join(ua.get(attrs.SLO_MISSED, [])) or None
        row["noisy"] = m.get("noisy")
        row["cudagraph_outside"] = " ".join(map(str, (m.get("cudagraph_decode") or {}).get("outside", []))) or None
        row["failure"] = ua.get(attrs.FAILURE) or (f"pruned: {ua[attrs.PRUNED_WHY]}" if pruned else None)
        row["wall_s"] = ua.get(attrs.WALL_S)
        row["worker"] = ua.get(attrs.WORKER)  # host:pid/thread, for studies shared by several workers
        row["started"] = m.get("started")  # the measured engine: forked from the launcher, or fresh
        rows.append(row)
    return pd.DataFrame(rows)
