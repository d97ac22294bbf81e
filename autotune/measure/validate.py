"""Correctness verdicts: a candidate's outputs against the baseline's, and the workload's expectations.

Speculation alone should be lossless: greedy outputs must match the baseline's tokens up to
numerics (vLLM's word): every token of each differing output must be the target's own top choice,
or within the study's measured numerics of it (autotune.measure.every_token), and the run's excused
tokens no more than numerics predict. Quantization and KV dtype
change numerics on purpose: their drift from the baseline is gated by ``max_drift`` (token
agreement) and by ``max_logprob_drift``: both engines score the baseline's greedy tokens
teacher-forced (autotune.run.engine), and the per-token log-probs are compared.
Sampled requests are judged by a two-sample test of their output distribution (autotune.measure.stats),
where the first tokens may move within the dtype's numerics (autotune.measure.sampled_band).
A lossy config *with* speculation is judged twice, and must pass both: its speculation against the
same lossy config without speculation (``Unspeculated``: greedy tokens and sampled draws, held to
the lossless rules), and its lossy part against the baseline by drift. The baseline alone cannot
judge its speculation: the lossy part moves the outputs on purpose, and the drift is scored in a
prefill where no draft is ever verified.
Expectations (``expect``) a baseline output meets must also be met by the candidate.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from autotune.measure.logprob_drift import LogprobDrift, common_prefix, drift_note, logprob_drift
from autotune.measure.metrics import complete
from autotune.measure.every_token import TokenJudgement, judge_greedy
from autotune.measure.nearties import Threshold, dtype_threshold
from autotune.measure.numerics import Numerics
from autotune.measure.sampled_band import SampledVerdict, judge_samples, temperatures_of
from autotune.measure.stats import DEFAULT_ALPHA


@dataclass(frozen=True)
class Tolerances:
    lossless: float = 0.02  # allowed mean token disagreement for speculation-only candidates
    max_drift: float = 0.10  # allowed mean token disagreement for lossy candidates
    max_logprob_drift: float = 0.05  # allowed mean |log p_base - log p_cand| (nats/token) for lossy candidates
    alpha: float = DEFAULT_ALPHA  # significance of the sampled-output distribution test
    allow_unverified: bool = False  # a candidate whose applicable checks did not run may be the pick


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
    # Teacher-forced log-probs of the baseline's greedy tokens, this engine against the baseline's
    # (None: not measured). Mean and max over tokens of |difference| in nats, and the mean KL over
    # each position's shared top-k tokens (renormalized).
    logprob_drift: float | None
    logprob_drift_max: float | None
    logprob_kl: float | None
    logprob_tokens: int  # tokens compared
    budget: float
    constraints: tuple[float, ...]  # Optuna convention: every value <= 0 means feasible
    # "ok" (every applicable check ran and passed), "failed", or "unverified": no check failed, but
    # one that applies did not run (sampled requests with no distribution test, say). No evidence,
    # no "ok": an unverified candidate is never the pick unless Tolerances.allow_unverified.
    status: str = "ok"
    unverified: tuple[str, ...] = ()  # the checks that applied and did not run
    # A lossy config with speculation: its greedy outputs' token agreement with the same config
    # without speculation (None: not such a config, or that reference did not run). Its
    # distribution_p then compares its draws with that reference's, not the baseline's.
    speculation_agreement: float | None = None
    # Differing greedy outputs judged at every token (autotune.measure.every_token) against the
    # baseline's (a lossy config with speculation: against the same config without it): how many
    # within numerics at every token, how many with a fault, how many not scored, and the threshold.
    near_ties: int = 0
    flip_faults: int = 0
    flips_unscored: int = 0
    near_tie_threshold: float | None = None
    near_tie_source: str = ""
    flip_margins: tuple[float, ...] = ()  # every excused position's margin, and each faulty output's first
    # The distribution test with the first tokens allowed to move within the numerics band
    # (autotune.measure.sampled_band; None: not run). Below alpha: a fault; distribution_p alone below
    # it: numerics, passed and said.
    distribution_p_band: float | None = None
    # The excess test (autotune.measure.every_token.excess): excused positions over every greedy
    # position judged, what the baseline's own drift predicts there, the one-sided p (None: not run).
    excused_positions: int | None = None
    excused_expected: float | None = None
    excused_p: float | None = None
    judged_positions: int | None = None
    numerics_findings: tuple[str, ...] = ()  # the baseline did not reproduce itself (autotune.measure.numerics.widen)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def agreement(a: list[int], b: list[int]) -> tuple[float, int | None]:
    """Common-prefix share of the longer sequence, and the first divergence (None if identical)."""
    if a == b:
        return 1.0, None
    n = common_prefix(a, b)
    return n / max(len(a), len(b)), n


@dataclass(frozen=True)
class Unspeculated:
    """The same (lossy) config run without speculation: the reference its speculation is judged
    against, as a lossless candidate's is against the baseline."""

    outputs: list[dict[str, Any]] = field(default_factory=list)  # request records (id, token_ids, ...)
    samples: dict[str, list[list[int]]] = field(default_factory=dict)
    error: str | None = None  # why there is nothing to compare with (its run failed, say)


