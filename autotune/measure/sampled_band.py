"""Sampled outputs under numerics: a shift the dtype's rounding can make is not a fault.

The distribution test (autotune.measure.stats.sampler_test) asks whether a candidate samples from
the baseline's distribution exactly. In bfloat16 on a GPU it does not: verifying k+1 tokens runs
other matmul and attention shapes than decoding one, so every logit moves by up to its rounding, and
at 256 draws a request the exact test sees that. A logit moved by at most ``threshold / 2`` (the
near-tie threshold, autotune.measure.nearties: twice one logit's rounding) moves a token's
log-probability at temperature T by at most ``threshold / T``, the token's own move plus the
normalizer's. The shift is systematic where every draw shares the context: the first token, and
the first three jointly (each draw's first three tokens: at most three times that). Later tokens
follow per-draw contexts, where the shifts average out; they stay on the exact test.

So the first-token and first-three tables are tested again against the composite null "the
candidate's probability of every outcome is within exp(+-band) of the baseline's": Pearson's
statistic at the two samples' maximum-likelihood distributions under that constraint (band 0: the
exact test's statistic; found through its two-multiplier dual, exact and fast), on the same cells
and degrees of freedom. A candidate flagged by this test is a fault; one flagged by the exact test
only differs at numerics and passes, with both p-values said. The band is the study's measured
threshold (autotune.measure.numerics). Top-p and top-k are not covered: a token at the truncation
edge can fall in or out; such tokens are rare and pooled into the tables' "other" cell.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import minimize
from scipy.stats import chi2

from autotune.measure.nearties import Threshold
from autotune.measure.stats import HEAD_TOKENS, MIN_COUNT, feature_pvalues, head_outcomes, outcome_rows


def _fit(a: np.ndarray, b: np.ndarray, band: float) -> tuple[np.ndarray, np.ndarray]:
    """The maximum-likelihood p, q of counts a, b with |log q/p| <= band in every cell, by its dual.

    In log space (u = log p, v = log q) the problem is concave with convex constraints, so the
    dual is exact: for multipliers (lam, mu) of sum p = 1 and sum q = 1 each cell has a closed form
    (p = a/lam, q = b/mu where their ratio is inside the band; else q = r p at the band's edge r,
    p = (a + b)/(lam + mu r)), and the dual is minimized over the two multipliers alone."""
    lo, hi, tot = math.exp(-band), math.exp(band), a + b

    def cells(lam: float, mu: float) -> tuple[np.ndarray, np.ndarray]:
        with np.errstate(divide="ignore", invalid="ignore"):
            rho = np.where(a > 0, (b / mu) / np.where(a > 0, a / lam, 1.0), np.inf)  # free q/p
        r = np.clip(rho, lo, hi)
        free = (rho >= lo) & (rho <= hi)
        return np.where(free, a / lam, tot / (lam + mu * r)), np.where(free, b / mu, r * tot / (lam + mu * r))

    def dual(x: np.ndarray) -> tuple[float, np.ndarray]:
        lam, mu = np.exp(x)
        p, q = cells(lam, mu)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            ll = float(np.sum(a[a > 0] * np.log(p[a > 0])) + np.sum(b[b > 0] * np.log(q[b > 0])))
        return ll - lam * p.sum() - mu * q.sum() + lam + mu, np.array([lam * (1 - p.sum()), mu * (1 - q.sum())])

    # At the optimum lam + mu = a.sum() + b.sum() (sum lam p + mu q over cells), so each lies in (0, n].
    top = math.log(float(tot.sum()))
    res = minimize(dual, np.log([a.sum(), b.sum()]), jac=True, method="L-BFGS-B",
                   bounds=[(top - 30.0, top)] * 2, options={"gtol": 1e-12, "ftol": 1e-15})
    return cells(*np.exp(res.x))


def band_pearson(a: np.ndarray, b: np.ndarray, band: float) -> float:
    """Pearson's statistic of counts ``a``, ``b`` (one table's cells) at their maximum-likelihood
    distributions p, q with |log q/p| <= ``band`` in every cell (band 0: p = q, the exact test's)."""
    na, nb = float(a.sum()), float(b.sum())
    pooled = (a + b) / (na + nb)

    def pearson(p: np.ndarray, q: np.ndarray) -> float:
        return float(np.sum((a - na * p) ** 2 / (na * p)) + np.sum((b - nb * q) ** 2 / (nb * q)))

    exact = pearson(pooled, pooled)
    if band <= 0 or exact == 0:
        return exact
    p, q = _fit(a, b, band)
    # Judged by feasibility: a point inside the null is a valid (conservative) place to take the
    # statistic; one the solver left outside it is not used (the exact statistic instead).
    if not (np.all(np.isfinite(p)) and np.all(np.isfinite(q)) and np.all(p > 0) and np.all(q > 0)
            and abs(p.sum() - 1) < 1e-6 and abs(q.sum() - 1) < 1e-6):
        return exact
    p, q = p / p.sum(), q / q.sum()
    if np.any(np.abs(np.log(q / p)) > band + 1e-6):
        return exact
    return min(exact, pearson(p, q))


def band_test(tables: list[tuple[list[tuple[int, ...]], list[tuple[int, ...]], float]],
              min_count: int = MIN_COUNT) -> float:
    """p-value of the (baseline outcomes, candidate outcomes, band) tables against the band's
    composite null; statistics and degrees of freedom add up over tables (independent requests)."""
    total, dof = 0.0, 0
    for a, b, band in tables:
        if not a or not b:
            continue
        rows = np.asarray(outcome_rows(a, b, min_count), dtype=float)
        if len(rows) < 2:
            continue
        total += band_pearson(rows[:, 0], rows[:, 1], band)
        dof += len(rows) - 1
    return float(chi2.sf(total, dof)) if dof else 1.0


def temperatures_of(requests: list[dict[str, Any]]) -> dict[str, float]:
    """Each sampled request's temperature, by id."""
    return {r["id"]: float(r["sampling"]["temperature"]) for r in requests
            if r["sampling"].get("temperature", 0) > 0}


@dataclass(frozen=True)
class SampledVerdict:
    """The distribution test of sampled outputs, exact and within the numerics band."""

    flagged: bool  # by the band test: a fault
    p: float  # the exact test (autotune.measure.stats.sampler_test), Bonferroni-combined
    draws: int  # per side, over all sampled requests
    p_band: float  # the same features, the first-token and first-three tables within the band
    threshold: Threshold  # the near-tie threshold the band is taken from (nats, at temperature 1)
    alpha: float

    def note(self) -> str:
        """Said in a passing verdict where the exact test alone flagged."""
        return (f"sampled outputs differ at numerics only: distribution test p={self.p:.2g} exact, "
                f"p={self.p_band:.2g} >= {self.alpha:g} within the numerics band (+-{self.threshold.value:.3g}/T "
                f"nats per token on the first {HEAD_TOKENS} tokens, later tokens exact; {self.threshold.source}; "
                f"{self.draws} draws per side)")

    def failure(self, against: str) -> str:
        """The reason of a failing verdict; ``against`` names the reference's draws."""
        return (f"sampled outputs differ in distribution from {against} (distribution test p={self.p:.2g} < "
                f"{self.alpha:g}, p={self.p_band:.2g} within the numerics band +-{self.threshold.value:.3g}/T "
                f"nats per token on the first {HEAD_TOKENS} tokens, later tokens exact; {self.draws} draws per side)")


def judge_samples(base: dict[str, list[list[int]]], cand: dict[str, list[list[int]]],
                  temperatures: dict[str, float], threshold: Threshold, *, alpha: float,
                  head: int = HEAD_TOKENS, features: list[float] | None = None) -> SampledVerdict:
    """The exact distribution test and the band test on the same features (Bonferroni over them).
    ``features``: the exact features' p-values where already computed (stats.feature_pvalues)."""
    ps = feature_pvalues(base, cand, head=head) if features is None else features
    draws = sum(len(cand[k]) for k in cand if k in base)

    def band(rid: str, outcomes: list[tuple[int, ...]]) -> float:
        # per token at the request's temperature, times the tokens an outcome holds (fewer than
        # ``head`` where the draws ended early)
        t = temperatures.get(rid, 1.0)
        return max(map(len, outcomes), default=0) * threshold.value / t if t > 0 else math.inf

    first = band_test([(a, b, band(k, a + b)) for k, a, b in head_outcomes(base, cand, 1)])
    joint = band_test([(a, b, band(k, a + b)) for k, a, b in head_outcomes(base, cand, head)])
    banded = [first, joint, *ps[2:]]  # later tokens: exact (per-draw contexts, no systematic shift)
    p = min(1.0, len(ps) * min(ps))
    p_band = min(1.0, len(banded) * min(banded))
    return SampledVerdict(flagged=p_band < alpha, p=p, draws=draws, p_band=p_band, threshold=threshold,
                          alpha=alpha)
