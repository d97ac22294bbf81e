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
from autotune.measure.config import LOSSY_MIN_GAIN
from autotune.measure.metrics import paired_interval, ratio_interval
from autotune.measure.objectives import measured, metric_key, parse_key, windows_key
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


@dataclass(frozen=True)
class Choice:
    """The pick, and the lossy trial it was chosen over (if any) with that trial's paired gain interval."""

    trial: FrozenTrial
    passed_over: FrozenTrial | None = None
    gain: tuple[float, float] = (float("nan"), float("nan"))
    min_gain: float = LOSSY_MIN_GAIN
    why: str | None = None  # the selection's reason (autotune.study.select), once the choice is final
    final: bool = False  # the selection phase has ended: no measurement to come changes it


def choose(view: StudyView, *, lossy_min_gain: float | None = None) -> Choice | None:
    """The pick: the selection phase's final choice where it has ended (autotune.study.select, recorded
    in the study), else the provisional one, the Pareto trial best on the first (primary) objective,
    lossless first: a lossy leader is never picked before it was measured side by side with the best
    lossless config (its gain decided on paired instances, never on windows), so until then the best
    feasible lossless trial is. The Pareto front still shows both."""
    gain = float(view.user_attrs.get(attrs.LOSSY_MIN_GAIN, LOSSY_MIN_GAIN) if lossy_min_gain is None
                 else lossy_min_gain)
    sel = view.selected()
    if sel is not None:
        over = view.by_number.get(sel["passed_over"]) if sel.get("passed_over") is not None else None
        lo, hi = (sel.get("gain") or [None, None])
        return Choice(view.latest(view.trial(sel["trial"])), passed_over=over,
                      gain=(float("nan") if lo is None else lo, float("nan") if hi is None else hi),
                      min_gain=gain, why=sel.get("why"), final=True)
    front = pareto_trials(view, schedules=False)
    if not front:
        return None
    sign = view.sign
    # On a tie, the record with more evidence (pooled over fresh engines) goes first.
    best = max(front, key=lambda t: (sign * t.values[0], attrs.REMEASURE_OF in t.user_attrs))
    lossless = [t for t in view.current
                if feasible(t) and not Candidate(t.user_attrs[attrs.CANDIDATE]).lossy and not is_schedule(t)]
    if not Candidate(best.user_attrs[attrs.CANDIDATE]).lossy or not lossless:
        return Choice(best, min_gain=gain)
    rival = max(lossless, key=lambda t: sign * t.values[0])
    return Choice(rival, passed_over=best, min_gain=gain,
                  why=f"lossless first: {attrs.label(best)} is lossy and not yet measured side by side with the best "
                      "lossless config")


def pick_best(view: StudyView, *, lossy_min_gain: float | None = None) -> FrozenTrial | None:
    """The chosen trial (see ``choose``)."""
    c = choose(view, lossy_min_gain=lossy_min_gain)
    return c.trial if c else None


