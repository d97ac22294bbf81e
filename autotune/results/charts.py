"""The report's plots: each described once as a ``Chart`` and drawn by plotly (HTML) and matplotlib (PNG).

From the saved trials table and StudyReport only (autotune.results.report reads them): the Pareto front,
speedup by method and depth, acceptance by position, parameter importances, speedup by category.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from autotune.measure.objectives import direction

MIN_TRIALS_FOR_IMPORTANCE = 4  # fewer completed trials say nothing about which knob matters
MAX_ACCEPTANCE_LINES = 10  # more lines than this are unreadable; the best by acceptance are kept
# One palette (matplotlib's tab10, plotly's D3) so a method has the same colour in the HTML and the PNG.
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
MARKERS = {"circle": "o", "star": "*", "diamond": "D", "x": "x"}  # plotly symbol -> matplotlib marker
TABLE_COLUMNS = ("trial", "label", "state", "output_tok_s", "e2e_ms_p50", "speedup_output_tok_s", "acceptance_rate",
                 "mean_accepted_length", "acceptance_by_pos", "correct", "status", "pareto", "verdict", "failure")


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


def pareto_chart(frame: pd.DataFrame, report: dict[str, Any]) -> Chart:
    """Primary objective against the second, each measured trial by its standing, the baseline marked."""
    objectives = list(report.get("objectives") or ["output_tok_s", "e2e_ms_p50"])
    if len(objectives) < 2:  # one objective has no trade-off: set it against median latency
        objectives.append("e2e_ms_p50" if objectives[0] != "e2e_ms_p50" else "output_tok_s")
    y, x = objectives[0], objectives[1]
    chart = Chart("pareto", f"Pareto front: {y} vs {x}", _axis(x), _axis(y))
    if x not in frame.columns or y not in frame.columns:
        chart.note = f"trials table has no column {x if x not in frame.columns else y}; results from an older autotune"
        return chart
    done = frame[(frame["state"] == "COMPLETE") & frame[x].map(_num).notna() & frame[y].map(_num).notna()]
    wrong = done["correct"].astype(str) != "True"
    if "slo_missed" in done:
        wrong |= done["slo_missed"].notna()
    front = done[done["pareto"].astype(str) == "True"].sort_values(x)
    base = done[done["role"] == "baseline"]
    best = (report.get("best") or {}).get("trial")
    groups = [  # drawn in this order: a wrong config as fast as the best stays visible on top of it
        Series("feasible", done[~wrong][x].tolist(), done[~wrong][y].tolist(), color="#1f77b4",
               hover=_hover(done[~wrong])),
        Series("Pareto front", front[x].tolist(), front[y].tolist(), kind="lines+markers", symbol="diamond", size=11,
               color="#d62728", text=["best" if t == best else "" for t in front["trial"]], hover=_hover(front)),
        Series("infeasible (wrong output or SLO missed)", done[wrong][x].tolist(), done[wrong][y].tolist(),
               symbol="x", size=12, color="#555555", hover=_hover(done[wrong])),
        Series("baseline (no speculation)", base[x].tolist(), base[y].tolist(), symbol="star", size=18, color="#000000",
               text=["baseline"] * len(base), hover=_hover(base)),
    ]
    chart.series = [s for s in groups if s.x]
    failed = int((frame["state"] == "FAIL").sum())
    if failed:
        chart.note = f"{failed} failed trial(s) have no measurement and are not drawn (see the table)."
    return chart


def speedup_chart(frame: pd.DataFrame) -> Chart:
    """Best correct speedup for each speculative method and depth (num_speculative_tokens)."""
    chart = Chart("speedup", "Speedup over the baseline by method and depth",
                  "num_speculative_tokens (0: no speculation)", "output tok/s / baseline (best correct trial)",
                  hline=(1.0, "baseline"))
    if "speedup_output_tok_s" not in frame.columns:
        chart.note = "No trial was measured against a baseline."
        return chart
    ok = frame[(frame["state"] == "COMPLETE") & (frame["correct"].astype(str) == "True")
               & frame["speedup_output_tok_s"].map(_num).notna()]
    method = ok["param_method"] if "param_method" in ok else ok["label"].str.split().str[0]
    depth = ok["param_num_speculative_tokens"].map(_num).fillna(0).astype(int) \
        if "param_num_speculative_tokens" in ok else pd.Series(0, index=ok.index)
    best = ok.assign(method=method, depth=depth).groupby(["method", "depth"])["speedup_output_tok_s"].max()
    best = best.reset_index()
    chart.categories = [str(d) for d in sorted(best["depth"].unique())]
    for m, rows in best.groupby("method", sort=False):
        chart.series.append(Series(str(m), [str(d) for d in rows["depth"]], rows["speedup_output_tok_s"].tolist(),
                                   kind="bar"))
    if not chart.series:
        chart.note = "No correct trial to compare."
    return chart


def prediction_chart(frame: pd.DataFrame) -> Chart:
    """Each trial's forecast speedup (made before it ran) against the speedup it measured."""
    chart = Chart("prediction", "Predicted vs measured speedup", "predicted output tok/s / baseline (before the trial)",
                  "measured output tok/s / baseline")
    need = {"predicted_speedup", "speedup_output_tok_s"}
    rows = frame[(frame["state"] == "COMPLETE") & frame["predicted_speedup"].map(_num).notna()
                 & frame["speedup_output_tok_s"].map(_num).notna()] if need <= set(frame.columns) else frame.iloc[:0]
    if rows.empty:
        chart.note = ("No trial carries a forecast (a study from before --strategy predict, or a method no replay "
                      "covers).")
        return chart
    method = rows["param_method"] if "param_method" in rows else rows["label"].str.split().str[0]
    for i, (m, part) in enumerate(rows.assign(method=method).groupby("method", sort=False)):
        hover = [f"trial {int(r.trial)}: {r.label}: predicted {_num(r.predicted_speedup):.2f}x "
                 f"[{_num(r.predicted_lo):.2f}-{_num(r.predicted_hi):.2f}], "
                 f"measured {_num(r.speedup_output_tok_s):.2f}x"
                 for r in part.itertuples()]
        chart.series.append(Series(str(m), part["predicted_speedup"].map(_num).tolist(),
                                   part["speedup_output_tok_s"].map(_num).tolist(), color=PALETTE[i % len(PALETTE)],
                                   hover=hover))
    values = [*rows["predicted_speedup"].map(_num), *rows["speedup_output_tok_s"].map(_num)]
    lo, hi = min(values) * 0.95, max(values) * 1.05
    chart.series.append(Series("predicted = measured", [lo, hi], [lo, hi], kind="lines", color="#7f7f7f"))
    return chart


