"""Write a finished study to ``results/<study>/`` and read it back (no Optuna, no vLLM needed to read).

Files: the Optuna storage (study.db unless --storage points elsewhere), trials.csv and
trials.parquet (the same table), pareto.csv, best.json (the StudyReport: chosen candidate, engine
kwargs, measurement, verdict, speedup, vLLM version, platform), serve.sh and report.md; for a
workload with categories, by_category.csv (one row per measured trial and category).
`autotune report` adds report/ (HTML and PNG plots) from these files.
"""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune import __version__

from autotune.core import attrs
from autotune.core.candidate import Candidate
from autotune.measure.categories import category_speedup
from autotune.core.study_report import SCHEMA_VERSION, StudyReport, clean, dumps
from autotune.results.text import markdown

if TYPE_CHECKING:
    from autotune.study.view import StudyView


def _entry(view: StudyView, t: Any, settings: Any) -> dict[str, Any]:
    """One trial as best.json shows it: candidate, engine kwargs, measurement, verdict, speedup (over the
    baseline's current record, trial ``speedup_over``; 1 for the baseline's own config), what its record is."""
    from autotune.study.pareto import record_kind, record_speedup

    base = view.reference
    cand = Candidate(t.user_attrs[attrs.CANDIDATE])
    if t.state.name != "COMPLETE":  # a failed trial (only the deployed entry can be one)
        return {"trial": t.number, "label": t.user_attrs[attrs.LABEL], "candidate": cand.params,
                "failure": t.user_attrs.get(attrs.FAILURE, "unknown")}
    m = t.user_attrs[attrs.MEASUREMENT]
    base_m = base.user_attrs[attrs.MEASUREMENT] if base else None
    e = {"trial": t.number, "label": t.user_attrs[attrs.LABEL], "candidate": cand.params,
         "engine_kwargs": cand.engine_kwargs(settings), "measurement": m, "verdict": t.user_attrs[attrs.VERDICT],
         "speedup": record_speedup(view, t) if base_m else None, "speedup_over": base.number if base_m else None,
         "record": record_kind(view, t), "engines": len(view.record_chain(t)),
         "predicted": t.user_attrs.get(attrs.PREDICTED), "planned": t.user_attrs.get(attrs.PLANNED)}
    if "by_category" in m and base_m:  # which kinds of request gain, which lose
        e["speedup_by_category"] = category_speedup(m["by_category"], base_m.get("by_category", {}))
    return e


def _remeasured(view: StudyView, pick: Any, base: Any) -> dict[str, Any] | None:
    """The pick's speedup interval from its first engine alone and from the pooled fresh-engine
    re-measurements (the pick's and the baseline's): how much the spread between instances adds."""
    from autotune.measure.metrics import ratio_interval

    if pick is None or base is None or attrs.REMEASURE_OF not in pick.user_attrs:
        return None
    first, base_first = view.first_record(pick), view.first_record(base)
    of = first.number
    key = "output_tok_s_windows"
    one = ratio_interval(attrs.measurement(first).get(key, []), attrs.measurement(base_first).get(key, []))
    both = ratio_interval(attrs.measurement(pick).get(key, []), attrs.measurement(base).get(key, []))
    width = lambda iv: iv[1] - iv[0]  # noqa: E731
    return {"trial": of, "by": pick.number, "baseline_by": base.number if base.number != base_first.number else None,
            "interval_one_engine": list(one), "interval_fresh_engines": list(both),
            "widening": width(both) / width(one) if width(one) > 0 else None}


def _resolution(view: StudyView, figure: dict[str, Any] | None) -> dict[str, Any] | None:
    """autotune.measure.resolution over the pick's figure (the holdout, once measured) and the selection's
    comparison with the runner-up (None: no measured figure)."""
    from autotune.measure.resolution import resolve
    if not figure or figure.get("status") != "measured":
        return None
    runner = (view.selected() or {}).get("runner_up")
    res = resolve(figure["speedup"], figure.get("lo"), figure.get("hi"), figure.get("pairs") or 0,
                  unit=figure.get("unit") or "", runner_up=runner)
    return res.to_dict() if res is not None else None


def _edge(view: StudyView, pick: Any, base: Any) -> list[dict[str, Any]] | None:
    from autotune.study.strategy import edge_report

    if pick is None or base is None or pick.number == base.number:
        return None
    return edge_report(view, pick) or None


