"""`autotune report`: an HTML page and PNG plots from a saved results folder.

Reads only what `autotune search` saved (best.json, trials.parquet or trials.csv, study.db), so it
runs on a machine without vLLM or a GPU: pandas, plotly (HTML, its JS inlined so the page opens
offline) and matplotlib (PNGs; plotly's own image export, kaleido, downloads a browser).
The plots themselves are autotune.results.charts, drawn by autotune.results.draw.
"""

from __future__ import annotations

import html
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from autotune import __version__
from autotune.results.charts import (TABLE_COLUMNS, _category_table_html,
                             acceptance_chart, category_chart, importance_chart, pareto_chart, prediction_chart,
                             speedup_chart)
from autotune.results.draw import to_plotly, to_png
from autotune.results.text import speedup_headers
from autotune.core.errors import BadInput
from autotune.core.study_report import load_report


def load_trials(results_dir: Path) -> pd.DataFrame:
    """The trials table: trials.parquet (typed) or, from older results, trials.csv."""
    for name, read in (("trials.parquet", pd.read_parquet), ("trials.csv", pd.read_csv)):
        if (results_dir / name).is_file():
            try:
                frame = read(results_dir / name)
            except (ValueError, OSError) as e:  # pandas' and pyarrow's parse errors are ValueErrors
                raise BadInput(f"{results_dir / name}: not a readable trials table ({e})") from None
            missing = {"trial", "state", "role", "label", "pareto", "correct"} - set(frame.columns)
            if missing:
                raise BadInput(f"{results_dir / name}: expected columns {sorted(missing)} (a trials table "
                               "written by `autotune search`)")
            return frame
    raise BadInput(f"{results_dir}: no trials.parquet or trials.csv (expected results/<study>/ from `autotune search`)")


def _summary(report: dict[str, Any]) -> str:
    """The decision in words, as the console and report.md state it: the pick's figure (``best:``, the
    served one where confirm ran, with its resolution), the claim it was chosen on, the served verdict,
    the resolution."""
    from autotune.results.text import claim_line, headline
    from autotune.serve.served import served_line

    e = html.escape
    lines = [f"Workload <code>{e(str(report.get('workload')))}</code>, "
             f"space <code>{e(str(report.get('space')))}</code>, load {e(str(report.get('load')))}, vLLM {e(str(report.get('vllm_version')))} on "
             f"{e(str((report.get('platform') or {}).get('platform')))}; "
             f"{report['trials']['finished']} trials ({report['trials']['failed']} failed)."]
    best = report.get("best")
    if best:
        lines.append(f"<b>{e(headline(report) or '')}</b>")
        lines += [e(x) for x in (claim_line(report), served_line(report)) if x]
    else:
        lines.append("<b>No feasible configuration was found.</b>")
    if report.get("resolution"):
        from autotune.measure.resolution import Resolution

        lines.append(e(Resolution(**report["resolution"]).line()))
    return "".join(f"<p>{line}</p>\n" for line in lines)


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>autotune report: {study}</title>
<style>body{{font-family:sans-serif;max-width:1200px;margin:1em auto;padding:0 1em;color:#222}}
.note{{color:#555;font-style:italic}} table{{border-collapse:collapse;font-size:13px}}
td,th{{border:1px solid #ccc;padding:2px 6px;text-align:right}} code{{background:#f3f3f3}}</style>
<script>{plotly_js}</script></head><body>
<h1>autotune report: study <code>{study}</code></h1>
{summary}{sections}<h2>Trials</h2>
{table}
<p class="note">autotune {version}, report written {created} from the saved results; PNG copies: {pngs}.</p>
</body></html>
"""


def write_report(results_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Write ``report.html`` and one PNG per plot into ``out_dir`` (default RESULTS/report/); return their paths."""
    from plotly.offline import get_plotlyjs

    results_dir = Path(results_dir)
    if results_dir.is_file():  # best.json given: its folder holds the rest
        results_dir = results_dir.parent
    if not results_dir.is_dir():
        raise BadInput(f"{results_dir}: no such results folder (expected results/<study>/ from `autotune search`)")
    report = load_report(results_dir)
    frame = load_trials(results_dir)
    out = Path(out_dir) if out_dir is not None else results_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    charts = [pareto_chart(frame, report), speedup_chart(frame, report), prediction_chart(frame, report),
              acceptance_chart(frame, report),
              importance_chart(results_dir, report), category_chart(report)]
    written, sections = [], []
    for c in charts:
        section = f'<p class="note">{html.escape(c.note)}</p>\n' if c.note else ""
        if c.series:
            div = to_plotly(c).to_html(full_html=False, include_plotlyjs=False, div_id=f"plot-{c.slug}")
            section = div + "\n" + section
            to_png(c, out / f"{c.slug}.png")
            written.append(out / f"{c.slug}.png")
            if c.slug == "category":  # the numbers behind the bars, acceptance among them
                section += _category_table_html(report)
        else:
            section = f"<h2>{html.escape(c.title)}</h2>\n" + section
        sections.append(section)
    cols = [c for c in TABLE_COLUMNS if c in frame.columns]
    page = PAGE.format(study=html.escape(str(report.get("study"))), plotly_js=get_plotlyjs(),
                       summary=_summary(report), sections="".join(sections),
                       table=frame[cols].rename(columns=speedup_headers(report, frame)).to_html(
                           index=False, na_rep="", float_format=lambda v: f"{v:.3g}"),
                       version=__version__, created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                       pngs=", ".join(f'<a href="{p.name}">{p.name}</a>' for p in written) or "none")
    (out / "report.html").write_text(page, encoding="utf-8")
    return [out / "report.html", *written]