def acceptance_chart(frame: pd.DataFrame) -> Chart:
    """vLLM's per-position acceptance (accepted tokens at draft position i / drafts) for each speculative trial."""
    chart = Chart("acceptance", "Acceptance by draft position", "draft position",
                  "share of drafts accepted at this position", y_range=(0, 1.05), x_integer=True)
    rows = frame[(frame["state"] == "COMPLETE") & frame["acceptance_by_pos"].notna()
                 & (frame["acceptance_by_pos"].astype(str).str.strip() != "")]
    if "acceptance_rate" in rows:
        rows = rows.sort_values("acceptance_rate", ascending=False)
    for r in rows.head(MAX_ACCEPTANCE_LINES).itertuples():
        by_pos = [float(v) for v in str(r.acceptance_by_pos).split()]
        chart.series.append(Series(f"#{int(r.trial)} {r.label}", list(range(1, len(by_pos) + 1)), by_pos,
                                   kind="lines+markers", size=7))
    if len(rows) > MAX_ACCEPTANCE_LINES:
        chart.note = f"The {MAX_ACCEPTANCE_LINES} trials with the highest acceptance of {len(rows)} are drawn."
    if not chart.series:
        chart.note = "No speculative trial was measured."
    return chart


def category_chart(report: dict[str, Any]) -> Chart:
    """The pick's speedup over the baseline for each request category (best.json's by-category numbers)."""
    from autotune.results.text import category_table

    best = report.get("best") or {}
    chart = Chart("category", "Speedup of the pick by category", "request category",
                  "ratio to the baseline's same category (> 1: better)", hline=(1.0, "baseline"))
    rows = [r for r in category_table(best) if r["speedup"] is not None] if best.get("speedup_by_category") else []
    if not rows:
        chart.note = ("No pick to break down." if not best else
                      "The workload has no categories (a 'category' field per request; see README, Workloads).")
        return chart
    chart.categories = [r["category"] for r in rows]
    hover = [f"{r['category']}: {r['requests']} requests, {r['output_tok_s']:.1f} tok/s, "
             f"accepted length {_num(r['mean_accepted_length']):.2f}" for r in rows]
    chart.series = [Series("output tok/s", chart.categories, [r["speedup"] for r in rows], kind="bar", hover=hover),
                    Series("TPOT p50", chart.categories, [_num(r["tpot_speedup"]) for r in rows], kind="bar",
                           hover=hover)]
    chart.title += f": trial {best['trial']} {best['label']}"
    return chart


