"""Objective names: ``metric`` at the study's own load, ``metric@level`` at another load level.

The objective metrics and their directions (``DIRECTIONS``), and the one place that builds and
parses measurement keys, ``metric[_mad|_windows][@level]`` (``metric_key``, ``parse_key``); the
measurement, the study, ``check``, the report and the Pareto table all use it. Needs neither Optuna
nor vLLM.
"""

from __future__ import annotations

from autotune.core.errors import BadInput
from autotune.core.load import LoadPattern, parse_load

# The statistics of each latency over a window's requests (name, percentile; None: the mean).
STATS = (("mean", None), ("p50", 50), ("p90", 90), ("p95", 95), ("p99", 99))
# Objective name -> direction. Latencies in milliseconds.
DIRECTIONS: dict[str, str] = {"output_tok_s": "maximize", "req_s": "maximize"}
for _m in ("ttft", "tpot", "itl", "e2e"):
    for _s, _ in STATS:
        DIRECTIONS[f"{_m}_ms_{_s}"] = "minimize"

MAD, WINDOWS = "_mad", "_windows"  # a metric's spread over windows, and its per-window values


def metric_key(metric: str, level: str | None = None, suffix: str = "") -> str:
    """The measurement key of ``metric`` (with ``suffix``: ``MAD`` or ``WINDOWS``) at load ``level``
    (None or empty: the study's own load): ``metric[_mad|_windows][@level]``."""
    return f"{metric}{suffix}" + (f"@{level}" if level else "")


def parse_key(key: str) -> tuple[str, str, str | None]:
    """``metric[_mad|_windows][@level]`` -> (metric, suffix, level): ``output_tok_s_windows@batch``
    -> (``output_tok_s``, ``_windows``, ``batch``); no ``@``: level None."""
    base, _, level = key.partition("@")
    suffix = next((s for s in (MAD, WINDOWS) if base.endswith(s)), "")
    return base[:len(base) - len(suffix)], suffix, level or None


def split_objective(name: str) -> tuple[str, str | None]:
    """``output_tok_s@16`` -> (``output_tok_s``, ``concurrency=16``); no ``@``: the study's load."""
    metric, suffix, level = parse_key(name)
    return metric + suffix, (f"concurrency={level}" if level and level.isdigit() else level) or None


def windows_key(name: str) -> str:
    """The measurement key of an objective's per-window values: ``output_tok_s@16`` ->
    ``output_tok_s_windows@concurrency=16`` (as autotune.measure.metrics.at_level writes them)."""
    metric, level = split_objective(name)
    return metric_key(metric, level, WINDOWS)


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
        out.append(metric_key(metric, pattern.label))
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


# Latencies timed from when the stream's tokens arrived: not measured in a window whose stream delivered
# them in bursts (autotune.measure.coalescing), where every other metric still is.
STREAM_TIMED = ("tpot_ms", "itl_ms")


def measured(m: dict[str, object], name: str) -> float | None:
    """Objective ``name``'s value in measurement ``m``, None where it was not measured (absent or NaN)."""
    value = m.get(name)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value \
        else None


def objective_values(m: dict[str, object], names: tuple[str, ...] | list[str]) -> tuple[list[float], list[str]]:
    """What Optuna is told for objectives ``names``, and the names left out of it: a TPOT or ITL objective
    the stream did not measure (``STREAM_TIMED``) gets the worst value of its direction (inf for a
    latency), so it neither wins nor dominates a trial that measured it, and ties with one that did not;
    any other objective keeps its value (NaN still fails the trial)."""
    values, left_out = [], []
    for name in names:
        value = measured(m, name)
        if value is None and split_objective(name)[0].rsplit("_", 1)[0] in STREAM_TIMED:
            values.append(float("inf") if direction(name) == "minimize" else float("-inf"))
            left_out.append(name)
        else:
            values.append(float("nan") if value is None else value)
    return values, left_out
