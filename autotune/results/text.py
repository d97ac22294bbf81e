"""Plain text from best.json: report.md, and the one-line summaries the console and report.md share."""

from __future__ import annotations

import math
from typing import Any

from autotune.core.candidate import schedule_text
from autotune.measure.resolution import Resolution


def _iv(s: dict[str, Any]) -> str:
    """The speedup's 95% interval and its unit (autotune.measure.intervals), where it has one."""
    lo, hi = s.get("output_tok_s_lo"), s.get("output_tok_s_hi")
    if not isinstance(lo, (int, float)) or not isinstance(hi, (int, float)) or lo != lo:
        return ""
    unit = s.get("output_tok_s_unit") or ("paired instances" if s.get("output_tok_s_pairs") else "windows")
    return f" [{lo:.2f}-{hi:.2f}] (95% interval over {unit})"


def _at(report: dict[str, Any]) -> str:
    """The load a figure is at, as a clause."""
    load = (report.get("figure") or {}).get("load") or report.get("load")
    return f" at {load}" if load else ""


def claim_line(report: dict[str, Any]) -> str | None:
    """The pick's measured ratio, named as what it is: the evidence it was chosen on (the claim), not a
    figure to bet on (it chose the pick, so it carries the winner's curse)."""
    best = report.get("best") or {}
    s = best.get("speedup") or {}
    if not isinstance(s.get("output_tok_s"), (int, float)):
        return None
    sel = report.get("selection") or {}
    why = f"; chosen: {sel['why']}" if sel.get("why") else ""
    return (f"claimed: {s['output_tok_s']:.2f}x{_iv(s)} the baseline's output tok/s{_at(report)}, the selection "
            f"phase's measured ratio (the evidence trial {best['trial']} was chosen on, not its figure){why}")


def stopped_line(report: dict[str, Any]) -> str | None:
    """Why the strategy stopped before its budget, counted in candidates; None where it did not."""
    strategy = report.get("strategy") or {}
    if not strategy.get("stopped"):
        return None
    n = strategy.get("candidates") or report["trials"]["finished"]  # before issue 53: every trial
    return f"{strategy['name']}: stopped after {n} candidates: {strategy['stopped']}"


def headline(report: dict[str, Any]) -> str | None:
    """The ``best:`` line: the pick and its figure (from measurements after the choice: the holdout, or
    confirm's served rounds), its unit, resolution and load; or why it has no figure. One wording for the
    console, report.md and the HTML report."""
    best = report.get("best")
    if not best:
        return None
    f = report.get("figure") or {}
    who = f"best: trial {best['trial']} {best['label']}"
    # a pick that loses to the baseline at a measured level says so where its figure is read
    verdict = f"; verdict {best['verdict']['reason']}" + level_losses(best.get("speedup") or {})
    if f.get("status") == "measured":
        iv = f" [{f['lo']:.2f}-{f['hi']:.2f}]" if f.get("lo") is not None and f.get("hi") is not None else ""
        how = ("served: vllm serve + vllm bench serve, after the choice" if f.get("source") == "served" else
               "the pick and the baseline on fresh engines side by side, after the choice, which they could not change")
        res = f.get("resolution")
        stop = f"; {f['stopped']}" if f.get("stopped") else ""
        return (f"{who}: {f['speedup']:.2f}x{iv} the baseline's output tok/s{_at(report)} (95% t-interval over "
                f"{f['pairs']} {f.get('unit') or 'pairs'}: {how}"
                + (f"; resolves +-{res:.0%}" if isinstance(res, (int, float)) else "") + f"{stop}){verdict}")
    if f.get("status") == "pending":
        return f"pick: trial {best['trial']} {best['label']}: its figure comes from {f.get('why')}{verdict}"
    why = f.get("why") or "no holdout was measured (a study from before round 5, or --no-remeasure)"
    return f"{who}: no figure ({why}); no interval here is its speedup{verdict}"


def markdown(report: dict[str, Any], frame: Any) -> str:
    """A short human report of the study."""
    lines = [f"# autotune study `{report['study']}`", "",
             f"Workload `{report['workload']}`, space `{report['space']}`, load {report.get('load')}, "
             f"vLLM {report['vllm_version']} on {report['platform']['platform']}.", ""]
    best = report.get("best")
    if best:
        lines += [f"**{headline(report)}.**", ""]
        if claim := claim_line(report):
            lines += [claim + ".", ""]
        lines += ["```", _serve_command(report).rstrip("\n"), "```", ""]
    else:
        lines += ["**No feasible configuration was found.**", ""]
    if report.get("resolution"):
        lines += [Resolution(**report["resolution"]).line() + ".", ""]
    if report.get("schedule"):
        lines += [f"**{schedule_line(report['schedule'])}**", ""]
    if len(frame):
        lines.append(trials_markdown(frame, report))
    if best and best.get("speedup_by_category"):
        lines += ["", f"## By category: trial {best['trial']} `{best['label']}` against the baseline", "",
                  _markdown_table(category_table(best))]
    return "\n".join(lines) + "\n"


