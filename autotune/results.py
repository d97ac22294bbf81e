"""Write a finished study to ``results/<study>/`` and read it back (no Optuna, no vLLM needed to read).

Files: the Optuna storage (study.db unless --storage points elsewhere), trials.csv and
trials.parquet (the same table), pareto.csv, best.json (the StudyReport: chosen candidate, engine
kwargs, measurement, verdict, speedup, vLLM version, platform), serve.sh and report.md.
`autotune report` adds report/ (HTML and PNG plots) from these files.
"""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from autotune import __version__
from autotune.candidate import Candidate
from autotune.errors import BadInput

SCHEMA_VERSION = 1


def _clean(x: Any) -> Any:
    """JSON without NaN (not valid JSON): NaN becomes null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def write_results(study: Any, results_dir: Path, *, settings: Any, platform: dict[str, Any],
                  objectives: list[str], storage_url: str) -> dict[str, Any]:
    """Write every results file for ``study``; return the StudyReport (what best.json holds)."""
    from autotune.export import command, serve_script
    from autotune.pareto import baseline_trial, pareto_trials, pick_best, speedup, trials_frame
    from autotune.storage import redact

    results_dir.mkdir(parents=True, exist_ok=True)
    frame = trials_frame(study)
    frame.to_csv(results_dir / "trials.csv", index=False)
    parquet_safe(frame).to_parquet(results_dir / "trials.parquet", engine="pyarrow", index=False)
    (frame[frame["pareto"]] if len(frame) else frame).to_csv(results_dir / "pareto.csv", index=False)
    base, best = baseline_trial(study), pick_best(study)

    def entry(t: Any) -> dict[str, Any]:
        cand = Candidate(t.user_attrs["candidate"])
        m = t.user_attrs["measurement"]
        return {"trial": t.number, "label": t.user_attrs["label"], "candidate": cand.params,
                "engine_kwargs": cand.engine_kwargs(settings), "measurement": m,
                "verdict": t.user_attrs["verdict"],
                "speedup": speedup(m, base.user_attrs["measurement"]) if base else None}

    report: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION, "autotune_version": __version__,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "study": study.study_name, "storage": redact(storage_url),
        "workload": study.user_attrs.get("workload"), "space": study.user_attrs.get("space"),
        "load": study.user_attrs.get("load"), "concurrency": study.user_attrs.get("concurrency"),
        "objectives": objectives,
        "platform": platform,
        "vllm_version": (base.user_attrs.get("vllm_version") if base else None) or platform.get("vllm"),
        "trials": {"finished": int(len(frame)),
                   "failed": int((frame["state"] == "FAIL").sum()) if len(frame) else 0},
        "baseline": entry(base) if base else None,
        "best": entry(best) if best else None,
        "pareto": [entry(t) for t in pareto_trials(study)],
    }
    report = _clean(report)
    (results_dir / "best.json").write_text(json.dumps(report, indent=2) + "\n")
    if best is not None:
        kw = report["best"]["engine_kwargs"]
        (results_dir / "serve.sh").write_text(serve_script(kw, platform=platform["platform"]))
        (results_dir / "serve.sh").chmod(0o755)
        report["serve_command"] = command(kw)
    (results_dir / "report.md").write_text(markdown(report, frame))
    return report


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
            out[col] = [None if _missing(v) else json.dumps(_clean(v)) for v in out[col]]
    return out


def markdown(report: dict[str, Any], frame: Any) -> str:
    """A short human report of the study."""
    lines = [f"# autotune study `{report['study']}`", "",
             f"Workload `{report['workload']}`, space `{report['space']}`, load {report.get('load')}, "
             f"vLLM {report['vllm_version']} on {report['platform']['platform']}.", ""]
    best = report.get("best")
    if best:
        s = best["speedup"] or {}
        lines += [f"**Best:** trial {best['trial']} `{best['label']}`: "
                  f"{best['measurement']['output_tok_s']:.1f} output tok/s, "
                  f"{(s.get('output_tok_s') or float('nan')):.2f}x the baseline; verdict: {best['verdict']['reason']}.", "",
                  "```", report.get("serve_command", ""), "```", ""]
    else:
        lines += ["**No feasible configuration was found.**", ""]
    cols = [c for c in ("trial", "label", "state", "output_tok_s", "e2e_ms_p50", "speedup_output_tok_s",
                        "acceptance_rate", "correct", "pareto", "failure") if c in frame.columns]
    if len(frame):
        lines.append(frame[cols].to_markdown(index=False))
    return "\n".join(lines) + "\n"


def load_report(results_dir: str | Path) -> dict[str, Any]:
    """Read ``best.json`` from a results folder (or the file itself)."""
    p = Path(results_dir)
    path = p / "best.json" if p.is_dir() else p
    if not path.is_file():
        raise BadInput(f"{path}: no such results file (expected results/<study>/best.json from `autotune search`)")
    try:
        report = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise BadInput(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
    if not isinstance(report, dict) or report.get("schema_version") != SCHEMA_VERSION:
        raise BadInput(f"{path}: key 'schema_version': expected {SCHEMA_VERSION}, "
                       f"got {report.get('schema_version') if isinstance(report, dict) else report!r}")
    return report
