"""Intervals on few units, and the unit each interval is over.

A decision rests on 2-6 units: paired engine instances in the study, served rounds in confirm. A
bootstrap over 2-3 units does not reach its nominal coverage (a resampled median of 3 values is
one of those 3 values; with 2 pairs half the draws repeat one pair). A t-interval on the log ratios
of paired units does, as far as those log ratios are near normal, which is how instance-to-instance
noise of a throughput ratio behaves (benchmarks/calibration.py measures the coverage): the ratio is
exp(mean log ratio), the interval exp(mean +- t(n-1) * sd / sqrt(n)). It is wide on 2 units
(t(1) = 12.7) because 2 units tell little; it narrows as units agree and as they are added.

Every interval autotune prints says its unit (``UNIT_*``): windows of one instance (the window
bootstrap: replays of one engine, which differ far less than instances do), paired instances, or
served rounds. Needs numpy and scipy only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

UNIT_WINDOWS = "windows of one instance"
UNIT_PAIRS = "paired instances"  # selection rounds: side by side, but they chose the pick (its claim)
UNIT_HOLDOUT = "holdout pairs"  # rounds measured after the choice was final: the pick's figure
UNIT_ROUNDS = "served rounds"  # confirm's rounds (vllm serve + vllm bench serve): the figure with --confirm
LEVEL = 0.95


def abba(n: int, sides: Sequence[str]) -> tuple[str, ...]:
    """Round ``n``'s order (1-based): odd rounds ``sides`` as given, even rounds reversed. Over each two
    rounds every side sits once early and once late, so a linear drift of the machine's speed cancels
    in every ratio between two sides (with three sides the middle one stays put, and the two around
    it swap). The one order of the study's rounds (selection, holdout) and confirm's served rounds;
    balanced on an even number of rounds."""
    return tuple(sides) if n % 2 else tuple(reversed(sides))


def t_quantile(df: int, level: float = LEVEL) -> float:
    from scipy import stats

    return float(stats.t.ppf(1 - (1 - level) / 2, df))


def log_t_interval(log_ratios: Sequence[float], *, level: float = LEVEL) -> tuple[float, float, float, int]:
    """(ratio, lo, hi, n) from per-unit log ratios: exp(mean) with a Student-t interval; with fewer
    than 2 units the ratio alone (lo, hi NaN: one unit has no spread to judge by)."""
    x = np.asarray([v for v in log_ratios if math.isfinite(v)], dtype=float)
    n = len(x)
    if n == 0:
        return math.nan, math.nan, math.nan, 0
    mean = float(x.mean())
    if n < 2:
        return math.exp(mean), math.nan, math.nan, n
    half = t_quantile(n - 1, level) * float(x.std(ddof=1)) / math.sqrt(n)
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half), n


def paired_t(cand: Sequence[float], base: Sequence[float], *, level: float = LEVEL) -> tuple[float, float, float, int]:
    """The ratio cand/base over paired units (unit i of each measured side by side), with a
    t-interval on the log ratios. Pairs with a value that is not positive are left out."""
    logs = [math.log(c / b) for c, b in zip(cand, base)
            if isinstance(c, (int, float)) and isinstance(b, (int, float)) and c > 0 and b > 0]
    return log_t_interval(logs, level=level)


def resolution(lo: float | None, hi: float | None) -> float | None:
    """The relative half-width of a ratio's interval, sqrt(hi / lo) - 1: the smallest difference it
    tells apart from none. None without an interval. The one formula of the resolution every
    output states (the study's, confirm's, check's; tests/test_one_rule.py holds it)."""
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)) or lo <= 0:
        return None
    return math.sqrt(hi / lo) - 1
