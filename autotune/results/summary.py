"""The short summary a run ends with (issue 60): read in a minute, shared as it is.

At most ``MAX_LINES`` lines, none wider than ``WIDTH`` columns, each figure once: the pick and the one
command that serves it; the figure to quote (``quote:``: the holdout's, or confirm's served one) with
its interval and, in a few words, what it was measured on; the baseline it is over; whether it is
correct; what the study could not tell (a runner-up within the noise, latency it could not time, a
load where the pick loses). Until confirm ends, a pick that has no figure yet still carries a number:
the ratio it was chosen on, labelled as that evidence. A claim that differs from the figure by more
than the figure resolves says so plainly (autotune.serve.served.gap). Each figure's statistical basis
is one flag away (``--explain``), in report.md and in docs/reading-the-output.md.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from autotune.serve.served import DIFFER, claim_ratio, gap

WIDTH = 100
MAX_LINES = 12
LABEL = 10  # the labels' column: "quote:" and the rest, then the text
# Every row's label, in the order rows come (a reader of a saved console finds the summary's rows by them).
LABELS = ("result:", "pick:", "quote:", "claimed:", "chosen on:", "correct:", "not told:", "serve:", "more:")


def _x(v: float, lo: Any = None, hi: Any = None) -> str:
    return f"{v:.2f}x" + (f" [{lo:.2f}-{hi:.2f}]" if isinstance(lo, (int, float)) and isinstance(hi, (int, float))
                          and lo == lo else "")


def _basis(f: dict[str, Any]) -> str:
    """What a measured figure rests on, in a few words."""
    n = f.get("pairs")
    res = f" (+-{f['resolution']:.0%})" if isinstance(f.get("resolution"), (int, float)) else ""
    if f.get("source") == "served":
        return f"served: {n} rounds a side of vllm serve + vllm bench serve, after the choice{res}"
    return f"{n} holdout pairs on fresh engines, after the choice{res}"


def _claim(report: dict[str, Any]) -> tuple[float, Any, Any, str] | None:
    """The ratio the pick was chosen on, with its interval and unit."""
    s = (report.get("best") or {}).get("speedup") or {}
    if not isinstance(s.get("output_tok_s"), (int, float)):
        return None
    unit = s.get("output_tok_s_unit") or ("paired instances" if s.get("output_tok_s_pairs") else "windows")
    return s["output_tok_s"], s.get("output_tok_s_lo"), s.get("output_tok_s_hi"), str(unit)


def _correct(v: dict[str, Any]) -> str:
    """The verdict in a few words (its checks in report.md and best.json)."""
    if v.get("status", "ok" if v.get("passed") else "failed") != "ok":
        return f"no: {v.get('reason')}"
    n, same = v.get("greedy_requests") or 0, v.get("greedy_identical")
    if v.get("logprob_drift") is not None and (v.get("token_agreement") or 1) < 1 and not n == same:
        return f"yes, within the drift budget (token agreement {v.get('token_agreement', 0):.0%})"
    if n and same == n:
        return f"yes: lossless ({same} of {n} greedy outputs identical to the baseline's)"
    if n:
        return f"yes: lossless, every token the target's own ({n - (same or 0)} of {n} differ at near-ties)"
    return "yes" + (" (sampled requests: the distribution test passed)" if v.get("sampled_requests") else "")


def _untold(report: dict[str, Any]) -> list[str]:
    """What the study could not tell, each in one clause (at most two: the rest under --explain)."""
    from autotune.measure.metrics import unresolved_latency
    from autotune.results.text import level_losses

    best = report.get("best") or {}
    out = []
    ru = (report.get("resolution") or {}).get("runner_up") or {}
    if ru and ru.get("decided") is False:
        out.append(f"the runner-up {ru['label']} (trial {ru['trial']}) lies within the selection's noise")
    if losses := level_losses(best.get("speedup") or {}).lstrip("; "):
        out.append(losses)
    # said here unless a latency objective was left out, which the study said once as it happened
    timed = any(str(o).split("@")[0].startswith(("tpot", "itl")) for o in report.get("objectives") or [])
    if (latency := unresolved_latency(best.get("measurement") or {})) and not timed:
        out.append(latency)
    return out[:2]


def lines(report: dict[str, Any], out: Path, *, confirming: bool = False) -> list[tuple[str, str]]:
    """The summary as (label, text) rows, unwrapped. ``confirming``: `search --confirm` before its
    served rounds (the figure comes from them next)."""
    best, base = report.get("best"), report.get("baseline") or {}
    if not best:
        return [("result:", "no correct configuration was found: every candidate failed or was judged incorrect "
                            f"(trials.csv, report.md in {out})")]
    rows = [("pick:", f"trial {best['trial']} {best['label']}")]
    f = report.get("figure") or {}
    claim = _claim(report)
    at = f" at {f.get('load') or report.get('load')}" if (f.get("load") or report.get("load")) else ""
    over = f"over the baseline's output tok/s{at} ({base.get('label', 'none')})"
    if f.get("status") == "measured":
        rows.append(("quote:", f"{_x(f['speedup'], f.get('lo'), f.get('hi'))} {over}; {_basis(f)}"))
        if claim is not None and isinstance(f.get("lo"), (int, float)):
            # the served verdict's rule (claim / figure with both intervals), plainly, never "consistent"
            r, lo, hi = claim_ratio((f["speedup"], f.get("lo"), f.get("hi")), claim[:3])
            if gap(r, lo, hi, f.get("resolution") if isinstance(f.get("resolution"), (int, float)) else None)[0] == DIFFER:
                beyond = "more than the rounds after the choice resolve" if lo <= 1 <= hi else "beyond both intervals"
                rows.append(("claimed:", f"chosen on {_x(claim[0])}: {abs(r - 1):.0%} {'above' if r > 1 else 'below'} "
                                         f"the quoted figure, {beyond} (the selection ran {'high' if r > 1 else 'low'})"))
    else:
        baseline_pick = best.get("trial") == base.get("trial")  # its claim is 1.00x over itself
        if confirming or f.get("status") == "pending":
            quote = "not yet: the figure comes from confirm's served rounds, next"
        elif baseline_pick:
            quote = "no speedup: the pick is the baseline (no config measured faster)"
        else:
            quote = f"not yet: {f.get('why') or 'no holdout was measured'}; autotune confirm {out} measures the figure"
        rows.append(("quote:", quote))
        if claim is not None and not baseline_pick:
            rows.append(("chosen on:", f"{_x(*claim[:3])} {over}, over {claim[3]}: the evidence it was chosen "
                                       "on, not its figure (it runs high)"))
    rows.append(("correct:", _correct(best["verdict"])))
    if untold := _untold(report):
        rows.append(("not told:", "; ".join(untold)))
    rows.append(("serve:", f"bash {out / 'serve.sh'}   (the command: autotune export {out})"))
    rows.append(("more:", f"autotune report {out}; --explain prints each figure's basis"))
    return rows


def wrapped(rows: list[tuple[str, str]], width: int = WIDTH) -> list[str]:
    """The rows as printed: the label in its column, the text wrapped under itself, no line over ``width``."""
    out = []
    for label, text in rows:
        body = textwrap.wrap(text, width=max(width - LABEL - 1, 20), break_long_words=False, break_on_hyphens=False)
        for i, part in enumerate(body or [""]):
            out.append(f"{label if i == 0 else '':<{LABEL}} {part}".rstrip())
    return out


# Rows left out, in this order, where the summary would pass MAX_LINES (a long label or path): each is in
# report.md and under --explain.
OPTIONAL = ("more:", "not told:", "claimed:")


def printed_end(lines: list[str], rule: int) -> int:
    """In a console's lines, the index past the summary whose rule (``── study ──``) is ``lines[rule]``:
    its rows are a label of LABELS in its column, or a wrapped row's continuation under the text."""
    end = rule + 1
    while end < len(lines) and (lines[end].startswith(LABELS) or lines[end].startswith(" " * (LABEL + 1))):
        end += 1
    return end


def summary(report: dict[str, Any], out: Path, *, width: int = WIDTH, confirming: bool = False,
            max_lines: int = MAX_LINES) -> list[str]:
    """The printed summary: at most ``max_lines`` lines of at most ``min(width, WIDTH)`` columns."""
    rows = lines(report, out, confirming=confirming)
    width = min(width, WIDTH)
    for label in OPTIONAL:
        if len(wrapped(rows, width)) <= max_lines:
            break
        rows = [r for r in rows if r[0] != label]
    return wrapped(rows, width)[:max_lines]
