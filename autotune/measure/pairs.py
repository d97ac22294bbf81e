"""Decisions on paired rounds: the pick's figure over its holdout pairs, and the gate's decision on the
pick against a deployed config measured in the same rounds (``autotune check``, same run).

A pair is two engine instances measured next to each other in one round (autotune.measure.intervals.abba
orders them); its unit is the log ratio of their throughputs (or of any objective, oriented so that
> 1 is better). Pure functions of numbers; no Optuna, no vLLM.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

from autotune.measure.intervals import LEVEL, paired_t, t_quantile

# A decision against the line 1 - tolerance (the gate's, autotune.gate.check): each has its own exit code.
OK, REGRESSED, UNDECIDED = "ok", "regressed", "cannot tell"


def decide(ratio: float, lo: float | None, hi: float | None, tolerance: float) -> str:
    """A ratio (> 1 better) against the line 1 - tolerance, on its interval where there is one:
    REGRESSED when the interval lies wholly below the line, OK when wholly at or above, UNDECIDED when
    it straddles, and UNDECIDED without an interval: a point ratio decides nothing (issue 60: the
    gate failed on e2e's point across two runs while throughput's interval there could not tell)."""
    line = 1 - tolerance
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return UNDECIDED
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


# The gate's sequential test (``gate_decision``): Wald's SPRT on the pairs' log ratios, no change
# (ratio 1) against a regression of twice the tolerance (1 - 2 tolerance on the log scale), so the line
# 1 - tolerance lies midway and a ratio between the two may go either way. Nominal rates below the
# targets (a pick as fast passes 95%, one 2 x tolerance slower fails 90%): the variance is estimated
# from the pairs themselves and pairs close in time share the machine's state, both of which raise
# the realised rates (benchmarks/calibration_fake.py --mode gate measures them through the study).
GATE_ALPHA = 0.025  # nominal: a pick as fast as the deployed config read as a regression
GATE_BETA = 0.05  # nominal: a pick slower by twice the tolerance passed
GATE_MIN_PAIRS = 6  # fewer decide too early on a spread read from so few (3 of 1,000 more errors at 4); (n - 1) / (n - 3) needs 4


def log_stats(pairs: Sequence[tuple[float, float]]) -> tuple[float, float, int]:
    """(mean, sd, n) of the pairs' log ratios a over b (sd NaN under 2 pairs)."""
    logs = [math.log(a / b) for a, b in pairs if a > 0 and b > 0]
    n = len(logs)
    mean = sum(logs) / n if n else math.nan
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (n - 1)) if n > 1 else math.nan
    return mean, sd, n


def sequential_decision(mean: float, sd: float, n: int, tolerance: float, *, final: bool = False) -> str:
    """The gate's decision on ``n`` pairs whose log ratios (> 0: the pick better) have ``mean`` and
    ``sd``: REGRESSED or OK where the SPRT's log-likelihood ratio crosses a boundary; otherwise
    UNDECIDED, or, ``final`` (no more rounds will run: the cap), the point against the line 1 - tolerance."""
    if n < GATE_MIN_PAIRS or not (math.isfinite(mean) and math.isfinite(sd)):
        return UNDECIDED
    line = math.log(1 - tolerance)
    var = max(sd * sd * (n - 1) / (n - 3), 1e-12)  # E[1/s^2] = (n - 1) / ((n - 3) sigma^2): not overconfident early
    llr = 2 * line / var * n * (mean - line)  # > 0 when the pairs lie below the line
    if llr >= math.log((1 - GATE_BETA) / GATE_ALPHA):
        return REGRESSED
    if llr <= math.log(GATE_BETA / (1 - GATE_ALPHA)):
        return OK
    if final:
        return REGRESSED if mean < line else OK
    return UNDECIDED


def gate_decision(pairs: Sequence[tuple[float, float]], tolerance: float, *, final: bool = False) -> str:
    """The pick (a) against the deployed config (b) over paired rounds (``sequential_decision``)."""
    mean, sd, n = log_stats(pairs)
    return sequential_decision(mean, sd, n, tolerance, final=final)


def pairs_needed(sd: float, tolerance: float) -> int | None:
    """About how many pairs the gate's test needs at a spread ``sd`` of log ratios: the fixed-sample
    size with its error rates (the sequential test stops sooner on average); None without a spread."""
    if not math.isfinite(sd) or tolerance <= 0:
        return None
    z = NormalDist().inv_cdf
    gap = -2 * math.log(1 - tolerance)
    return max(GATE_MIN_PAIRS, math.ceil(((z(1 - GATE_ALPHA) + z(1 - GATE_BETA)) * sd / gap) ** 2))


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
