"""Objective names: ``metric`` at the study's own load, ``metric@level`` at another load level.

The one place that parses them; the study, ``check``, the report and the Pareto table all use it.
Needs neither Optuna nor vLLM.
"""

from __future__ import annotations

from autotune.errors import BadInput
from autotune.load import LoadPattern, parse_load
from autotune.metrics import DIRECTIONS


def split_objective(name: str) -> tuple[str, str | None]:
    """``output_tok_s@16`` -> (``output_tok_s``, ``concurrency=16``); no ``@``: the study's load."""
    metric, _, level = name.partition("@")
    return metric, (f"concurrency={level}" if level.isdigit() else level) or None


def windows_key(name: str) -> str:
    """The measurement key of an objective's per-window values: ``output_tok_s@16`` ->
    ``output_tok_s_windows@concurrency=16`` (as autotune.metrics.at_level writes them)."""
    metric, level = split_objective(name)
    return f"{metric}_windows" + (f"@{level}" if level else "")


def direction(name: str) -> str | None:
    """``maximize`` or ``minimize`` for an objective name (any level), None if it is no objective."""
    return DIRECTIONS.get(split_objective(name)[0])


def normalize_objectives(names: tuple[str, ...], load: LoadPattern) -> tuple[tuple[str, ...], tuple[LoadPattern, ...]]:
    """Objective names with their load level spelled out, and the extra levels a trial must measure.

    An objective at the study's own load is the plain metric name, however its level was spelled.
    """
    out, extra = [], []
    for name in names:
        metric, level = split_objective(name)
        try:
            pattern = load if level is None else parse_load(level, seed=load.seed)
        except BadInput:
            raise BadInput(f"--objectives: {name!r}: expected METRIC@LEVEL with LEVEL a number (concurrency) "
                           f"or a load pattern (concurrency=N, batch, poisson=R)") from None
        if pattern.label == load.label:
            out.append(metric)
            continue
        out.append(f"{metric}@{pattern.label}")
        if pattern not in extra:
            extra.append(pattern)
    return tuple(out), tuple(extra)


def validate_objectives(names: tuple[str, ...]) -> list[str]:
    """Optuna directions for the chosen objective names."""
    unknown = [n for n in names if direction(n) is None]
    if unknown or not names:
        raise BadInput(f"--objectives: unknown objective {unknown[0] if unknown else '(none)'!r}; "
                       f"expected names from {sorted(DIRECTIONS)}, optionally @LEVEL (e.g. output_tok_s@16)")
    return [direction(n) for n in names]