def _stopped(view: StudyView, pick: Any) -> str | None:
    """Why the strategy stopped before the budget; the predict strategy's stop line read again from the
    final records (autotune.study.strategy.stop_line), so that it names what the tables show."""
    from autotune.forecast.policy import STOP_UNMEASURED
    from autotune.study.strategy import stop_line

    said = view.user_attrs.get(attrs.STOPPED)
    if isinstance(said, str) and said.startswith(STOP_UNMEASURED):
        return stop_line(view, pick) or said
    return said


def _lossless_first(choice: Any) -> dict[str, Any] | None:
    """The faster lossy trial the pick was chosen over, and why (None: no such trial)."""
    if choice is None or choice.passed_over is None:
        return None
    label, (lo, hi) = choice.passed_over.user_attrs[attrs.LABEL], choice.gain
    gain = (f"[{lo:.3f}, {hi:.3f}]x (95% interval)" if all(isinstance(x, float) and math.isfinite(x) for x in (lo, hi))
            else "with no interval (one paired round: its point lay at or under the line, see the selection)")
    return {"passed_over": choice.passed_over.number, "label": label, "gain_lo": lo, "gain_hi": hi,
            "min_gain": choice.min_gain,
            "reason": f"{label} is lossy and its gain over the best lossless config, {gain}, does not lie above "
                      f"1 + {choice.min_gain:.0%}: the lossless config is the pick"}


def study_report(view: StudyView, frame: Any, *, settings: Any, platform: dict[str, Any], objectives: list[str],
                 storage_url: str) -> StudyReport:
    """The StudyReport (what best.json holds) of a study, as read once (autotune.study.view.StudyView),
    and its trials table."""
    from autotune.study.figures import gate_pairs, pick_figure
    from autotune.study.pareto import choose, pareto_trials
    from autotune.study.schedule import scheduled_trial, verdict
    from autotune.study.storage import redact
    from autotune.results.started import started_report

    choice, base, deployed = choose(view), view.reference, view.deployed()
    # A depth schedule that held at every level is the pick; the fixed-depth choice is kept beside it.
    schedule = verdict(view)
    pick = scheduled_trial(view, schedule) or (choice.trial if choice else None)
    ua = view.user_attrs
    final = choice is not None and choice.final
    figure = pick_figure(view, view.first_record(pick), chosen=final) if pick is not None else None
    report: StudyReport = {
        "schema_version": SCHEMA_VERSION, "autotune_version": __version__,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "study": view.name, "storage": redact(storage_url),
        "workload": ua.get(attrs.WORKLOAD), "space": ua.get(attrs.SPACE),
        "load": ua.get(attrs.LOAD), "concurrency": ua.get(attrs.CONCURRENCY),
        "objectives": objectives, "platform": platform,
        "vllm_version": (base.user_attrs.get(attrs.VLLM_VERSION) if base else None) or platform.get("vllm"),
        "trials": {"finished": int(len(frame)), "failed": int((frame["state"] == "FAIL").sum()) if len(frame) else 0,
                   "pruned": int((frame["state"] == "PRUNED").sum()) if len(frame) else 0,
                   "left_out": view.left_out()},
        "baseline": _entry(view, base, settings) if base else None,
        "best": _entry(view, pick, settings) if pick else None,
        "pareto": [_entry(view, t, settings) for t in pareto_trials(view)],
        # A warm start's pick, re-measured in this run: `autotune check` compares the new pick with it.
        "deployed": _entry(view, deployed, settings) if deployed else None,
        "lossless_first": _lossless_first(choice),
        "remeasured": _remeasured(view, pick, base),
        # Forked or fresh, per engine instance of the pick and the baseline, and a line if they mix.
        "started": started_report(view, pick, base),
        # The pick's figure: its speedup over the baseline from the holdout alone (measured after the
        # choice, which it cannot change), or why there is none; `confirm` puts the served one here.
        "figure": figure,
        # The selection phase's end: the pick, the runner-up and the evidence between them.
        "selection": view.selected(),
        # A warm start's deployed config against the pick, over the same holdout rounds (`check`).
        "gate": gate_pairs(view, view.first_record(pick), float(ua.get(attrs.GATE_TOLERANCE, 0.05)))
        if pick is not None else None,
        # The figure's resolution, and the pick over the runner-up.
        "resolution": _resolution(view, figure),
        # The pick on an edge of the space, with the forecast one step past it (no engine).
        "edge": _edge(view, pick, base),
        # Two or more load levels: the depth per batch size, its checks, and whether it is the pick.
        "schedule": schedule,
        "warm_start": ua.get(attrs.WARM_START),
        # How candidates were chosen, and why the strategy stopped before the budget (if it did).
        # Each drafter's trace over the baseline (the forecasts' input): where it ran and how long, or why not.
        "strategy": {"name": ua.get(attrs.STRATEGY), "stopped": _stopped(view, pick), "candidates": len(view.finished),
                     **{name: {k: v for k, v in (ua.get(key) or {}).items() if k not in ("argmax", "traces")} or None
                        for name, key in (("draft_trace", attrs.DRAFT_TRACE), ("eagle3_trace", attrs.EAGLE3_TRACE),
                                          ("dflash_trace", attrs.DFLASH_TRACE))}},
    }
    return clean(report)


