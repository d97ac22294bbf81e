"""The report's tables in HTML, for people: numbers as they are read (1,116 tok/s, 2.89x), each trial's
verdict in words with its statistical detail as a tooltip, an empty cell as "—". Each header's tooltip
names the trials.csv (or best.json) key its column comes from."""

from __future__ import annotations

import html
import math
from typing import Any

import pandas as pd

from autotune.core.candidate import Candidate
from autotune.results.text import category_table, speedup_headers

EMPTY = "—"
# trials.csv column -> the header people read (the speedup columns are named by their baseline record).
TRIAL_COLUMNS = {"trial": "trial", "label": "config", "record": "record", "state": "state",
                 "output_tok_s": "output tok/s", "e2e_ms_p50": "e2e p50 ms", "speedup_output_tok_s": "speedup",
                 "speedup_over_first_baseline": "speedup", "acceptance_rate": "acceptance",
                 "mean_accepted_length": "accepted length", "acceptance_by_pos": "acceptance by position",
                 "verdict": "verdict", "pareto": "Pareto", "failure": "failure"}
STATES = {"COMPLETE": "measured", "FAIL": "failed", "PRUNED": "pruned", "RUNNING": "running", "WAITING": "waiting"}
MAX_CELL = 80  # a longer text is cut in its cell, whole in its tooltip


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v)) or (isinstance(v, str) and v.strip() in ("", "None"))


def number(v: Any) -> str:
    """A figure as people read it: thousands separated, three significant digits or the whole number:
    1,116 / 295 / 16.3 / 2.89; "—" where there is none."""
    try:
        x = float(v)
    except (TypeError, ValueError):
        return EMPTY if _missing(v) else str(v)
    if not math.isfinite(x):
        return EMPTY
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.1f}" if abs(x) >= 10 else f"{x:.2f}"


def speedup(v: Any, lo: Any = None, hi: Any = None) -> str:
    """``2.89x [1.46-5.71]``: a ratio and, where it has one, its 95% interval."""
    if number(v) == EMPTY:
        return EMPTY
    bounds = f" [{number(lo)}-{number(hi)}]" if EMPTY not in (number(lo), number(hi)) else ""
    return f"{number(v)}x{bounds}"


def _params(row: dict[str, Any]) -> dict[str, Any]:
    return {k.removeprefix("param_"): v for k, v in row.items() if k.startswith("param_") and not _missing(v)}


def verdict_words(row: dict[str, Any], baseline_label: str | None) -> tuple[str, str]:
    """A trial's verdict as a person states it ("correct (lossless)", "wrong: greedy mismatch"), and
    the validator's full reason (thresholds, tests, p-values) for its tooltip ("" where it adds nothing)."""
    state, reason = row.get("state"), "" if _missing(row.get("verdict")) else str(row["verdict"])
    detail = "" if reason == "ok" else reason
    if state != "COMPLETE":
        return STATES.get(str(state), str(state).lower()), ""
    if row.get("status") == "unverified":
        words = "unverified: a check that applies did not run"
    elif row.get("status") == "failed" or str(row.get("correct")) == "False":
        words = "wrong: " + _clip(reason.split(" (")[0].split("; ")[0], 60)
    elif baseline_label is not None and row.get("label") == baseline_label:
        words = "correct (lossless: the reference)"
    else:
        words = "correct (lossy: drift within the budget)" if Candidate(_params(row)).lossy else "correct (lossless)"
    if not _missing(row.get("slo_missed")):
        words += f"; SLO missed: {row['slo_missed']}"
    return words, detail


def _clip(text: str, n: int = MAX_CELL) -> str:
    return text if len(text) <= n else text[:n - 1].rstrip() + "…"


TEXT_COLUMNS = ("label", "record", "verdict", "failure", "category", "acceptance_by_pos")  # left-aligned, wrapped


def _cell(text: str, tip: str = "", col: str = "") -> str:
    title = f' title="{html.escape(tip)}"' if tip and tip != text else ""
    kind = ' class="t"' if col in TEXT_COLUMNS else ""
    return f"<td{kind}{title}>{html.escape(text)}</td>"


def _table(headers: list[tuple[str, str]], rows: list[list[str]]) -> str:
    """An HTML table: ``headers`` as (shown, the key it comes from), ``rows`` of ready ``<td>`` cells."""
    head = "".join(f'<th title="{html.escape(key)}">{html.escape(shown)}</th>' for shown, key in headers)
    body = "".join(f"<tr>{''.join(r)}</tr>\n" for r in rows)
    return f'<table class="data">\n<thead><tr>{head}</tr></thead>\n<tbody>\n{body}</tbody></table>\n'


def _trial_cell(col: str, row: dict[str, Any], baseline_label: str | None) -> str:
    v = row.get(col)
    if col == "verdict":
        return _cell(*verdict_words(row, baseline_label), col=col)
    if col == "speedup_output_tok_s":
        return _cell(speedup(v, row.get(f"{col}_lo"), row.get(f"{col}_hi")))
    if col == "speedup_over_first_baseline":
        return _cell(speedup(v))
    if col == "trial":
        return _cell(str(int(v)))
    if col == "state":
        return _cell(STATES.get(str(v), str(v).lower()))
    if col == "pareto":
        return _cell("yes" if str(v) == "True" else "")
    if col in ("output_tok_s", "e2e_ms_p50", "acceptance_rate", "mean_accepted_length"):
        return _cell(number(v))
    if col == "acceptance_by_pos":
        return _cell(" ".join(number(x) for x in str(v).split()) if not _missing(v) else EMPTY, col=col)
    text = EMPTY if _missing(v) else str(v)
    return _cell(_clip(text), text, col)


def trials_html(frame: pd.DataFrame, report: dict[str, Any]) -> str:
    """The trials table: one row a trial, its record, its figures and its verdict."""
    cols = [c for c in TRIAL_COLUMNS if c in frame.columns]
    named = speedup_headers(report, frame)
    headers = [(named.get(c, TRIAL_COLUMNS[c]), c) for c in cols]
    base = (report.get("baseline") or {}).get("label")
    rows = [[_trial_cell(c, row, base) for c in cols] for row in frame.to_dict("records")]
    return _table(headers, rows)


CATEGORY_COLUMNS = {"category": "category", "requests": "requests", "output_tok_s": "output tok/s",
                    "speedup": "speedup (95% interval)", "tpot_ms_p50": "TPOT p50 ms", "tpot_speedup": "TPOT ratio",
                    "mean_accepted_length": "accepted length", "acceptance_rate": "acceptance"}


def category_html(report: dict[str, Any]) -> str:
    """The pick's numbers by request category, the category chart's bars among them."""
    rows = [[_cell(str(r["category"]), col="category"), _cell(str(r["requests"])), _cell(number(r["output_tok_s"])),
             _cell(speedup(r["speedup"], r.get("speedup_lo"), r.get("speedup_hi"))),
             _cell(number(r["tpot_ms_p50"])), _cell(speedup(r["tpot_speedup"])),
             _cell(number(r["mean_accepted_length"])), _cell(number(r["acceptance_rate"]))]
            for r in category_table(report["best"])]
    return _table([(shown, key) for key, shown in CATEGORY_COLUMNS.items()], rows)
