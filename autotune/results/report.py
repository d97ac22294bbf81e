"""`autotune report`: an HTML page and PNG plots from a saved results folder.

Reads only what `autotune search` saved (best.json, trials.parquet or trials.csv, study.db), so it
runs on a machine without vLLM or a GPU: pandas and matplotlib. The page is one file to share: each
plot inline as SVG (its text kept as text, each point's details as a tooltip), no script and
nothing fetched, so it opens offline at a few hundred KB (plotly's JavaScript inlined made it 4.9 MB).
A PNG of each plot is written beside it. The plots are autotune.results.charts, drawn by
autotune.results.draw; the tables are autotune.results.table; the command is autotune.serve.export's,
the one `autotune export` prints.
"""

from __future__ import annotations

import html
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from autotune import __version__
from autotune.results.charts import (acceptance_chart, category_chart, importance_chart, pareto_chart,
                                     prediction_chart, speedup_chart)
from autotune.results.draw import to_png, to_svg
from autotune.results.table import category_html, trials_html
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


def _serve(report: dict[str, Any]) -> str:
    """The pick's command as `autotune export --format command` prints it, each added flag explained."""
    from autotune.serve.export import explained_command

    if not (report.get("best") or {}).get("engine_kwargs"):
        return ""
    return f"<h2>Serve the pick</h2>\n<pre class=\"command\">{html.escape(explained_command(report))}</pre>\n"


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>autotune report: {study}</title>
<style>body{{font-family:sans-serif;max-width:1200px;margin:1em auto;padding:0 1em;color:#222}}
.note{{color:#555;font-style:italic}} table{{border-collapse:collapse;font-size:13px}}
td,th{{border:1px solid #ccc;padding:2px 6px;text-align:right;white-space:nowrap}} td.t{{text-align:left;white-space:normal;min-width:7em}} th{{background:#f3f3f3;white-space:normal}} .wide{{overflow-x:auto}} code{{background:#f3f3f3}}
td[title]{{text-decoration:underline dotted;cursor:help}}
pre.command{{background:#f3f3f3;padding:.6em;white-space:pre-wrap;overflow-wrap:anywhere;font-size:12px}}
.chart svg{{max-width:100%;height:auto}}</style></head><body>
<h1>autotune report: study <code>{study}</code></h1>
{summary}{serve}{sections}<h2>Trials</h2>
<p class="note">Hover a verdict for the validator's full reason, a header for the trials.csv column.</p>
<div class="wide">{table}</div>
<p class="note">autotune {version}, report written {created} from the saved results; PNG copies: {pngs}.</p>
</body></html>
"""


def write_report(results_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Write ``report.html`` and one PNG per plot into ``out_dir`` (default RESULTS/report/); return their paths."""
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
            section = f'<div class="chart" id="chart-{c.slug}">\n{to_svg(c)}\n</div>\n' + section
            to_png(c, out / f"{c.slug}.png")
            written.append(out / f"{c.slug}.png")
            if c.slug == "category":  # the numbers behind the bars, acceptance among them
                section += category_html(report)
        else:
            section = f"<h2>{html.escape(c.title)}</h2>\n" + section
        sections.append(section)
    page = PAGE.format(study=html.escape(str(report.get("study"))), summary=_summary(report), serve=_serve(report),
                       sections="".join(sections), table=trials_html(frame, report), version=__version__,
                       created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                       pngs=", ".join(f'<a href="{p.name}">{p.name}</a>' for p in written) or "none")
    (out / "report.html").write_text(page, encoding="utf-8")
    return [out / "report.html", *written]