def _serve_command(report: dict[str, Any]) -> str:
    """The pick's command as `autotune export` prints it (autotune.serve.export: what runs where the study
    ran, each added flag explained); an older best.json's ``serve_command`` where engine kwargs are missing."""
    from autotune.serve.export import explained_command

    if not (report.get("best") or {}).get("engine_kwargs"):
        return report.get("serve_command", "")
    return explained_command(report)


def speedup_headers(report: dict[str, Any], frame: Any) -> dict[str, str]:
    """The trials table's speedup columns, each named by the baseline record it is over: the baseline's
    current record (as the Pareto table and best.json), and its first engine (as the console's trial lines)."""
    base = (report.get("baseline") or {}).get("trial")
    first = frame.loc[frame["role"] == "baseline", "trial"] if "role" in frame.columns else []
    return {"speedup_output_tok_s": f"speedup over #{base}" if base is not None else "speedup",
            "speedup_over_first_baseline": f"over #{int(first.iloc[0])} (console)" if len(first) else "over trial 0"}


def trials_markdown(frame: Any, report: dict[str, Any]) -> str:
    """report.md's trials table: one row a trial, its record named (first engine, pooled, holdout)."""
    cols = [c for c in ("trial", "label", "record", "state", "output_tok_s", "e2e_ms_p50", "speedup_output_tok_s",
                        "speedup_over_first_baseline", "acceptance_rate", "correct", "status", "pareto", "failure")
            if c in frame.columns]
    return frame[cols].rename(columns=speedup_headers(report, frame)).to_markdown(index=False)


def category_table(e: dict[str, Any]) -> list[dict[str, Any]]:
    """A report entry's per-category numbers and speedups, one dict a category, biggest gain first."""
    cats, sp = e["measurement"].get("by_category") or {}, e.get("speedup_by_category") or {}
    out = [{"category": name, "requests": m.get("requests"), "output_tok_s": m.get("output_tok_s"),
            "speedup": (sp.get(name) or {}).get("output_tok_s"),
            "speedup_lo": (sp.get(name) or {}).get("output_tok_s_lo"),
            "speedup_hi": (sp.get(name) or {}).get("output_tok_s_hi"), "tpot_ms_p50": m.get("tpot_ms_p50"),
            "tpot_speedup": (sp.get(name) or {}).get("tpot_ms_p50"),
            "mean_accepted_length": m.get("mean_accepted_length"), "acceptance_rate": m.get("acceptance_rate")}
           for name, m in cats.items()]
    return sorted(out, key=lambda r: -r["speedup"] if isinstance(r["speedup"], (int, float)) else math.inf)


def _markdown_table(records: list[dict[str, Any]]) -> str:
    import pandas as pd

    return pd.DataFrame(records).to_markdown(index=False, floatfmt=".3g")


def edge_line(e: dict[str, Any], label: str) -> str:
    """One of best.json's ``edge`` entries in one line."""
    gain = e["forecast"] / e["pick_forecast"] if e.get("pick_forecast") else None
    return (f"edge: {label} sits at the space's top {e['knob']} ({e['top']}); one step past it ({e['beyond']}) "
            f"the forecast is {e['forecast']:.2f}x [{e['lo']:.2f}-{e['hi']:.2f}]"
            + (f", {gain:.2f} of the pick's own forecast" if gain else "")
            + ("; a space that goes further may pay" if gain and gain > 1.03 else ""))


def schedule_line(s: dict[str, Any]) -> str:
    """best.json's ``schedule`` in one line: the ranges, the outcome, and why."""
    ranges = f" k={schedule_text(s['ranges'])}" if s.get("ranges") else ""
    checks = "; ".join(f"{c['level']} {c['ratio']:.2f}x [{c['lo']:.2f}-{c['hi']:.2f}] of {c['fixed']}"
                       for c in s.get("checks") or [])
    return f"depth schedule{ranges}: {s['status']}: {s['why']}" + (f" ({checks})" if checks else "")


def level_losses(speedup: dict[str, Any]) -> str:
    """The load levels, beyond the study's own, where a config's output tok/s was below the
    baseline's (best.json's ``output_tok_s@LEVEL`` ratios), as a clause for its line; "" where none.
    Speculation's gain shrinks as the batch grows: a pick that loses at a level the service sees
    must say so where its figure is read."""
    from autotune.measure.objectives import parse_key

    losses = [(level, r) for key, r in speedup.items()
              for metric, suffix, level in [parse_key(key)]
              if metric == "output_tok_s" and not suffix and level and isinstance(r, (int, float)) and r < 1]
    return "".join(f"; at {level} it is {r:.2f}x the baseline's output tok/s: slower there" for level, r in losses)
