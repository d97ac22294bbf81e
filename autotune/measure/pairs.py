"""Decisions on paired rounds: the pick's figure over its holdout pairs, and the gate's decision on the
pick against a deployed config measured in the same rounds (``autotune check``, same run).

A pair is two engine instances measured next to each other in one round (autotune.measure.intervals.abba
orders them); its unit is the log ratio of their throughputs (or of any objective, oriented so that
> 1 is better). Pure functions of numbers; no Optuna, no vLLM.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from autotune.measure.intervals import LEVEL, paired_t, t_quantile

# A decision against the line 1 - tolerance (the gate's, autotune.gate.check): each has its own exit code.
OK, REGRESSED, UNDECIDED = "ok", "regressed", "cannot tell"


def decide(ratio: float, lo: float | None, hi: float | None, tolerance: float) -> str:
    """A ratio (> 1 better) against the line 1 - tolerance, on its interval where there is one:
    REGRESSED when the interval lies wholly below the line, OK when wholly at or above, UNDECIDED when
    it straddles. Without an interval the point decides (and the caller says so)."""
    line = 1 - tolerance
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return REGRESSED if ratio < line else OK
    if hi < line:
        return REGRESSED
    return OK if lo >= line else UNDECIDED


def figure(pairs: Sequence[tuple[float, float]], *, level: float = LEVEL) -> tuple[float, float, float, int]:
    """(ratio, lo, hi, n): a over b over the pairs, exp(mean log ratio) with a t-interval on the log
    ratios (autotune.measure.intervals.paired_t); fewer than 2 pairs: no interval."""
    return paired_t([a for a, _ in pairs], [b for _, b in pairs], level=level)


def gate_decision(pairs: Sequence[tuple[float, float]], tolerance: float) -> str:
    """The pick (a) against the deployed config (b) over paired rounds: UNDECIDED below 2 pairs."""
    r, lo, hi, n = figure(pairs)
    if n < 2:
        return UNDECIDED
    return decide(r, lo, hi, tolerance)


def rounds_needed(pairs: Sequence[tuple[float, float]], tolerance: float, *, most: int = 64) -> int | None:
    """About how many pairs the observed spread of log ratios needs for the interval to clear the line
    1 - tolerance on the side the point lies (None: under 2 pairs, no spread to go by; ``most`` + 1:
    more than ``most``)."""
    logs = [math.log(a / b) for a, b in pairs if a > 0 and b > 0]
    if len(logs) < 2:
        return None
    mean = sum(logs) / len(logs)
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (len(logs) - 1))
    gap = abs(mean - math.log(1 - tolerance))
    for n in range(2, most + 1):
        if t_quantile(n - 1) * sd / math.sqrt(n) < gap:
            return n
    return most + 1
