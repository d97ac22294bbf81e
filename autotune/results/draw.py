"""Draw a ``Chart`` (autotune.results.charts): plotly for the HTML page, matplotlib for the PNGs.

Both draw the same data: error bars from ``Series.error`` (y) and ``x_error`` (x), each a (lo, hi)
pair of absolute values; faded series at ``opacity``; hatched bars for a served figure.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from autotune.results.method_colors import other_color

MARKERS = {"circle": "o", "star": "*", "diamond": "D", "x": "x", "circle-open": "o", "diamond-open": "D"}  # plotly -> matplotlib


def _color(s: Any, i: int) -> str:
    return s.color or other_color(i)


def _spans(ys: list[float], bounds: list[tuple[float, float]] | None) -> tuple[list[float], list[float]] | None:
    """(below, above) distances from each value to its interval's ends; 0 where an end is missing."""
    if not bounds:
        return None
    ok = lambda v: v is not None and math.isfinite(v)  # noqa: E731
    below = [y - lo if ok(lo) and ok(y) else 0.0 for y, (lo, _) in zip(ys, bounds)]
    above = [hi - y if ok(hi) and ok(y) else 0.0 for y, (_, hi) in zip(ys, bounds)]
    return below, above


def _plotly_error(ys: list[float], bounds: list[tuple[float, float]] | None) -> dict[str, Any] | None:
    spans = _spans(ys, bounds)
    if spans is None:
        return None
    return {"type": "data", "symmetric": False, "array": spans[1], "arrayminus": spans[0], "thickness": 1.2}


def to_plotly(chart: Any) -> Any:
    """The chart as a plotly figure (interactive, for the HTML page)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for i, s in enumerate(chart.series):
        color = _color(s, i)
        if s.kind == "bar":
            fig.add_bar(name=s.name, x=s.x, y=s.y, hovertext=s.hover, opacity=s.opacity,
                        error_y=_plotly_error(s.y, s.error),
                        marker={"color": color, "pattern_shape": "/" if s.hatch else ""})
            continue
        mode = s.kind + ("+text" if s.text and any(s.text) else "")
        fig.add_scatter(name=s.name, x=s.x, y=s.y, mode=mode, text=s.text, textposition="top center",
                        hovertext=s.hover, opacity=s.opacity, error_y=_plotly_error(s.y, s.error),
                        error_x=_plotly_error(s.x, s.x_error),
                        marker={"symbol": s.symbol, "size": s.size, "color": color}, line={"color": color})
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


def to_png(chart: Any, path: Path) -> None:
    """The chart as a PNG drawn by matplotlib (no browser, no display: a bare Figure renders with Agg)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(9, 5.4), dpi=100, layout="constrained")
    ax = fig.subplots()
    bars = [s for s in chart.series if s.kind == "bar"]
    width = 0.8 / max(len(bars), 1)
    for i, s in enumerate(chart.series):
        color = _color(s, i)
        if s.kind == "bar":  # grouped bars: offset each series within its category slot
            off = (bars.index(s) - (len(bars) - 1) / 2) * width
            spans = _spans(s.y, s.error)
            ax.bar([chart.categories.index(x) + off for x in s.x], s.y, width, label=s.name, color=color,
                   alpha=s.opacity, hatch="//" if s.hatch else None, edgecolor="white" if s.hatch else None,
                   yerr=list(spans) if spans else None, capsize=3 if spans else 0)
            continue
        open_ = s.symbol.endswith("-open")
        ax.plot(s.x, s.y, label=s.name, color=color, linestyle="-" if "lines" in s.kind else "none",
                marker=MARKERS.get(s.symbol, "o") if "markers" in s.kind else None, markersize=s.size * (0.9 if s.symbol == "star" else 0.7),
                alpha=s.opacity, markerfacecolor="none" if open_ else color, markeredgewidth=2 if open_ else 1)
        yspans, xspans = _spans(s.y, s.error), _spans(s.x, s.x_error)
        if yspans or xspans:
            ax.errorbar(s.x, s.y, yerr=list(yspans) if yspans else None, xerr=list(xspans) if xspans else None,
                        fmt="none", ecolor=color, alpha=s.opacity, capsize=3, linewidth=1)
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