def _drift_coverage(requests: list[dict[str, Any]], drift: LogprobDrift | None, attempted: set[str],
                    *, greedy_gated: bool) -> list[str]:
    """Log-prob drift is evidence only for the requests it covers: every request the engines set out
    to score (``attempted``: the baseline's scored set, errors included; autotune.run.replay.LOGPROB_MAX_REQUESTS
    bounds it) must be scored under both engines, for greedy requests where drift is their gate
    and for sampled ones always. One scored request is not the workload's drift."""
    covered = set(drift.requests) if drift is not None else set()
    missing: list[str] = []
    greedy = [r["id"] for r in requests if r["sampling"].get("temperature", 0) == 0]
    kinds = [("greedy", greedy)] if greedy_gated else []
    kinds.append(("sampled", [r["id"] for r in requests if r["sampling"].get("temperature", 0) > 0]))
    for kind, ids in kinds:
        want = [i for i in ids if i in attempted] or ids  # none attempted: all of this kind are owed
        lacking = [i for i in want if i not in covered]
        if not lacking:
            continue
        if len(lacking) == len(want):
            missing.append(f"log-prob drift on {kind} requests (none of them was scored under both engines)")
        else:
            named = ", ".join(repr(i) for i in lacking[:3]) + (", ..." if len(lacking) > 3 else "")
            missing.append(f"log-prob drift on {kind} requests (scored under both engines for "
                           f"{len(want) - len(lacking)} of {len(want)}; not for {named})")
    return missing


def _missing_evidence(requests: list[dict[str, Any]], *, lossy: bool, n_draws: int, samples_asked: bool,
                      drift: LogprobDrift | None, attempted: set[str], split: bool,
                      twin_missing: str | None) -> list[str]:
    """The checks that apply to a candidate and did not run (no evidence is not "ok").

    Greedy requests are compared token by token. Sampled ones need the distribution test
    (speculation must keep the sampler's distribution) or, for a lossy config (judged by drift, not
    by distribution), log-probs of the baseline's sampled paths scored under both engines. A lossy
    config with speculation (``split``) needs both: drift for its lossy part, and its speculation
    compared with the same config without it (``twin_missing``: why that reference is missing).
    """
    has_greedy = any(r["sampling"].get("temperature", 0) == 0 for r in requests)
    has_sampled = any(r["sampling"].get("temperature", 0) > 0 for r in requests)
    missing = _drift_coverage(requests, drift, attempted, greedy_gated=drift is not None) if lossy else []
    if split and twin_missing and (has_greedy or has_sampled):
        return missing + [f"speculation against the same config without speculation ({twin_missing})"]
    if has_sampled and (split or not lossy) and not n_draws:
        why = "--samples 0" if not samples_asked else "no draws to compare"
        missing.append(f"distribution test of sampled requests ({why})")
    return missing


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


@dataclass
class _Tally:
    """Per-request comparisons of a candidate with the baseline."""

    greedy: int = 0
    identical: int = 0
    first: int | None = None  # earliest token position where a greedy output diverged
    sampled: int = 0
    expect_failed: int = 0
    regressions: int = 0  # expectations the baseline met and the candidate did not
    first_regression: str = ""
    agreements: list[float] = field(default_factory=list)

    @property
    def mean_agreement(self) -> float:
        return sum(self.agreements) / len(self.agreements) if self.agreements else 1.0


def _tally(requests: list[dict[str, Any]], by_id: dict[str, Any], base_by_id: dict[str, Any]) -> _Tally:
    t = _Tally()
    for req in requests:
        rec, ref = by_id[req["id"]], base_by_id[req["id"]]
        failed = request_failures(req, rec)
        t.expect_failed += bool(failed)
        if failed and not request_failures(req, ref):
            t.regressions += 1
            if t.regressions == 1:
                t.first_regression = f"request {req['id']!r} fails {', '.join(failed)} where the baseline passed"
        if req["sampling"]["temperature"] == 0.0:
            t.greedy += 1
            a, div = agreement(rec["token_ids"], ref["token_ids"])
            t.agreements.append(a)
            t.identical += div is None
            if div is not None and (t.first is None or div < t.first):
                t.first = div
        else:
            t.sampled += 1  # sampled outputs are judged by distribution (verdict)
    return t


