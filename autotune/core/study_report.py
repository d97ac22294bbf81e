"""best.json, typed: the StudyReport a study writes (autotune.results.files) and every later command
reads (confirm, check, watch, export, serve, report).

The keys are declared here once. ``SCHEMA_VERSION`` goes up whenever a key is added, removed or
changes meaning; a reader accepts every version in ``READABLE`` (version 1 lacks ``resolution``,
``edge``, ``trials.pruned`` and ``best.served``, which readers take with ``.get``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, TypedDict

from autotune.core.errors import BadInput

# 2: resolution, edge, trials.pruned, best.served and served_vs_claimed declared (round 3).
# 3: round 4 (serving flags, platform checks, numerics, launcher starts, verdict intervals); readers
# of 3 still take 1 and 2 (`check` and `watch` compare a new run against a deployed older one).
# 4: round 5: ``figure`` (the pick's speedup from the holdout or the served rounds, measured after the
# choice), ``selection``, ``gate``; ``best.speedup`` is the pick's measured ratio (its claim, the
# evidence it was chosen on); trials.csv: ``round`` and ``holdout_of``. Readers of 4 take 1-3.
# Added within 4 (issue 53, no meaning changed): each entry's ``speedup_over`` (the baseline record its
# ``speedup`` is over), ``record`` and ``engines``; ``strategy.candidates``; trials.csv's ``speedup_over``,
# ``speedup_over_first_baseline`` (the console's ``measured``) and ``record``.
SCHEMA_VERSION = 4
READABLE = (1, 2, 3, 4)


class Entry(TypedDict, total=False):
    """One trial as best.json shows it (a failed deployed trial has only trial, label, candidate, failure)."""

    trial: int
    label: str
    candidate: dict[str, Any]
    engine_kwargs: dict[str, Any]
    measurement: dict[str, Any]
    verdict: dict[str, Any]
    speedup: dict[str, Any] | None  # ratios, their interval and its unit (output_tok_s_unit)
    speedup_over: int | None  # the baseline record (its trial) ``speedup`` is over: its current, pooled one
    record: str  # first engine, pooled over engines (selection rounds), or a holdout instance
    engines: int  # engine instances the record pools
    speedup_by_category: dict[str, Any]
    predicted: dict[str, Any] | None
    planned: str | None
    failure: str
    served: dict[str, Any]  # written by `autotune confirm`


class Trials(TypedDict, total=False):
    finished: int
    failed: int
    pruned: int
    left_out: list[str]


class StudyReport(TypedDict, total=False):
    schema_version: int
    autotune_version: str
    created: str
    study: str
    storage: str
    workload: str | None
    space: str | None
    load: str | None
    concurrency: int | None
    objectives: list[str]
    platform: dict[str, Any]
    vllm_version: str | None
    trials: Trials
    baseline: Entry | None
    best: Entry | None
    pareto: list[Entry]
    deployed: Entry | None
    lossless_first: dict[str, Any] | None
    remeasured: dict[str, Any] | None
    started: dict[str, Any] | None  # autotune.results.started: forked/fresh per engine instance, "mixed" line
    resolution: dict[str, Any] | None
    figure: dict[str, Any] | None  # the pick's figure: holdout or served (autotune.study.figures), or why none
    selection: dict[str, Any] | None  # the final choice (autotune.study.select): runner-up, evidence, why
    gate: dict[str, Any] | None  # the pick against a deployed config over the holdout rounds (autotune check)
    edge: list[dict[str, Any]] | None
    schedule: dict[str, Any] | None
    warm_start: str | None
    strategy: dict[str, Any]
    serve_command: str
    serve_env: dict[str, str]  # what the pick's server needs in its environment (the CPU binding of its ranks)
    served_vs_claimed: str | None  # written by `autotune confirm`


# What every reader needs; a file without one of them is not a StudyReport.
REQUIRED = ("schema_version", "best")
LATER = ("served_vs_claimed",)  # keys only a later command adds


def clean(x: Any) -> Any:
    """JSON without NaN (not valid JSON): NaN and infinities become null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean(v) for v in x]
    return x


def load_report(results_dir: str | Path) -> StudyReport:
    """Read ``best.json`` from a results folder (or the file itself); a wrong file is one line of bad input."""
    p = Path(results_dir)
    path = p / "best.json" if p.is_dir() else p
    if not path.is_file():
        raise BadInput(f"{path}: no such results file (expected results/<study>/best.json from `autotune search`)")
    try:
        report = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise BadInput(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
    if not isinstance(report, dict) or report.get("schema_version") not in READABLE:
        raise BadInput(f"{path}: key 'schema_version': expected one of {', '.join(map(str, READABLE))}, "
                       f"got {report.get('schema_version') if isinstance(report, dict) else report!r}")
    missing = [k for k in REQUIRED if k not in report]
    if missing:
        raise BadInput(f"{path}: key {missing[0]!r}: missing (a best.json written by `autotune search` has it)")
    unknown = sorted(set(report) - set(StudyReport.__annotations__))
    if unknown and report["schema_version"] == SCHEMA_VERSION:
        raise BadInput(f"{path}: key {unknown[0]!r}: not a key of schema version {SCHEMA_VERSION}")
    return report  # type: ignore[return-value]


def with_served(report: StudyReport, served: dict[str, Any], line: str | None) -> StudyReport:
    """A copy of ``report`` with the pick's served numbers (``best.served``) and the one-line verdict."""
    best: Entry = {**(report.get("best") or {}), "served": clean(served)}  # type: ignore[typeddict-item]
    return {**report, "best": best, "served_vs_claimed": line}


def dumps(report: StudyReport) -> str:
    return json.dumps(clean(report), indent=2) + "\n"
