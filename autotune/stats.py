"""A two-sample test of output distributions: is a candidate's sampler the baseline's sampler?

Speculative sampling with the exact acceptance rule preserves the target's distribution, but
not the sequences drawn for a given seed. So sampled requests are judged by distribution:
each request is sampled many times by both engines, the first few tokens of each sample form
one categorical outcome (their joint value), and a chi-square test of homogeneity compares the
two samples. Per-request tables are independent, so their statistics and degrees of freedom
add up into one test. Outcomes too rare for the chi-square approximation (fewer than
``min_count`` draws over both sides) are pooled into one "other" cell.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from scipy.stats import chi2

DEFAULT_ALPHA = 0.01  # a correct config is flagged about 1% of the time


@dataclass(frozen=True)
class TwoSampleResult:
    statistic: float
    dof: int
    p_value: float
    tables: int  # per-request tables that had something to test

    def flagged(self, alpha: float = DEFAULT_ALPHA) -> bool:
        return self.p_value < alpha


def _table_stat(a: Sequence[Hashable], b: Sequence[Hashable], min_count: int) -> tuple[float, int]:
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
    rows = list(cells.values()) + ([other] if sum(other) else [])
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
                    min_count: int = 10) -> TwoSampleResult:
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


def sampler_test(base: dict[str, list[list[int]]], cand: dict[str, list[list[int]]],
                 *, alpha: float = DEFAULT_ALPHA) -> tuple[bool, float, int]:
    """Two features, Bonferroni-combined: the first token alone, and the first tokens jointly.

    The first token concentrates the counts (most power against a wrong temperature or top-p);
    the joint outcome sees faults that show only after a draft is accepted or rejected (the
    residual rule). Each is tested at alpha/2, so a correct sampler is flagged at most alpha of
    the time. Returns (flagged, smallest p-value times 2 capped at 1, draws per side).
    """
    keys = [k for k in cand if k in base]
    first = two_sample_test([([tuple(x[:1]) for x in base[k]], [tuple(x[:1]) for x in cand[k]]) for k in keys])
    joint = two_sample_test([([tuple(x) for x in base[k]], [tuple(x) for x in cand[k]]) for k in keys])
    p = min(1.0, 2 * min(first.p_value, joint.p_value))
    return p < alpha, p, sum(len(cand[k]) for k in keys)