def speedup(m: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """Ratios of one record to the baseline's, each > 1 when the candidate is better; the throughput
    ratio with its 95% interval (``output_tok_s_lo`` .. ``_hi``) and the unit it is over
    (``output_tok_s_unit``). This is a record's measured ratio, the evidence a choice rests on; the
    pick's figure is another thing (autotune.study.figures: the holdout, measured after the choice).

    Where both were measured in the same selection rounds (side by side), the throughput ratio is
    that of those rounds' pairs alone (autotune.measure.metrics.paired_interval, unit: paired
    instances), the trial that selected the config left out; the pooled ratio stays as
    ``output_tok_s_pooled``. Otherwise the bootstrap over the windows of one instance each (unit:
    windows of one instance, far narrower than instances differ)."""
    from autotune.measure.intervals import UNIT_PAIRS, UNIT_WINDOWS

    def ratio(a: float, b: float) -> float:
        return a / b if b and math.isfinite(a) and math.isfinite(b) else float("nan")
    lo, hi = ratio_interval(m.get("output_tok_s_windows", []), base.get("output_tok_s_windows", []))
    point = ratio(m["output_tok_s"], base["output_tok_s"])
    paired: dict[str, Any] = {"output_tok_s_unit": UNIT_WINDOWS}
    if m is not base:
        r, p_lo, p_hi, pairs = paired_interval(m, base)
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


def unit_speedup(m: dict[str, Any]) -> dict[str, Any]:
    """The speedup of a record of the baseline's own config: 1 by definition, whichever of its engines
    (how far one instance of it ran from another is in its tok/s, never a speedup); NaN for a TPOT its
    stream did not time (autotune.measure.coalescing): not measured, so no ratio, not even 1."""
    tpot = 1.0 if measured(m, "tpot_ms_p50") is not None else float("nan")
    out: dict[str, Any] = {"output_tok_s": 1.0, "output_tok_s_lo": 1.0, "output_tok_s_hi": 1.0,
                           "output_tok_s_unit": BASELINE_ITSELF, "e2e_ms_p50": 1.0, "tpot_ms_p50": tpot}
    out.update({k: 1.0 for k in m if k != "output_tok_s" and parse_key(k)[:2] == ("output_tok_s", "")})
    return out


BASELINE_ITSELF = "the baseline itself"  # the unit of the baseline config's speedup: 1 by definition


def is_baseline_config(view: StudyView, t: FrozenTrial) -> bool:
    """A record of the baseline's own config: trial 0, its selection rounds, its holdout instances."""
    base = view.baseline
    return base is not None and Candidate(attrs.candidate(t)).key() == Candidate(attrs.candidate(base)).key()


def record_speedup(view: StudyView, t: FrozenTrial) -> dict[str, Any] | None:
    """``t``'s speedup as every table shows it: over the baseline's current record (``view.reference``,
    named where shown as "over trial N"), paired over the selection rounds where both ran in them
    (``speedup``); 1 for the baseline's own config."""
    ref = view.reference
    m = attrs.measurement(t)
    if ref is None or not m or not attrs.measurement(ref):
        return None
    return unit_speedup(m) if is_baseline_config(view, t) else speedup(m, attrs.measurement(ref))


def over_first_baseline(view: StudyView, t: FrozenTrial) -> float | None:
    """``t``'s output tok/s over the baseline's first engine's (trial 0, known when ``t``'s console line
    prints: the figure that line names ``measured ... over trial 0``); 1 for the baseline's own config."""
    base = view.baseline
    if base is None or t.state != TrialState.COMPLETE:
        return None
    if is_baseline_config(view, t):
        return 1.0
    a, b = attrs.measurement(t).get("output_tok_s"), attrs.measurement(base).get("output_tok_s")
    ok = isinstance(a, (int, float)) and isinstance(b, (int, float)) and b > 0 and math.isfinite(a)
    return a / b if ok else None


def record_kind(view: StudyView, t: FrozenTrial) -> str:
    """What a row's record is, in a few words: its config's first engine, a selection round's record
    pooled over several engines, or a holdout instance (never pooled): every table marks the last two."""
    if attrs.role(t) == attrs.HOLDOUT:
        return f"holdout {attrs.round_of(t)}, not pooled"
    if attrs.REMEASURE_OF in t.user_attrs:
        return f"pooled: {len(view.record_chain(t))} engines (round {attrs.round_of(t)})"
    return "first engine"


PREDICTED_COLUMNS = ("speedup", "lo", "hi", "step_cost", "tokens_per_step", "mean_accepted_length", "basis")


def trials_frame(view: StudyView) -> pd.DataFrame:
    """One row per measured or failed trial: params, metrics, verdict, failure reason, speedup."""
    base = view.reference
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
        # Each figure against a named baseline: the ``speedup_*`` columns over the baseline's current record
        # (trial ``speedup_over``, as the Pareto table, report.md and best.json show it), and the row's tok/s
        # over the baseline's first engine (the console's ``measured ... over trial 0``); 1 for the baseline.
        if m and (sp := record_speedup(view, t)) is not None:
            row.update({f"speedup_{k}": val for k, val in sp.items()})
            row["speedup_over"] = base.number if base is not None else None
        row["speedup_over_first_baseline"] = over_first_baseline(view, t) if m else None
        row["record"] = record_kind(view, t)
        pred = ua.get(attrs.PREDICTED) or {}  # what the forecast said before this trial ran
        row.update({f"predicted_{k}": pred.get(k) for k in PREDICTED_COLUMNS})
        row["planned"] = ua.get(attrs.PLANNED)
        row["remeasure_of"] = ua.get(attrs.REMEASURE_OF)  # pools its windows with that trial's
        row["round"] = ua.get(attrs.ROUND)  # its round of fresh engines side by side (selection "s", holdout "h")
        row["holdout_of"] = ua.get(attrs.HOLDOUT_OF)  # measured after the choice: the figure's, never pooled
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
        row["model_runner"] = m.get("model_runner")  # v1 or v2, as the trial's engine ran (autotune.core.runner)
        row["cudagraph_outside"] = " ".join(map(str, (m.get("cudagraph_decode") or {}).get("outside", []))) or None
        row["failure"] = ua.get(attrs.FAILURE) or (f"pruned: {ua[attrs.PRUNED_WHY]}" if pruned else None)
        row["wall_s"] = ua.get(attrs.WALL_S)
        row["worker"] = ua.get(attrs.WORKER)  # host:pid/thread, for studies shared by several workers
        row["started"] = m.get("started")  # the measured engine: forked from the launcher, or fresh
        rows.append(row)
    return pd.DataFrame(rows)
