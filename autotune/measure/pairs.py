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


def holdout_interval(pairs: Sequence[tuple[float, float]], earlier: Sequence[float] = (), *, level: float = LEVEL
                     ) -> tuple[float, float, float, int]:
    """(ratio, lo, hi, n) of the pick over the baseline from its holdout ``pairs`` alone: exp(mean log
    ratio), with a t-interval whose variance also holds how far the ratio moved between the holdout and
    ``earlier`` log ratios of the same two configs measured side by side at another time (the selection
    rounds). A speculative config's speed moves with the machine's state more than the baseline's, and
    the state persists from one engine instance to the next, so rounds measured back to back agree more
    than rounds an hour apart would; a second block of pairs from another time shows that spread. It
    only ever widens the interval (the earlier pairs chose the pick, so their mean carries the winner's
    curse and never enters the figure). benchmarks/calibration_fake.py measures the coverage."""
    logs = [math.log(a / b) for a, b in pairs if a > 0 and b > 0]
    n = len(logs)
    if n < 2:
        return figure(pairs, level=level)
    mean = sum(logs) / n
    within = sum((x - mean) ** 2 for x in logs) / (n - 1)
    var = within / n
    if earlier:
        m = len(earlier)
        e_mean = sum(earlier) / m
        e_var = sum((x - e_mean) ** 2 for x in earlier) / (m - 1) / m if m > 1 else within
        var += max(0.0, (e_mean - mean) ** 2 - var - e_var)
    half = t_quantile(n - 1, level) * math.sqrt(var)
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half), n


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


def quotient_interval(new: tuple[float | None, float | None], old: tuple[float | None, float | None]
                      ) -> tuple[float | None, float | None]:
    """new/old's interval from two independent runs' intervals (None where either side has none): on
    the log scale the half-widths add in quadrature around log(new/old), whose centre is the product of
    each interval's geometric centre (the widest quotient, lo/hi to hi/lo, adds them whole: a run
    against an equal one could then never pass)."""
    (n_lo, n_hi), (o_lo, o_hi) = new, old
    ends = (n_lo, n_hi, o_lo, o_hi)
    if not all(isinstance(x, (int, float)) and math.isfinite(x) for x in ends) or min(ends) <= 0:  # type: ignore[type-var]
        return None, None
    centre = 0.5 * (math.log(n_lo * n_hi) - math.log(o_lo * o_hi))
    half = math.hypot(0.5 * math.log(n_hi / n_lo), 0.5 * math.log(o_hi / o_lo))
    return math.exp(centre - half), math.exp(centre + half)
