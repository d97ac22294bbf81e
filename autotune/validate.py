"""Correctness verdicts: a candidate's outputs against the baseline's, and the workload's expectations.

Speculation alone should be lossless: greedy outputs must match the baseline's tokens (vLLM
promises equality "up to numerics", so a small tolerance is allowed). Quantization and KV dtype
change numerics on purpose: their drift from the baseline is gated by ``max_drift``.
Sampled requests are judged by a two-sample test of their output distribution (autotune.stats).
Expectations (``expect``) a baseline output meets must also be met by the candidate.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from typing import Any

from autotune.metrics import complete
from autotune.stats import DEFAULT_ALPHA, sampler_test


@dataclass(frozen=True)
class Tolerances:
    lossless: float = 0.02  # allowed mean token disagreement for speculation-only candidates
    max_drift: float = 0.10  # allowed mean token disagreement for lossy candidates
    alpha: float = DEFAULT_ALPHA  # significance of the sampled-output distribution test


@dataclass(frozen=True)
class Verdict:
    """Whether a candidate is correct, and why not."""

    passed: bool
    reason: str
    greedy_requests: int
    greedy_identical: int
    token_agreement: float  # mean over greedy requests of common-prefix / longer length
    first_divergence: int | None  # earliest divergence position over greedy requests
    expect_failed: int
    expect_regressions: int
    sampled_requests: int
    distribution_p: float | None  # two-sample test of sampled outputs vs the baseline (None: not run)
    distribution_samples: int  # draws per side, over all sampled requests
    budget: float
    constraints: tuple[float, ...]  # Optuna convention: every value <= 0 means feasible

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def agreement(a: list[int], b: list[int]) -> tuple[float, int | None]:
    """Common-prefix share of the longer sequence, and the first divergence (None if identical)."""
    if a == b:
        return 1.0, None
    n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return n / max(len(a), len(b)), n


def check_expect(expect: dict[str, Any], text: str) -> list[str]:
    """Names of the expectations ``text`` fails."""
    failed = []
    if expect.get("json"):
        try:
            json.loads(text)
        except json.JSONDecodeError:
            failed.append("json")
    if "regex" in expect and re.search(expect["regex"], text) is None:
        failed.append("regex")
    if "contains" in expect and expect["contains"] not in text:
        failed.append("contains")
    return failed


def request_failures(req: dict[str, Any], rec: dict[str, Any]) -> list[str]:
    """Expectations plus the request's own limits (max_tokens, stop sequences)."""
    failed = check_expect(req.get("expect", {}), rec["text"])
    if len(rec["token_ids"]) > req["sampling"]["max_tokens"]:
        failed.append("max_tokens")
    if any(s in rec["text"] for s in req["sampling"].get("stop", [])):
        failed.append("stop")
    return failed


def verdict(requests: list[dict[str, Any]], cand: list[dict[str, Any]], base: list[dict[str, Any]] | None,
            *, lossy: bool, tol: Tolerances, samples: dict[str, list[list[int]]] | None = None,
            base_samples: dict[str, list[list[int]]] | None = None) -> Verdict:
    """Judge a candidate's records against the baseline's (``base`` None: this *is* the baseline).

    ``samples``/``base_samples``: per sampled request, short samples drawn with fixed seeds; for a
    lossless candidate their first tokens must follow the baseline's distribution.
    """
    by_id = {r["id"]: r for r in cand}
    base_by_id = {r["id"]: r for r in base} if base is not None else by_id
    budget = tol.max_drift if lossy else tol.lossless
    agreements, identical, first, greedy = [], 0, None, 0
    expect_failed = regressions = sampled = 0
    reasons: list[str] = []
    incomplete = [r["id"] for r in cand if not complete(r)]
    if incomplete:
        reasons.append(f"{len(incomplete)} request(s) incomplete (e.g. {incomplete[0]!r})")
    for req in requests:
        rec, ref = by_id[req["id"]], base_by_id[req["id"]]
        failed = request_failures(req, rec)
        expect_failed += bool(failed)
        if failed and not request_failures(req, ref):
            regressions += 1
            if regressions == 1:
                reasons.append(f"request {req['id']!r} fails {', '.join(failed)} where the baseline passed")
        if req["sampling"]["temperature"] == 0.0:
            greedy += 1
            a, div = agreement(rec["token_ids"], ref["token_ids"])
            agreements.append(a)
            identical += div is None
            if div is not None and (first is None or div < first):
                first = div
        else:
            sampled += 1  # sampled outputs are judged by distribution, below
    mean_agree = sum(agreements) / len(agreements) if agreements else 1.0
    gap = (1.0 - mean_agree) - budget
    if gap > 0:
        kind = "drift" if lossy else "greedy mismatch (speculation should be lossless)"
        reasons.append(f"{kind}: token agreement {mean_agree:.3f} < {1 - budget:.3f}; "
                       f"{greedy - identical}/{greedy} greedy outputs differ, first at token {first}")
    dist_p, n_draws, dist_gap = None, 0, 0.0
    if base is not None and samples and base_samples:
        flagged, dist_p, n_draws = sampler_test(base_samples, samples, alpha=tol.alpha)
        # Speculation must keep the sampler's distribution; lossy configs are judged by drift alone.
        if not lossy and flagged:
            dist_gap = tol.alpha - dist_p
            reasons.append(f"sampled outputs differ in distribution from the baseline's (chi-square "
                           f"p={dist_p:.2g} < {tol.alpha:g}, {n_draws} draws per side)")
    constraints = (gap, float(regressions), float(len(incomplete)), dist_gap)
    return Verdict(passed=not reasons, reason="; ".join(reasons) or "ok", greedy_requests=greedy,
                   greedy_identical=identical, token_agreement=mean_agree, first_divergence=first,
                   expect_failed=expect_failed, expect_regressions=regressions, sampled_requests=sampled,
                   distribution_p=dist_p, distribution_samples=n_draws, budget=budget, constraints=constraints)
