"""The report's plots: each described once as a ``Chart``, drawn by autotune.results.draw (matplotlib:
an SVG in the HTML, a PNG beside it); tests read these objects, not pixels.

From the saved trials table and StudyReport only (autotune.results.report reads them): the Pareto front,
speedup by method and depth, forecast against measurement, acceptance by position, parameter importances,
speedup by category. Rules every chart keeps: a method has one colour (autotune.results.method_colors);
a speedup carries its 95% interval as error bars; the pick is marked, with why; a trial superseded by
its re-measurement is drawn faded; where `autotune confirm` ran, the served figure stands beside the claim.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.measure.config import LOSSY_MIN_GAIN

import pandas as pd

from autotune.core.candidate import Candidate
from autotune.measure.objectives import direction
from autotune.results.method_colors import method_color, other_color

MIN_TRIALS_FOR_IMPORTANCE = 4  # fewer completed trials say nothing about which knob matters
MAX_ACCEPTANCE_LINES = 10  # more lines than this are unreadable; the best by acceptance are kept
INTERVAL = "bars: 95% interval"  # the unit of every speedup's error bars, said on its axis


@dataclass
class Series:
    """One trace: points, a line, or bars (bars share the chart's categorical x axis)."""

    name: str
    x: list[Any]
    y: list[float]
    kind: str = "markers"  # markers | lines | lines+markers | bar
    symbol: str = "circle"
    size: int = 9
    color: str | None = None
    text: list[str] | None = None  # drawn next to each point
    hover: list[str] | None = None
    method: str | None = None  # the speculative method drawn (its colour is method_color's), None: not a method
    error: list[tuple[float, float]] | None = None  # each y's (lo, hi): a 95% interval, drawn as error bars
    x_error: list[tuple[float, float]] | None = None  # each x's (lo, hi)
    opacity: float = 1.0  # < 1: superseded, drawn faded
    hatch: bool = False  # a served figure (vllm bench serve) beside the study's bars


@dataclass
class Chart:
    """A plot, independent of the library that draws it; ``note`` explains what is missing or left out."""

    slug: str
    title: str
    x_title: str
    y_title: str
    series: list[Series] = field(default_factory=list)
    hline: tuple[float, str] | None = None  # a reference line and its label
    categories: list[str] | None = None  # categorical x axis (bar charts)
    y_range: tuple[float, float] | None = None
    x_integer: bool = False  # positions 1, 2, 3: no ticks in between
    horizontal: bool = False  # bars along x, categories one under another (long names stay readable)
    note: str = ""


def _axis(metric: str) -> str:
    better = {"maximize": "higher is better", "minimize": "lower is better"}.get(direction(metric) or "")
    return f"{metric} ({better})" if better else metric


def _num(x: Any) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return float("nan")


def _hover(rows: pd.DataFrame) -> list[str]:
    return [f"trial {int(r.trial)}: {r.label}" for r in rows.itertuples()]


def _methods(rows: pd.DataFrame) -> pd.Series:
    """Each row's speculative method (the baseline's is none)."""
    if "param_method" in rows:
        return rows["param_method"].fillna("none").astype(str)
    return rows["label"].astype(str).str.split().str[0]


def _bounds(rows: pd.DataFrame, lo: str, hi: str) -> list[tuple[float, float]] | None:
    if lo not in rows or hi not in rows:
        return None
    return [(_num(a), _num(b)) for a, b in zip(rows[lo], rows[hi])]


def _current(rows: pd.DataFrame) -> pd.Series:
    """True for a row no re-measurement has superseded (its pooled record is drawn instead)."""
    if "superseded_by" not in rows:
        return pd.Series(True, index=rows.index)
    return rows["superseded_by"].isna()


def _holdout(rows: pd.DataFrame) -> pd.Series:
    """True for a holdout instance: measured after the choice for the figure's pairs, never a record."""
    if "role" not in rows:
        return pd.Series(False, index=rows.index)
    return rows["role"] == "holdout"


def _served(report: dict[str, Any]) -> tuple[float, float, float] | None:
    """The pick's served speedup and its interval, where `autotune confirm` ran."""
    sv = (report.get("best") or {}).get("served") or {}
    value = _num(sv.get("speedup"))
    return (value, _num(sv.get("speedup_lo")), _num(sv.get("speedup_hi"))) if value == value else None


def pick_why(report: dict[str, Any]) -> str:
    """Why the pick was picked, in a legend's words: lossless first, then the fastest correct."""
    best = report.get("best") or {}
    passed = report.get("lossless_first")
    if passed:
        return (f"lossless first: lossy #{passed['passed_over']} is faster, but its gain is not above "
                f"+{passed.get('min_gain', LOSSY_MIN_GAIN):.0%}")
    if best and Candidate(best.get("candidate") or {}).lossy:
        return "lossy, its gain over the best lossless config above the bar"
    return "the fastest correct config, lossless"


def pareto_chart(frame: pd.DataFrame, report: dict[str, Any]) -> Chart:
    """Primary objective against the second, each measured trial by method and standing; the pick and the
    baseline marked; superseded trials faded (their pooled re-measurement is the point that counts)."""
    objectives = list(report.get("objectives") or ["output_tok_s", "e2e_ms_p50"])
    if len(objectives) < 2:  # one objective has no trade-off: set it against median latency
        objectives.append("e2e_ms_p50" if objectives[0] != "e2e_ms_p50" else "output_tok_s")
    y, x = objectives[0], objectives[1]
    chart = Chart("pareto", f"Pareto front: {y} vs {x}", _axis(x), _axis(y))
    if x not in frame.columns or y not in frame.columns:
        chart.note = f"trials table has no column {x if x not in frame.columns else y}; results from an older autotune"
        return chart
    done = frame[(frame["state"] == "COMPLETE") & frame[x].map(_num).notna() & frame[y].map(_num).notna()]
    done = done.assign(method=_methods(done), current=_current(done) & ~_holdout(done))
    wrong = done["correct"].astype(str) != "True"
    if "slo_missed" in done:
        wrong |= done["slo_missed"].notna()
    front = done[(done["pareto"].astype(str) == "True") & done["current"]].sort_values(x)
    base = done[done["role"] == "baseline"]
    cand = done[(done["role"] != "baseline") & ~(_holdout(done) & (done["method"] == "none"))]
    groups = [Series("Pareto front (lossy and lossless)", front[x].tolist(), front[y].tolist(), kind="lines",
                     color=other_color(1))]
    for m, rows in cand.groupby("method", sort=True):
        ok, bad, old = rows[~wrong[rows.index] & rows["current"]], rows[wrong[rows.index] & rows["current"]], \
            rows[~rows["current"] & ~_holdout(rows)]
        after = rows[_holdout(rows)]
        groups += [Series(m, ok[x].tolist(), ok[y].tolist(), color=method_color(m), method=m, hover=_hover(ok)),
                   Series(f"{m}: wrong output or SLO missed", bad[x].tolist(), bad[y].tolist(), symbol="x", size=12,
                          color=method_color(m), method=m, hover=_hover(bad)),
                   Series(f"{m}: superseded by its re-measurement", old[x].tolist(), old[y].tolist(),
                          color=method_color(m), method=m, opacity=0.3, hover=_hover(old)),
                   Series(f"{m}: holdout instance (the figure's pairs, never a record)", after[x].tolist(),
                          after[y].tolist(), symbol="diamond-open", color=method_color(m), method=m, opacity=0.3,
                          hover=_hover(after))]
    groups.append(Series("baseline (no speculation)", base[x].tolist(), base[y].tolist(), symbol="star", size=18,
                         color=method_color("none"), method="none", text=["baseline"] * len(base),
                         hover=_hover(base)))
    pick = done[done["trial"] == (report.get("best") or {}).get("trial")]
    if not pick.empty:
        m = str(pick["method"].iloc[0])
        groups.append(Series(f"pick: {pick_why(report)}", pick[x].tolist(), pick[y].tolist(), symbol="circle-open",
                             size=22, color=method_color(m), method=m, text=["pick"], hover=_hover(pick)))
    chart.series = [s for s in groups if s.x]
    failed = int((frame["state"] == "FAIL").sum())
    if failed:
        chart.note = f"{failed} failed trial(s) have no measurement and are not drawn (see the table)."
    if report.get("lossless_first"):
        chart.note = f"{chart.note} Lossless first: {report['lossless_first']['reason']}.".strip()
    return chart


def speedup_chart(frame: pd.DataFrame, report: dict[str, Any] | None = None) -> Chart:
    """Best correct speedup for each speculative method and depth (num_speculative_tokens), with its 95%
    interval; the pick's served speedup beside it where `autotune confirm` ran."""
    chart = Chart("speedup", "Speedup over the baseline by method and depth",
                  "num_speculative_tokens (0: no speculation)",
                  f"speedup (x the baseline's output tok/s; {INTERVAL})", hline=(1.0, "baseline"))
    if "speedup_output_tok_s" not in frame.columns:
        chart.note = "No trial was measured against a baseline."
        return chart
    ok = frame[(frame["state"] == "COMPLETE") & (frame["correct"].astype(str) == "True")
               & frame["speedup_output_tok_s"].map(_num).notna() & _current(frame) & ~_holdout(frame)]
    depth = ok["param_num_speculative_tokens"].map(_num).fillna(0).astype(int) \
        if "param_num_speculative_tokens" in ok else pd.Series(0, index=ok.index)
    ok = ok.assign(method=_methods(ok), depth=depth, value=ok["speedup_output_tok_s"].map(_num))
    served, pick = _served(report or {}), ok[ok["trial"] == ((report or {}).get("best") or {}).get("trial")]
    beside = bool(served) and not pick.empty  # the pick drawn apart, its claim beside its served figure
    rest = ok[ok["label"] != pick["label"].iloc[0]] if beside else ok  # so its own bar is not drawn twice
    best = rest.loc[rest.groupby(["method", "depth"])["value"].idxmax()] if not rest.empty else rest
    chart.categories = [str(d) for d in sorted({*best["depth"], *pick["depth"]})]
    for m, rows in best.groupby("method", sort=True):
        chart.series.append(Series(str(m), [str(d) for d in rows["depth"]], rows["value"].tolist(), kind="bar",
                                   color=method_color(str(m)), method=str(m),
                                   error=_bounds(rows, "speedup_output_tok_s_lo", "speedup_output_tok_s_hi"),
                                   hover=_hover(rows)))
    if beside:  # the claim (best.json's speedup) and what serving it measured, side by side
        m, at = str(pick["method"].iloc[0]), [str(pick["depth"].iloc[0])]
        c = ((report or {}).get("best") or {}).get("speedup") or {}
        claim = (_num(c.get("output_tok_s")), _num(c.get("output_tok_s_lo")), _num(c.get("output_tok_s_hi")))
        if claim[0] != claim[0]:  # an older best.json: the pick's row
            lo_hi = _bounds(pick, "speedup_output_tok_s_lo", "speedup_output_tok_s_hi") or [(float("nan"),) * 2]
            claim = (float(pick["value"].iloc[0]), *lo_hi[0])
        who = _hover(pick)
        chart.series += [Series("the pick, claimed by the study", at, [claim[0]], kind="bar", color=method_color(m),
                                method=m, error=[claim[1:]], hover=[f"{who[0]}: claimed {claim[0]:.2f}x"]),
                         Series("the pick, served (vllm bench serve)", at, [served[0]], kind="bar",
                                color=method_color(m), method=m, error=[served[1:]], hatch=True,
                                hover=[f"{who[0]}: served {served[0]:.2f}x"])]
    if not chart.series:
        chart.note = "No correct trial to compare."
    return chart


def prediction_chart(frame: pd.DataFrame, report: dict[str, Any] | None = None) -> Chart:
    """Each trial's forecast speedup (made before it ran) against the speedup it measured, both with their
    intervals; the pick's served speedup beside its claim where `autotune confirm` ran."""
    chart = Chart("prediction", "Predicted vs measured speedup",
                  f"predicted speedup, before the trial (x the baseline's output tok/s; {INTERVAL})",
                  f"measured speedup (x the baseline's output tok/s; {INTERVAL})")
    need = {"predicted_speedup", "speedup_output_tok_s"}
    rows = frame[(frame["state"] == "COMPLETE") & frame["predicted_speedup"].map(_num).notna() & ~_holdout(frame)
                 & frame["speedup_output_tok_s"].map(_num).notna()] if need <= set(frame.columns) else frame.iloc[:0]
    if rows.empty:
        chart.note = ("No trial carries a forecast (a study from before --strategy predict, or a method no replay "
                      "covers).")
        return chart
    rows = rows.assign(method=_methods(rows))
    for m, part in rows.groupby("method", sort=True):
        hover = [f"trial {int(r.trial)}: {r.label}: predicted {_num(r.predicted_speedup):.2f}x "
                 f"[{_num(r.predicted_lo):.2f}-{_num(r.predicted_hi):.2f}], "
                 f"measured {_num(r.speedup_output_tok_s):.2f}x"
                 for r in part.itertuples()]
        chart.series.append(Series(str(m), part["predicted_speedup"].map(_num).tolist(),
                                   part["speedup_output_tok_s"].map(_num).tolist(), color=method_color(str(m)),
                                   method=str(m), hover=hover, x_error=_bounds(part, "predicted_lo", "predicted_hi"),
                                   error=_bounds(part, "speedup_output_tok_s_lo", "speedup_output_tok_s_hi")))
    values = [*rows["predicted_speedup"].map(_num), *rows["speedup_output_tok_s"].map(_num)]
    served, pick = _served(report or {}), rows[rows["trial"] == ((report or {}).get("best") or {}).get("trial")]
    if served and not pick.empty:
        m = str(pick["method"].iloc[0])
        chart.series.append(Series("the pick, served (vllm bench serve)", [_num(pick["predicted_speedup"].iloc[0])],
                                   [served[0]], symbol="diamond", size=13, color=method_color(m), method=m,
                                   error=[served[1:]], text=["served"]))
        values.append(served[0])
    elif served:
        chart.note = "The pick carries no forecast: its served speedup is in the speedup chart."
    lo, hi = min(values) * 0.95, max(values) * 1.05
    chart.series.append(Series("predicted = measured", [lo, hi], [lo, hi], kind="lines", color=other_color(1)))
    return chart


def acceptance_chart(frame: pd.DataFrame, report: dict[str, Any] | None = None) -> Chart:
    """vLLM's per-position acceptance (accepted tokens at draft position i / drafts): one line per config
    (its current record: a selection round's pooled one, never a holdout instance), the highest
    acceptance first, the pick and the baseline (which drafts nothing) always."""
    chart = Chart("acceptance", "Acceptance by draft position", "draft position",
                  "share of drafts accepted at this position", y_range=(0, 1.05), x_integer=True)
    best = (report or {}).get("best") or {}
    done = frame[frame["state"] == "COMPLETE"]
    if "role" in done:
        done = done[done["role"] != "holdout"]
    rows = done[done["acceptance_by_pos"].notna() & (done["acceptance_by_pos"].astype(str).str.strip() != "")
                & _current(done)]
    if "acceptance_rate" in rows:
        rows = rows.sort_values("acceptance_rate", ascending=False)
    rows = rows.drop_duplicates("label").assign(method=_methods(rows))  # one line per config
    pick = rows[rows["trial"] == best.get("trial")]
    drawn = pd.concat([rows.head(MAX_ACCEPTANCE_LINES), pick]).drop_duplicates("trial")
    positions = 1
    for r in drawn.itertuples():
        by_pos = [float(v) for v in str(r.acceptance_by_pos).split()]
        positions = max(positions, len(by_pos))
        chart.series.append(Series(f"#{int(r.trial)} {r.label}" + (" (the pick)" if r.trial == best.get("trial") else ""),
                                   list(range(1, len(by_pos) + 1)), by_pos, kind="lines+markers", size=7,
                                   color=method_color(r.method), method=r.method))
    base = done[done["role"] == "baseline"] if "role" in done else done.iloc[:0]
    if chart.series and not base.empty:  # the reference: no speculation, nothing drafted or accepted
        chart.series.append(Series(f"#{int(base['trial'].iloc[0])} baseline (no speculation: nothing drafted)",
                                   list(range(1, positions + 1)), [0.0] * positions, kind="lines",
                                   color=method_color("none"), method="none"))
    if len(rows) > len(drawn):
        chart.note = (f"{len(drawn)} of {len(rows)} configs are drawn: the {MAX_ACCEPTANCE_LINES} with the highest "
                      "acceptance, and the pick.")
    if not chart.series:
        chart.note = "No speculative trial was measured."
    return chart


def category_chart(report: dict[str, Any]) -> Chart:
    """The pick's speedup over the baseline for each request category (best.json's by-category numbers)."""
    from autotune.results.text import category_table

    best = report.get("best") or {}
    chart = Chart("category", "Speedup of the pick by category", "request category",
                  f"ratio to the baseline's same category (> 1: better; {INTERVAL} over windows)",
                  hline=(1.0, "baseline"))
    rows = [r for r in category_table(best) if r["speedup"] is not None] if best.get("speedup_by_category") else []
    if not rows:
        chart.note = ("No pick to break down." if not best else
                      "The workload has no categories (a 'category' field per request; see README, Workloads).")
        return chart
    chart.categories = [r["category"] for r in rows]
    hover = [f"{r['category']}: {r['requests']} requests, {r['output_tok_s']:.1f} tok/s, "
             f"accepted length {_num(r['mean_accepted_length']):.2f}" for r in rows]
    # Bars are metrics, not methods: colours no method uses.
    bounds = [(_num(r.get("speedup_lo")), _num(r.get("speedup_hi"))) for r in rows]
    chart.series = [Series("output tok/s", chart.categories, [r["speedup"] for r in rows], kind="bar", hover=hover,
                           color=other_color(0), error=bounds if all(b == b for b, _ in bounds) else None),
                    Series("TPOT p50", chart.categories, [_num(r["tpot_speedup"]) for r in rows], kind="bar",
                           hover=hover, color=other_color(2))]
    chart.title += f": trial {best['trial']} {best['label']}"
    chart.note = ("Ratios of each category's medians on the pick's first engine; TPOT has no interval"
                  + ("." if chart.series[0].error else ", and results from before per-category windows none."))
    return chart


def importance_chart(results_dir: Path, report: dict[str, Any]) -> Chart:
    """Optuna's parameter importances for each objective, from the study storage saved in the folder."""
    chart = Chart("importance", "Parameter importances (Optuna PED-ANOVA)", "parameter",
                  "importance (sums to 1 per objective)", horizontal=True)
    db = results_dir / "study.db"
    if not db.is_file():  # --storage pointed elsewhere; a remote database is not opened from here
        chart.note = f"No Optuna storage in {results_dir} (the study used --storage {report.get('storage')})."
        return chart
    from autotune.study.importance import param_importances

    n, found, note = param_importances(db, report["study"], report.get("objectives") or [], MIN_TRIALS_FOR_IMPORTANCE)
    if found is None:
        chart.note = note
        return chart
    params = sorted({p for imp in found.values() for p in imp}, key=lambda p: -max(v.get(p, 0) for v in found.values()))
    chart.categories = params
    chart.series = [Series(name, params, [imp.get(p, 0.0) for p in params], kind="bar", color=other_color(i),
                           hover=[f"{p}: {imp.get(p, 0.0):.2f} of {name}'s importance" for p in params])
                    for i, (name, imp) in enumerate(found.items())]
    chart.note = (f"Over {n} first measurements (infeasible ones included: importance is about speed, not correctness; "
                  "selection rounds and holdout instances left out: they measure configs already counted).")
    return chart
