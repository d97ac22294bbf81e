"""Draw a ``Chart`` (autotune.results.charts) with matplotlib: an SVG for the HTML page, a PNG beside it.

One drawing for both, so the page and the PNGs show the same thing. The SVG keeps its text as text
(small, and sharp at any zoom) and carries each point's and bar's ``hover`` as a tooltip (an SVG
``<title>``), so the page needs no script: it opens offline and stays small (plotly's JavaScript,
inlined, was 4.8 MB of a 4.9 MB page).

Error bars come from ``Series.error`` (y) and ``x_error`` (x), each a (lo, hi) pair of absolute values;
faded series at ``opacity``; hatched bars for a served figure; grouped bars centred on their category
among the series that have a bar there.
"""

from __future__ import annotations

import io
import math
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from autotune.results.method_colors import other_color

MARKERS = {"circle": "o", "star": "*", "diamond": "D", "x": "x", "circle-open": "o", "diamond-open": "D"}
SVG_NS, XLINK_NS = "http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink"
WIDTH_IN, HEIGHT_IN = 9.0, 5.4
BAR_ROW_IN = 0.28  # a horizontal bar's height: labels one under another never touch


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


def _bar_slots(chart: Any, bars: list[Any]) -> tuple[dict[tuple[int, str], float], float]:
    """Each (series, category)'s offset from its category's centre, and the bars' width: a category's
    bars side by side and centred, however many series have one there."""
    present = {c: [i for i, s in enumerate(bars) if c in s.x] for c in chart.categories or []}
    width = 0.8 / max([len(v) for v in present.values()] + [1])
    return {(i, c): (k - (len(ids) - 1) / 2) * width for c, ids in present.items() for k, i in enumerate(ids)}, width


def _draw_bars(ax: Any, chart: Any, tips: dict[str, Any]) -> None:
    bars = [s for s in chart.series if s.kind == "bar"]
    slots, width = _bar_slots(chart, bars)
    for i, s in enumerate(bars):
        where = [chart.categories.index(x) + slots[(i, x)] for x in s.x]
        spans = _spans(s.y, s.error)
        style = {"label": s.name, "color": _color(s, chart.series.index(s)), "alpha": s.opacity,
                 "hatch": "//" if s.hatch else None, "edgecolor": "white" if s.hatch else None}
        if chart.horizontal:
            drawn = ax.barh(where, s.y, width, xerr=list(spans) if spans else None, capsize=3 if spans else 0, **style)
        else:
            drawn = ax.bar(where, s.y, width, yerr=list(spans) if spans else None, capsize=3 if spans else 0, **style)
        for j, (patch, tip) in enumerate(zip(drawn.patches, s.hover or [])):
            patch.set_gid(f"{chart.slug}-bar-{i}-{j}")
            tips[patch.get_gid()] = tip
    names = chart.categories or []
    if chart.horizontal:  # the longest names read level, in a margin as wide as they need
        ax.set_yticks(range(len(names)), names)
        ax.invert_yaxis()  # the first category (the most important) on top
    else:
        ax.set_xticks(range(len(names)), names, rotation=30 if max(map(len, names), default=0) > 6 else 0)


def _draw_points(ax: Any, s: Any, i: int, gid: str, tips: dict[str, Any]) -> None:
    color, open_ = _color(s, i), s.symbol.endswith("-open")
    (line,) = ax.plot(s.x, s.y, label=s.name, color=color, linestyle="-" if "lines" in s.kind else "none",
                      marker=MARKERS.get(s.symbol, "o") if "markers" in s.kind else None,
                      markersize=s.size * (0.9 if s.symbol == "star" else 0.7), alpha=s.opacity,
                      markerfacecolor="none" if open_ else color, markeredgewidth=2 if open_ else 1)
    if s.hover and "markers" in s.kind:
        line.set_gid(gid)
        tips[gid] = list(s.hover)  # one per marker, in order
    yspans, xspans = _spans(s.y, s.error), _spans(s.x, s.x_error)
    if yspans or xspans:
        ax.errorbar(s.x, s.y, yerr=list(yspans) if yspans else None, xerr=list(xspans) if xspans else None,
                    fmt="none", ecolor=color, alpha=s.opacity, capsize=3, linewidth=1)
    for x, y, t in zip(s.x, s.y, s.text or []):
        if t:
            ax.annotate(t, (x, y), textcoords="offset points", xytext=(0, 9), ha="center", fontweight="bold")


def _draw(chart: Any) -> tuple[Any, dict[str, Any]]:
    """The chart as a matplotlib Figure (no browser, no display: a bare Figure renders with Agg), and
    the tooltips by SVG id: a bar's text, or a marker series' texts in order."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    rows = len(chart.categories or []) * max(1, sum(s.kind == "bar" for s in chart.series))
    height = max(HEIGHT_IN, 1.8 + BAR_ROW_IN * rows) if chart.horizontal else HEIGHT_IN
    fig = Figure(figsize=(WIDTH_IN, height), dpi=100, layout="constrained")
    ax = fig.subplots()
    tips: dict[str, Any] = {}
    if any(s.kind == "bar" for s in chart.series):
        _draw_bars(ax, chart, tips)
    for i, s in enumerate(chart.series):
        if s.kind != "bar":
            _draw_points(ax, s, i, f"{chart.slug}-points-{i}", tips)
    if chart.hline:
        (ax.axvline if chart.horizontal else ax.axhline)(chart.hline[0], linestyle="--", color="#555",
                                                         label=chart.hline[1])
    if chart.y_range:
        ax.set_ylim(*chart.y_range)
    if chart.x_integer:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.margins(0.08)  # room for the labels next to points at the edges
    x_title, y_title = (chart.y_title, chart.x_title) if chart.horizontal else (chart.x_title, chart.y_title)
    ax.set(title=chart.title, xlabel=x_title, ylabel=y_title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return fig, tips


def figure(chart: Any) -> Any:
    """The chart as a matplotlib Figure, as both the PNG and the SVG draw it."""
    return _draw(chart)[0]


def to_png(chart: Any, path: Path) -> None:
    """The chart as a PNG."""
    figure(chart).savefig(path)


def _title(element: Any, text: str) -> None:
    tip = ET.Element(f"{{{SVG_NS}}}title")
    tip.text = text
    element.insert(0, tip)


def to_svg(chart: Any) -> str:
    """The chart as an ``<svg>`` element to inline in HTML: text kept as text, ids unique to the chart
    (several charts share one page), no date (the same chart, the same bytes), each ``hover`` a tooltip."""
    import matplotlib

    fig, tips = _draw(chart)
    buf = io.BytesIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": chart.slug}):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    ET.register_namespace("", SVG_NS)
    ET.register_namespace("xlink", XLINK_NS)
    root = ET.fromstring(buf.getvalue())
    for group in root.iter(f"{{{SVG_NS}}}g"):
        tip = tips.get(group.get("id"))
        if isinstance(tip, str):
            _title(group, tip)
        elif tip:  # a marker series: matplotlib writes one <use> a marker, in order (missing values skipped)
            marks = list(group.iter(f"{{{SVG_NS}}}use"))
            if len(marks) == len(tip):
                for mark, text in zip(marks, tip):
                    _title(mark, text)
    return ET.tostring(root, encoding="unicode")