def write_results(study: Any, results_dir: Path, *, settings: Any, platform: dict[str, Any],
                  objectives: list[str], storage_url: str, serve_env: dict[str, str] | None = None) -> dict[str, Any]:
    """Write every results file for ``study`` (an Optuna study, read once here); return the StudyReport
    (what best.json holds). ``serve_env``: variables the pick's server needs (the CPU binding of
    tensor-parallel ranks)."""
    from autotune.serve.export import command, serve_script
    from autotune.study.pareto import trials_frame
    from autotune.study.view import StudyView

    view = StudyView.of(study)
    results_dir.mkdir(parents=True, exist_ok=True)
    frame = trials_frame(view)
    _latency_column(view, frame)
    frame["schema_version"] = SCHEMA_VERSION  # trials.csv's columns change with best.json's schema (core.study_report)
    frame.to_csv(results_dir / "trials.csv", index=False)
    parquet_safe(frame).to_parquet(results_dir / "trials.parquet", engine="pyarrow", index=False)
    (frame[frame["pareto"]] if len(frame) else frame).to_csv(results_dir / "pareto.csv", index=False)
    _write_by_category(view, view.reference, results_dir)
    report = study_report(view, frame, settings=settings, platform=platform, objectives=objectives,
                          storage_url=storage_url)
    if report["best"] is not None:
        kw = report["best"]["engine_kwargs"]
        if serve_env:
            report["serve_env"] = serve_env
        report["serve_command"] = command(kw, env=serve_env)
        (results_dir / "serve.sh").write_text(serve_script(kw, platform=platform["platform"], env=serve_env))
        (results_dir / "serve.sh").chmod(0o755)
    (results_dir / "best.json").write_text(dumps(report))
    (results_dir / "report.md").write_text(markdown(report, frame))
    return report


def _latency_column(view: StudyView, frame: Any) -> None:
    """trials.csv's ``latency_not_measured``: why a row's TPOT and ITL cells (and their speedup) are empty,
    where the trial's stream delivered tokens in bursts (autotune.measure.metrics.unresolved_latency)."""
    from autotune.measure.metrics import unresolved_latency

    if len(frame):
        frame["latency_not_measured"] = [unresolved_latency(attrs.measurement(view.trial(int(n))))
                                         for n in frame["trial"]]


def _write_by_category(view: StudyView, base: Any, results_dir: Path) -> None:
    """by_category.csv: each measured trial's metrics and speedups by request category."""
    import pandas as pd

    from autotune.measure.categories import COLUMNS, rows
    from autotune.study.trials import counts

    base_cats = base.user_attrs[attrs.MEASUREMENT].get("by_category") if base else None
    out = []
    for t in view.completed:
        cats = (t.user_attrs.get(attrs.MEASUREMENT) or {}).get("by_category")
        if cats and counts(t):
            out += rows(t.number, t.user_attrs.get(attrs.LABEL), t.user_attrs.get(attrs.ROLE, "candidate"), cats,
                        category_speedup(cats, base_cats) if base_cats else None)
    if out:
        pd.DataFrame(out, columns=list(COLUMNS)).to_csv(results_dir / "by_category.csv", index=False)


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def parquet_safe(frame: Any) -> Any:
    """A copy of ``frame`` that pyarrow stores faithfully.

    pyarrow turns dicts into structs (the union of all keys, ints widened to floats), lists into
    arrays, and rejects object columns of mixed types (an int next to a string), so such columns
    become JSON text: read back with ``json.loads``.
    """
    out = frame.copy()
    for col in out.columns:
        if out[col].dtype != object:
            continue
        kinds = {type(v) for v in out[col] if not _missing(v)}
        if kinds & {dict, list, tuple} or (len(kinds) > 1 and kinds != {int, float}):
            out[col] = [None if _missing(v) else json.dumps(clean(v)) for v in out[col]]
    return out