def _category_table_html(report: dict[str, Any]) -> str:
    from autotune.results.text import category_table

    rows = category_table(report["best"])
    return pd.DataFrame(rows).to_html(index=False, na_rep="", float_format=lambda v: f"{v:.3g}") + "\n"


def importance_chart(results_dir: Path, report: dict[str, Any]) -> Chart:
    """Optuna's parameter importances for each objective, from the study storage saved in the folder."""
    chart = Chart("importance", "Parameter importances (Optuna PED-ANOVA)", "parameter",
                  "importance (sums to 1 per objective)")
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
    chart.series = [Series(name, params, [imp.get(p, 0.0) for p in params], kind="bar") for name, imp in found.items()]
    chart.note = f"Over {n} completed trials (infeasible ones included: importance is about speed, not correctness)."
    return chart


def to_plotly(chart: Chart) -> Any:
    """The chart as a plotly figure (interactive, for the HTML page)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for i, s in enumerate(chart.series):
        color = s.color or PALETTE[i % len(PALETTE)]
        if s.kind == "bar":
            fig.add_bar(name=s.name, x=s.x, y=s.y, hovertext=s.hover, marker_color=color)
            continue
        mode = s.kind + ("+text" if s.text and any(s.text) else "")
        fig.add_scatter(name=s.name, x=s.x, y=s.y, mode=mode, text=s.text, textposition="top center",
                        hovertext=s.hover, marker={"symbol": s.symbol, "size": s.size, "color": color},
                        line={"color": color})
    if chart.hline:
        fig.add_hline(y=chart.hline[0], line_dash="dash", line_color="#555", annotation_text=chart.hline[1])
    fig.update_layout(title=chart.title, xaxis_title=chart.x_title, yaxis_title=chart.y_title, barmode="group",
                      template="plotly_white", height=480, margin={"t": 60})
    if chart.categories is not None:
        fig.update_xaxes(type="category", categoryorder="array", categoryarray=chart.categories)
    if chart.y_range:
        fig.update_yaxes(range=list(chart.y_range))
    if chart.x_integer:
        fig.update_xaxes(dtick=1)
    return fig


def to_png(chart: Chart, path: Path) -> None:
    """The chart as a PNG drawn by matplotlib (no browser, no display: a bare Figure renders with Agg)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(9, 5.4), dpi=100, layout="constrained")
    ax = fig.subplots()
    bars = [s for s in chart.series if s.kind == "bar"]
    width = 0.8 / max(len(bars), 1)
    for i, s in enumerate(chart.series):
        color = s.color or PALETTE[i % len(PALETTE)]
        if s.kind == "bar":  # grouped bars: offset each series within its category slot
            off = (bars.index(s) - (len(bars) - 1) / 2) * width
            ax.bar([chart.categories.index(x) + off for x in s.x], s.y, width, label=s.name, color=color)
            continue
        ax.plot(s.x, s.y, label=s.name, color=color, linestyle="-" if "lines" in s.kind else "none",
                marker=MARKERS.get(s.symbol, "o"), markersize=s.size * (0.9 if s.symbol == "star" else 0.7))
        for x, y, t in zip(s.x, s.y, s.text or []):
            if t:
                ax.annotate(t, (x, y), textcoords="offset points", xytext=(0, 9), ha="center", fontweight="bold")
    if chart.categories is not None:
        ax.set_xticks(range(len(chart.categories)), chart.categories,
                      rotation=30 if max(map(len, chart.categories), default=0) > 6 else 0)
    if chart.hline:
        ax.axhline(chart.hline[0], linestyle="--", color="#555", label=chart.hline[1])
    if chart.y_range:
        ax.set_ylim(*chart.y_range)
    if chart.x_integer:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.margins(0.08)  # room for the labels next to points at the edges
    ax.set(title=chart.title, xlabel=chart.x_title, ylabel=chart.y_title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.savefig(path)
