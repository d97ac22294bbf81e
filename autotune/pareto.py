"""From a finished Optuna study to tables: one row per trial, the feasible Pareto front, the pick."""

from __future__ import annotations

import math
from typing import Any

import optuna
import pandas as pd
from optuna.trial import FrozenTrial, TrialState

from autotune.metrics import ratio_interval
from autotune.study import baseline_trial

METRIC_COLUMNS = ("output_tok_s", "output_tok_s_mad", "windows", "req_s", "ttft_ms_p50", "ttft_ms_p95",
                  "tpot_ms_p50", "itl_ms_p50", "e2e_ms_p50", "e2e_ms_p95", "acceptance_rate", "mean_accepted_length",
                  "engine_init_s", "completed", "incomplete")


LEVEL_COLUMNS = ("output_tok_s", "windows", "noisy", "ttft_ms_p50", "tpot_ms_p50", "e2e_ms_p50", "e2e_ms_p95",
                 "acceptance_rate")


def feasible(t: FrozenTrial) -> bool:
    return t.state == TrialState.COMPLETE and all(c <= 0 for c in t.constraints.values())


def pareto_trials(study: optuna.Study) -> list[FrozenTrial]:
    """Optuna's Pareto front over feasible trials only (a wrong config is never on it)."""
    return sorted((t for t in study.best_trials if feasible(t)), key=lambda t: t.number)


def pick_best(study: optuna.Study) -> FrozenTrial | None:
    """The Pareto trial that is best on the first (primary) objective."""
    front = pareto_trials(study)
    if not front:
        return None
    sign = 1 if study.directions[0] == optuna.study.StudyDirection.MAXIMIZE else -1
    return max(front, key=lambda t: sign * t.values[0])


def speedup(m: dict[str, Any], base: dict[str, Any]) -> dict[str, float]:
    """Ratios to the baseline, each > 1 when the candidate is better; the throughput ratio with its
    95% bootstrap interval over the measured windows (``output_tok_s_lo`` .. ``_hi``)."""
    def ratio(a: float, b: float) -> float:
        return a / b if b and math.isfinite(a) and math.isfinite(b) else float("nan")
    lo, hi = ratio_interval(m.get("output_tok_s_windows", []), base.get("output_tok_s_windows", []))
    out = {"output_tok_s": ratio(m["output_tok_s"], base["output_tok_s"]),
           "output_tok_s_lo": lo, "output_tok_s_hi": hi,
           "e2e_ms_p50": ratio(base["e2e_ms_p50"], m["e2e_ms_p50"]),
           "tpot_ms_p50": ratio(base["tpot_ms_p50"], m["tpot_ms_p50"])}
    for key in m:  # throughput at every load level the study measured (speculation can lose at high load)
        if key.startswith("output_tok_s@") and key in base:
            out[key] = ratio(m[key], base[key])
    return out


def trials_frame(study: optuna.Study) -> pd.DataFrame:
    """One row per measured or failed trial: params, metrics, verdict, failure reason, speedup."""
    base = baseline_trial(study)
    base_m = base.user_attrs["measurement"] if base else None
    front = {t.number for t in pareto_trials(study)}
    # Every objective gets a column, so that a report can draw the front from this table alone.
    # Extra load levels (objective@level): the headline metrics at each level as well.
    at_levels = [f"{k}@{lvl}" for lvl in study.user_attrs.get("levels", [])[1:] for k in LEVEL_COLUMNS]
    metrics = dict.fromkeys((*METRIC_COLUMNS, *study.user_attrs.get("objectives", []), *at_levels))
    rows = []
    for t in study.get_trials(deepcopy=False):
        if "duplicate_of" in t.user_attrs or t.state not in (TrialState.COMPLETE, TrialState.FAIL):
            continue
        ua = t.user_attrs
        m, v = ua.get("measurement", {}), ua.get("verdict", {})
        row: dict[str, Any] = {"trial": t.number, "state": t.state.name, "role": ua.get("role", "candidate"),
                               "label": ua.get("label"), "pareto": t.number in front}
        row.update({f"param_{k}": val for k, val in ua.get("candidate", {}).items()})
        row.update({k: m.get(k) for k in metrics})
        row["acceptance_by_pos"] = " ".join(f"{x:.3f}" for x in m.get("acceptance_by_pos", []))
        if m and base_m:
            row.update({f"speedup_{k}": val for k, val in speedup(m, base_m).items()})
        row["correct"] = v.get("passed")
        row["token_agreement"] = v.get("token_agreement")
        row["verdict"] = v.get("reason")
        row["goodput"] = m.get("goodput")
        row["slo_missed"] = ", ".join(ua.get("slo_missed", [])) or None
        row["noisy"] = m.get("noisy")
        row["failure"] = ua.get("failure")
        row["wall_s"] = ua.get("wall_s")
        row["worker"] = ua.get("worker")  # host:pid/thread, for studies shared by several workers
        rows.append(row)
    return pd.DataFrame(rows)