def _incomplete_reason(cand: list[dict[str, Any]]) -> tuple[int, str | None]:
    """How many requests did not finish, and the first one's reason (vLLM's own message where it
    rejected the request: a prompt over max_model_len, say)."""
    incomplete = [r for r in cand if not complete(r)]
    if not incomplete:
        return 0, None
    bad = incomplete[0]
    why = (bad.get("error") or "").strip().split("\n")[0][:300] or \
        (f"finish reason {bad['finish_reason']}" if bad.get("finish_reason") else "no output")
    return len(incomplete), f"{len(incomplete)} request(s) incomplete (e.g. {bad['id']!r}: {why})"


def _twin_problem(twin: Unspeculated | None, requests: list[dict[str, Any]]) -> str | None:
    """Why ``twin`` cannot serve as the reference of a lossy config's speculation (None: it can)."""
    if twin is None:
        return "not run"
    if twin.error:
        return f"its run failed: {twin.error}"
    by_id = {r["id"]: r for r in twin.outputs}
    bad = [r["id"] for r in requests if r["id"] not in by_id or not complete(by_id[r["id"]])]
    return f"{len(bad)} of its request(s) incomplete, e.g. {bad[0]!r}" if bad else None


def verdict(requests: list[dict[str, Any]], cand: list[dict[str, Any]], base: list[dict[str, Any]] | None,
            *, lossy: bool, tol: Tolerances, samples: dict[str, list[list[int]]] | None = None,
            base_samples: dict[str, list[list[int]]] | None = None,
            scores: dict[str, dict[str, Any]] | None = None,
            base_scores: dict[str, dict[str, Any]] | None = None,
            speculative: bool = False, unspeculated: Unspeculated | None = None,
            dtype: str | None = None, threshold: Threshold | None = None,
            own_scores: dict[str, dict[str, Any]] | None = None, numerics: Numerics | None = None,
            findings: tuple[str, ...] = (), self_check: bool = False) -> Verdict:
    """Judge a candidate's records against the baseline's (``base`` None: this *is* the baseline).

    ``samples``/``base_samples``: per sampled request, short samples drawn with fixed seeds; for a
    lossless candidate their first tokens must follow the baseline's distribution.
    ``scores``/``base_scores``: teacher-forced log-probs of greedy outputs (``autotune.run.replay.score_greedy``);
    reported for every candidate, gated by ``tol.max_logprob_drift`` for lossy ones.
    ``speculative`` with ``lossy``: the speculation is judged against ``unspeculated`` (the same
    config without speculation) by the lossless rules, and the lossy part by drift; both must pass.
    ``threshold``: the near-tie threshold (None: ``dtype``'s, autotune.measure.nearties.dtype_threshold).
    ``own_scores``: the candidate's teacher-forced scores of its own differing greedy outputs
    (autotune.run.replay.score_own), judged at every token; ``numerics``: the study's measured
    numerics, whose drift is the excess test's null. ``self_check``: the baseline's fresh instance
    against the first, whose flips are findings (``findings``), not faults.
    """
    by_id = {r["id"]: r for r in cand}
    budget = tol.max_drift if lossy else tol.lossless
    n_incomplete, why = _incomplete_reason(cand)
    reasons = [why] if why else []
    t = _tally(requests, by_id, {r["id"]: r for r in base} if base is not None else by_id)
    if t.first_regression:
        reasons.append(t.first_regression)
    mean_agree = t.mean_agreement
    drift = logprob_drift(scores, base_scores) if base is not None and scores and base_scores else None
    # A lossy config with log-probs is judged by them: its greedy tokens flip at near-ties (bfloat16
    # vs float32: 30 of 32 outputs differ at a drift of 0.0025 nats/token), so token agreement would
    # reject every lossy config. Without log-probs, token agreement is the gate.
    gap = (1.0 - mean_agree) - budget if lossy and drift is None else 0.0
    if gap > 0:
        reasons.append(f"drift: token agreement {mean_agree:.3f} < {1 - budget:.3f}; "
                       f"{t.greedy - t.identical}/{t.greedy} greedy outputs differ, first at token {t.first}")
    th = threshold or dtype_threshold(dtype)
    flips: TokenJudgement | None = None
    if not lossy:  # speculation alone: every token of every differing greedy output judged
        flips = judge_greedy(requests, by_id, {r["id"]: r for r in base} if base is not None else by_id,
                             own_scores, base_scores, th, numerics, alpha=tol.alpha, findings=findings)
        gap, why = (0.0, "") if self_check else flips.failure(budget)
        reasons += [f"greedy mismatch (speculation should be lossless): {why}"] if why else []
    split = lossy and speculative and base is not None
    twin_missing = _twin_problem(unspeculated, requests) if split else None
    dist_p, n_draws, dist_gap, spec_agree = None, 0, 0.0, None
    sv: SampledVerdict | None = None
    dist_p_band: float | None = None
    if split and unspeculated is not None and twin_missing is None:
        # Speculation alone is lossless, so it must keep the lossy config's own tokens and sampler:
        # the same checks a lossless candidate meets against the baseline.
        # Margins from this config's own scores of the baseline's paths (a prefill: no draft verified),
        # where the reference run followed that path up to its flip.
        st = _tally(requests, by_id, {r["id"]: r for r in unspeculated.outputs})
        spec_agree = st.mean_agreement
        flips = judge_greedy(requests, by_id, {r["id"]: r for r in unspeculated.outputs}, own_scores, None, th,
                             numerics, alpha=tol.alpha)
        spec_gap, why = flips.failure(tol.lossless)
        if why:
            gap = max(gap, spec_gap)
            reasons.append(f"greedy mismatch against the same config without speculation (speculation should "
                           f"be lossless): {why}")
        if samples and unspeculated.samples:
            sv = judge_samples(unspeculated.samples, samples, temperatures_of(requests), th, alpha=tol.alpha)
            if sv.flagged:
                dist_gap = tol.alpha - sv.p_band
                reasons.append(sv.failure("the same config without speculation"))
    elif not split and base is not None and samples and base_samples:
        sv = judge_samples(base_samples, samples, temperatures_of(requests), th, alpha=tol.alpha)
        # Speculation must keep the sampler's distribution; lossy configs are judged by drift alone.
        if not lossy and sv.flagged:
            dist_gap = tol.alpha - sv.p_band
            reasons.append(sv.failure("the baseline's"))
    if sv is not None:  # a lossy config's own draws against the baseline's: reported, not judged
        dist_p, n_draws, dist_p_band = sv.p, sv.draws, sv.p_band
    lp_gap, lp_note = 0.0, ""
    if drift is not None:
        detail, lp_note = drift_note(drift)
        if lossy and drift.mean > tol.max_logprob_drift:
            lp_gap = drift.mean - tol.max_logprob_drift
            reasons.append(f"log-prob drift {drift.mean:.3g} nats/token > {tol.max_logprob_drift:g} ({detail})")
    attempted = set(base_scores or {}) | set(scores or {})
    missing = [] if base is None else _missing_evidence(requests, lossy=lossy, n_draws=n_draws,
                                                        samples_asked=bool(samples), drift=drift,
                                                        attempted=attempted, split=split, twin_missing=twin_missing)
    if base is not None and flips is not None and (unjudged := flips.missing()) and not self_check:
        missing.append(unjudged)
    status = "failed" if reasons else ("unverified" if missing else "ok")
    reason = "; ".join(reasons) or ("unverified: not checked: " + "; ".join(missing) if missing else "ok")
    if not reasons and flips is not None and (flips.differ or flips.findings):  # passed with flips: say so
        reason += f" ({flips.text()}" + "".join(f"; {f}" for f in flips.findings) + ")"
    elif base is None and flips is not None and flips.excess is not None:  # the baseline: the numerics it measured
        reason += f" (near-tie threshold {th.value:.3g} nats, {th.source}; its own decodes: {flips.excess.text()})"
    if not reasons and sv is not None and sv.p < tol.alpha and not (lossy and not split):  # within the band: say so
        reason += f" ({sv.note()})"
    unverified_gap = 1.0 if status == "unverified" and not tol.allow_unverified else 0.0
    if lossy and lp_note and not lp_gap:  # within budget, still worth seeing (beside a token drift, say)
        reason += f"{'; ' if reasons else ', '}{lp_note} within {tol.max_logprob_drift:g}" + \
            (f" (token agreement {mean_agree:.3f}, {t.greedy - t.identical}/{t.greedy} greedy outputs differ)"
             if t.identical < t.greedy else "")
    return Verdict(passed=not reasons, reason=reason, greedy_requests=t.greedy,
                   greedy_identical=t.identical, token_agreement=mean_agree, first_divergence=t.first,
                   expect_failed=t.expect_failed, expect_regressions=t.regressions, sampled_requests=t.sampled,
                   distribution_p=dist_p, distribution_samples=n_draws, distribution_p_band=dist_p_band,
                   logprob_drift=None if drift is None else drift.mean,
                   logprob_drift_max=None if drift is None else drift.max,
                   logprob_kl=None if drift is None else drift.kl, logprob_tokens=0 if drift is None else drift.tokens,
                   budget=budget,
                   constraints=(gap, float(t.regressions), float(n_incomplete), dist_gap, lp_gap, unverified_gap),
                   status=status, unverified=tuple(missing), speculation_agreement=spec_agree,
                   **(flips.fields() if flips is not None else {}))

