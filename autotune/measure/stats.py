"""A two-sample test of output distributions: is a candidate's sampler the baseline's sampler?

Speculative sampling with the exact acceptance rule preserves the target's distribution, but
not the sequences drawn for a given seed. So sampled requests are judged by distribution:
each request is sampled many times by both engines, the first few tokens of each sample form
one categorical outcome (their joint value), and a chi-square test of homogeneity compares the
two samples. Per-request tables are independent, so their statistics and degrees of freedom
add up into one test. Outcomes too rare for the chi-square approximation (fewer than
``min_count`` draws over both sides) are pooled into one "other" cell.

A fault that starts after those first tokens (a wrong temperature or top-p, or a wrong residual
rule, from the 4th token on) is invisible to them. So the tokens after the first few are tested
too, pooled over their positions (``occupancy_test``): each draw is summarized by how often each
token, and each (previous token, token) pair, occurs in its later positions, and the two samples'
mean count vectors are compared by Hotelling's T^2, whose covariance comes from the draws
themselves (the positions of one draw are dependent; the draws are not). If the candidate's
sequences have the baseline's distribution, so do these counts, so the test stays valid whatever
the positions' dependence.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import chi2
from scipy.stats import f as f_dist

DEFAULT_ALPHA = 0.01  # a correct config is flagged about 1% of the time
HEAD_TOKENS = 3  # leading tokens tested jointly; later ones by occupancy_test
MIN_COUNT = 10  # outcomes seen fewer times over both sides share one "other" cell
_END, _PAIR = object(), object()  # the "ended" cell; the tag of a (previous, next) token pair


@dataclass(frozen=True)
class TwoSampleResult:
    statistic: float
    dof: int
    p_value: float
    tables: int  # per-request tables that had something to test

    def flagged(self, alpha: float = DEFAULT_ALPHA) -> bool:
        return self.p_value < alpha


def outcome_rows(a: Sequence[Hashable], b: Sequence[Hashable], min_count: int) -> list[list[int]]:
    """The (count in a, count in b) cells of one table, outcomes seen fewer than ``min_count`` times
    over both sides pooled into one "other" cell (autotune.measure.sampled_band tests the same cells)."""
    ca, cb = Counter(a), Counter(b)
    cells: dict[Hashable, list[int]] = {}
    other = [0, 0]
    for outcome in set(ca) | set(cb):
        pair = [ca[outcome], cb[outcome]]
        if sum(pair) >= min_count:
            cells[outcome] = pair
        else:
            other[0] += pair[0]
            other[1] += pair[1]
    return list(cells.values()) + ([other] if sum(other) else [])


def _table_stat(a: Sequence[Hashable], b: Sequence[Hashable], min_count: int) -> tuple[float, int]:
    rows = outcome_rows(a, b, min_count)
    if len(rows) < 2:
        return 0.0, 0  # one outcome only: both sides agree, nothing to test
    na, nb = len(a), len(b)
    n = na + nb
    stat = 0.0
    for ka, kb in rows:
        tot = ka + kb
        ea, eb = tot * na / n, tot * nb / n
        stat += (ka - ea) ** 2 / ea + (kb - eb) ** 2 / eb
    return stat, len(rows) - 1


def two_sample_test(pairs: Sequence[tuple[Sequence[Hashable], Sequence[Hashable]]], *,
                    min_count: int = MIN_COUNT) -> TwoSampleResult:
    """Chi-square homogeneity test over several independent (baseline, candidate) outcome samples."""
    total, dof, tables = 0.0, 0, 0
    for a, b in pairs:
        if not a or not b:
            continue
        s, d = _table_stat(a, b, min_count)
        total += s
        dof += d
        tables += d > 0
    p = float(chi2.sf(total, dof)) if dof else 1.0
    return TwoSampleResult(statistic=total, dof=dof, p_value=p, tables=tables)


def _occupancy_stat(a: Sequence[Sequence[Hashable]], b: Sequence[Sequence[Hashable]], start: int,
                    min_count: int, bigrams: bool) -> tuple[float, int]:
    draws = [*a, *b]
    width = max(len(x) for x in draws) - start  # later positions of the longest draw
    if width <= 0:
        return 0.0, 0
    counts = []
    for x in draws:
        late = x[start:start + width]
        c = Counter(late)
        missing = width - len(late)
        if missing:
            c[_END] += missing  # ended early (EOS): its missing positions are an outcome too
        if bigrams:  # (previous token, token) at each later position: how a token follows another
            c.update((_PAIR, x[t - 1], x[t]) for t in range(max(start, 1), start + len(late)))
        counts.append(c)
    support = Counter(t for c in counts for t in c)  # draws that have the token, not occurrences
    n = len(draws)
    common = [t for t, k in support.most_common(max(1, n // 2)) if k >= min_count]  # <= n/2 cells
    cols = {t: i for i, t in enumerate(common)}
    rare = len(cols) < len(support)
    if len(cols) + rare < 2:
        return 0.0, 0  # one outcome only
    mat = np.zeros((n, len(cols) + rare))
    for row, c in zip(mat, counts):
        for t, v in c.items():
            row[cols.get(t, len(cols))] += v
    na, nb = len(a), len(b)
    mean = mat.mean(axis=0)
    dev = mat[:na].sum(axis=0) - na * mean  # the first sample's excess counts
    resid = mat - mean
    # The excess over its covariance when the n draws are split at random into na and nb (the
    # null: na nb / (n - 1) times the draws' covariance) is (n - 1) theta, theta = Pillai's trace;
    # for one position (and no pairs) that is Pearson's chi-square times (n - 1) / n. The token
    # cells of every row sum to `width`, so the covariance is singular; its nonzero part (rank r)
    # is used.
    w, v = np.linalg.eigh(resid.T @ resid / n)
    keep = w > 1e-9 * max(float(w.max()), 1e-300)
    r = int(keep.sum())
    if not r or n - 1 - r <= 0:
        return 0.0, 0
    proj = v[:, keep].T @ dev
    theta = min(float(np.sum(proj ** 2 / w[keep])) / (na * nb), 1.0)  # Pillai's trace, in [0, 1]
    # Hotelling's T^2 is (n - 2) theta / (1 - theta), and (n - 1 - r) / (r (n - 2)) T^2 is F(r, n - 1 - r)
    # for normal counts: the small-sample correction, which matters where the cells are many (a
    # large vocabulary), where the chi-square limit is too conservative. Its p-value is turned
    # into the chi-square(r) statistic with the same p-value, so that requests add up.
    p = float(f_dist.sf((n - 1 - r) / r * theta / max(1.0 - theta, 1e-300), r, n - 1 - r))
    return float(chi2.isf(max(p, 1e-300), r)), r


def occupancy_test(pairs: Sequence[tuple[Sequence[Sequence[Hashable]], Sequence[Sequence[Hashable]]]], *,
                   start: int = HEAD_TOKENS, min_count: int = MIN_COUNT, bigrams: bool = True) -> TwoSampleResult:
    """Do the tokens from position ``start`` on (0-based) occur as often in both samples?

    ``pairs`` holds (baseline draws, candidate draws) per request, each draw a token sequence of
    any length. A draw's tokens at positions ``start`` .. (the request's longest draw) are counted
    per token, and with ``bigrams`` per (previous token, token) pair too (a wrong temperature,
    top-p or residual rule changes how tokens follow each other more than how often each occurs:
    on the Markov model of tests/markov.py the pairs give 2 to 12 times the power at 64 draws per
    side); positions a draw does not reach (it ended early, at EOS) count as an "ended" outcome,
    so a changed stopping rate is seen too. Tokens and pairs found in fewer than ``min_count``
    draws (both sides) share one "other" cell, and at most n/2 cells of n draws are kept (the
    most common). The two samples' count vectors are compared by Hotelling's two-sample T^2 (the
    covariance estimated from the draws, so the positions' dependence within a draw is
    accounted for; F-corrected); per-request statistics, as chi-square equivalents, and degrees
    of freedom add up, as in ``two_sample_test``.
    """
    total, dof, tables = 0.0, 0, 0
    for a, b in pairs:
        if not a or not b:
            continue
        s, d = _occupancy_stat(a, b, start, min_count, bigrams)
        total += s
        dof += d
        tables += d > 0
    p = float(chi2.sf(total, dof)) if dof else 1.0
    return TwoSampleResult(statistic=total, dof=dof, p_value=p, tables=tables)


def sampler_test(base: dict[str, list[list[int]]], cand: dict[str, list[list[int]]],
                 *, alpha: float = DEFAULT_ALPHA, head: int = HEAD_TOKENS) -> tuple[bool, float, int]:
    """Up to three features, Bonferroni-combined: the first token alone, the first ``head``
    tokens jointly, and (where draws are longer than ``head``) the later tokens and token pairs
    pooled over their positions (``occupancy_test``).

    The first token concentrates the counts (most power against a wrong temperature or top-p);
    the joint outcome sees faults that show only after a draft is accepted or rejected (the
    residual rule); the later tokens see faults that start after the first ``head`` tokens. Each
    of the m features present is tested at alpha/m, so a correct sampler is flagged at most alpha
    of the time. Draws of ``head`` tokens or fewer give exactly the two-feature test of before.
    Returns (flagged, smallest p-value times m capped at 1, draws per side).
    """
    ps = feature_pvalues(base, cand, head=head)
    p = min(1.0, len(ps) * min(ps))
    return p < alpha, p, sum(len(cand[k]) for k in cand if k in base)


def head_outcomes(base: dict[str, list[list[int]]], cand: dict[str, list[list[int]]], width: int
                  ) -> list[tuple[str, list[tuple[int, ...]], list[tuple[int, ...]]]]:
    """Per request both engines drew for: (id, baseline outcomes, candidate outcomes), an outcome
    being a draw's first ``width`` tokens."""
    return [(k, [tuple(x[:width]) for x in base[k]], [tuple(x[:width]) for x in cand[k]]) for k in cand if k in base]


def feature_pvalues(base: dict[str, list[list[int]]], cand: dict[str, list[list[int]]], *,
                    head: int = HEAD_TOKENS) -> list[float]:
    """``sampler_test``'s features, uncombined: the first token, the first ``head`` jointly, and
    (where draws are longer) the later tokens (``occupancy_test``)."""
    first = two_sample_test([(a, b) for _, a, b in head_outcomes(base, cand, 1)])
    joint = two_sample_test([(a, b) for _, a, b in head_outcomes(base, cand, head)])
    keys = [k for k in cand if k in base]
    ps = [first.p_value, joint.p_value]
    if any(len(x) > head for k in keys for x in (*base[k], *cand[k])):
        ps.append(occupancy_test([(base[k], cand[k]) for k in keys], start=head).p_value)
    return ps
