"""Lossless at every token: a greedy output passes only where each of its tokens is the target's own
top choice given the tokens before it, up to the study's measured numerics.

Greedy speculative decoding is lossless when every emitted token is the target's argmax after the
tokens before it. So every greedy output that differs from its reference's is scored teacher-forced
under the target without speculation (one prefill of prompt + that output with prompt log-probs, in
the candidate's own engine: a prefill verifies no draft; autotune.run.replay.score_own), and every
position from its first difference on is judged: the emitted token is a top token, or within the
threshold (autotune.measure.numerics) of the top one ("excused"), or it is a fault. One fault fails
the output; an output with no scores cannot be judged token by token (``UNSCORED``).

A fault that lives at near-ties (accepting drafts that nearly tie the top token, say) is excused at
every position it acts. It shows in the count: over every greedy position of the run, the excused
positions against what numerics alone predict there, the sum over positions of the null rate at each
position's lead (autotune.measure.numerics.Numerics.null_rate, from the baseline's own drift). The
excess test is one-sided Poisson: P(X >= excused | mean predicted), conservative for the sum of
independent Bernoullis it stands for.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from scipy.stats import poisson

from autotune.measure.nearties import FAULT, NEAR, UNSCORED, Threshold, first_flip
from autotune.measure.numerics import Numerics, top_gap


OWN_DECODE = "its own decode with speculation"  # how a fault its own decode's ranks show begins (own_rank_fault)


@dataclass(frozen=True)
class Judged:
    """One differing greedy output, judged position by position from its first difference."""

    request: str
    kind: str  # NEAR (every position the top token or excused), FAULT or UNSCORED
    first: int  # its first differing position
    excused: tuple[float, ...] = ()  # the margins of its excused positions
    fault: tuple[int, float] | None = None  # the first fault's (position, margin)
    why: str = ""

    def describe(self) -> str:
        if self.fault is not None:
            why = f": {self.why}" if self.why.startswith(OWN_DECODE) else ""
            return f"request {self.request!r} at token {self.fault[0]} (margin {self.fault[1]:.3g} nats){why}"
        return f"request {self.request!r} at token {self.first} ({self.why})"


def _own_path(score: dict[str, Any] | None, tokens: list[int]) -> bool:
    return bool(score) and "logprobs" in score and score["token_ids"] == tokens  # type: ignore[index]


def judge_output(rid: str, cand: list[int], ref: list[int], own: dict[str, Any] | None,
                 ref_score: dict[str, Any] | None, threshold: Threshold) -> Judged | None:
    """Judge a greedy output against its reference (None: identical). ``own``: the candidate's
    teacher-forced scores of its own output, with under ``decoded`` its own decode of the request with
    log-probs, where one ran (a token it ranked below the top fails the output: ``own_rank_fault``);
    ``ref_score``: the reference's of its own (for the first divergence alone, where ``own`` is
    missing: a fault there still fails the output)."""
    if cand == ref:
        return None
    ranked = own_rank_fault((own or {}).get("decoded"))
    n = next((i for i, (x, y) in enumerate(zip(cand, ref)) if x != y), min(len(cand), len(ref)))
    if ranked is not None:
        i, m = ranked
        return Judged(rid, FAULT, n, fault=(i, m), why=f"{OWN_DECODE} emitted, at token {i}, a token its target "
                      f"ranked {m:.3g} nats under the top one (an acceptance fault)")
    if n >= min(len(cand), len(ref)):
        longer = "the candidate's" if len(cand) > len(ref) else "the reference's"
        return Judged(rid, FAULT, n, fault=None, why=f"one output ends at token {n} where {longer} goes on, "
                      "the same tokens up to there")
    if not _own_path(own, cand):
        flip = first_flip(rid, cand, ref, ref_score, threshold)
        why = (own or {}).get("error") or "no teacher-forced scores of the candidate's output"
        if flip is not None and flip.kind == FAULT:
            return Judged(rid, FAULT, n, fault=(n, flip.margin) if flip.margin is not None else None,
                          why=flip.why or f"margin {flip.margin:.3g} nats at its first divergence")
        return Judged(rid, UNSCORED, n, why=why)
    excused: list[float] = []
    for i in range(n, len(cand)):
        m, _ = top_gap(own["top"][i], cand[i], own["logprobs"][i])  # type: ignore[index]
        if m <= 0:
            continue
        if m >= threshold.value:
            return Judged(rid, FAULT, n, tuple(excused), fault=(i, m))
        excused.append(m)
    return Judged(rid, NEAR, n, tuple(excused))


def own_rank_fault(decoded: dict[str, Any] | None) -> tuple[int, float] | None:
    """The first position where an engine's own decode (with speculation, log-probs asked:
    autotune.run.replay.score_own) emitted a token its target ranked below another, as (position,
    margin in nats); None where every emitted token is a top token, or there is no such decode.

    vLLM computes a speculative step's log-probs from the target's raw logits of that verification
    pass, apart from the acceptance that picks the tokens (vllm/v1/sample/rejection_sampler.py,
    ``_get_logprobs_tensors`` on ``raw_target_logits``), and greedy acceptance keeps a draft only where
    it is the argmax of those logits; Model Runner V2 likewise (vllm/v1/worker/gpu/spec_decode/
    rejection_sampler.py, raw logits unless a processed logprobs_mode is set). So a lossless engine
    emits top tokens at every position by construction (a tie is a margin of 0: vLLM's own rank on
    MRV2 counts ties against the token, so the margin is read from the values), whatever its numerics, and a token below the top is its
    acceptance passing a draft the target did not choose, at any margin: the near-tie band's blind
    spot. Requests whose logits a processor changes (penalties, biases, grammars, min_tokens) are not
    decoded for it (autotune.run.replay.plain_greedy)."""
    if not decoded or "logprobs" not in decoded or "top" not in decoded:
        return None
    for i, (t, lp, top) in enumerate(zip(decoded["token_ids"], decoded["logprobs"], decoded["top"])):
        m, _ = top_gap(top, t, lp)
        if m > 0:
            return i, m
    return None


@dataclass(frozen=True)
class Excess:
    """The excused positions of a run against what numerics alone predict there."""

    excused: int
    expected: float
    positions: int
    p: float

    def text(self) -> str:
        return (f"{self.excused} excused position(s) in {self.positions} where the baseline's own drift predicts "
                f"at most {self.expected:.2g} (p={self.p:.2g})")


def excess(positions: list[tuple[float, float]], numerics: Numerics | None, threshold: Threshold) -> Excess | None:
    """``positions``: (the emitted token's margin under the top, the top's lead over the next) at every
    greedy position. Excused: a margin in (0, threshold); predicted: the null rate summed over leads
    under the threshold. None where no drift was measured (no null to test against)."""
    if numerics is None or numerics.drift is None:
        return None
    x = sum(0 < m < threshold.value for m, _ in positions)
    lam = sum(numerics.null_rate(lead) or 0.0 for _, lead in positions if lead < threshold.value)
    p = 1.0 if x == 0 else float(poisson.sf(x - 1, lam)) if lam > 0 else 0.0
    return Excess(x, lam, len(positions), p)


def _positions(score: dict[str, Any] | None, tokens: list[int]) -> list[tuple[float, float]]:
    if not _own_path(score, tokens):
        return []
    return [top_gap(top, t, lp) for t, lp, top in zip(tokens, score["logprobs"], score["top"])]  # type: ignore[index]


@dataclass(frozen=True)
class TokenJudgement:
    """Every greedy output of a run against its reference, judged at every token."""

    greedy: int
    differ: int
    passed: int  # differing outputs with every token the top one or within the threshold
    faults: int
    unscored: int
    threshold: Threshold
    first_fault: Judged | None
    flips: tuple[tuple[str, float], ...]  # (request, margin): every excused position, each faulty output's first fault
    excess: Excess | None
    alpha: float
    findings: tuple[str, ...] = field(default_factory=tuple)
    # mean token agreement, outputs within numerics counted as agreeing: what unscored outputs are held to
    agreement: float = 1.0

    @property
    def excess_flagged(self) -> bool:
        return self.excess is not None and self.excess.p < self.alpha

    def fields(self) -> dict[str, Any]:
        """The verdict's fields (autotune.measure.validate.Verdict)."""
        e = self.excess
        return {"near_ties": self.passed, "flip_faults": self.faults, "flips_unscored": self.unscored,
                "near_tie_threshold": self.threshold.value, "near_tie_source": self.threshold.source,
                "flip_margins": tuple(m for _, m in self.flips), "excused_positions": None if e is None else e.excused,
                "excused_expected": None if e is None else e.expected, "excused_p": None if e is None else e.p,
                "judged_positions": None if e is None else e.positions, "numerics_findings": self.findings}

    def text(self) -> str:
        """``3/32 greedy outputs differ: 2 within numerics at every token, 1 not (first: ...); ...``."""
        parts = [f"{self.passed} within numerics at every token", f"{self.faults} not"]
        if self.unscored:
            parts.append(f"{self.unscored} not scored")
        head = f"{self.differ}/{self.greedy} greedy outputs differ: " + ", ".join(parts)
        first = f" (first: {self.first_fault.describe()})" if self.first_fault else ""
        count = f"; {self.excess.text()}" if self.excess is not None and self.excess.excused else ""
        return f"{head}{first}{count}; near-tie threshold {self.threshold.value:.3g} nats ({self.threshold.source})"

    def failure(self, budget: float) -> tuple[float, str]:
        """The constraint (> 0 fails) and the reason ("" passes). Outputs not scored are held to the
        token-agreement ``budget`` as well (and leave the verdict unverified: ``missing``)."""
        if self.faults:
            return float(self.faults), self.text()
        if self.unscored and (gap := (1.0 - self.agreement) - budget) > 0:
            return gap, f"token agreement {self.agreement:.3f} < {1 - budget:.3f} (outputs within numerics " \
                        f"counted as agreeing); {self.text()}"
        if self.excess_flagged:
            assert self.excess is not None
            return self.alpha - self.excess.p, (f"too many excused positions for numerics alone ({self.excess.text()}, "
                                                f"< {self.alpha:g}): {self.text()}")
        return 0.0, ""

    def missing(self) -> str | None:
        """Why the verdict lacks evidence (unscored differing outputs), or None."""
        if not self.unscored:
            return None
        return (f"every token of {self.unscored} differing greedy output(s) (not scored teacher-forced)")


def judge_greedy(requests: list[dict[str, Any]], by_id: dict[str, Any], ref_by_id: dict[str, Any],
                 own_scores: dict[str, dict[str, Any]] | None, ref_scores: dict[str, dict[str, Any]] | None,
                 threshold: Threshold, numerics: Numerics | None, *, alpha: float,
                 findings: tuple[str, ...] = ()) -> TokenJudgement:
    """Every greedy request's output against its reference's, at every token, and the excess test
    over every greedy position (scored by the candidate where it scored its output, else by the
    reference's scores of the same tokens)."""
    own, ref_s = own_scores or {}, ref_scores or {}
    judged: list[Judged] = []
    positions: list[tuple[float, float]] = []
    agreements: list[float] = []
    greedy = 0
    for req in requests:
        if req["sampling"].get("temperature", 0) != 0:
            continue
        greedy += 1
        rid = req["id"]
        cand, ref = by_id[rid]["token_ids"], ref_by_id[rid]["token_ids"]
        j = judge_output(rid, cand, ref, own.get(rid), ref_s.get(rid), threshold)
        if j is not None:
            judged.append(j)
        agreements.append(1.0 if j is None or j.kind == NEAR else j.first / max(len(cand), len(ref)))
        positions += _positions(own.get(rid), cand) or _positions(ref_s.get(rid), cand)
    faults = [j for j in judged if j.kind == FAULT]
    first = min(faults, key=lambda j: j.fault[0] if j.fault else j.first) if faults else None
    flips = tuple((j.request, m) for j in judged for m in j.excused) + \
        tuple((j.request, j.fault[1]) for j in faults if j.fault)
    return TokenJudgement(greedy=greedy, differ=len(judged), passed=sum(j.kind == NEAR for j in judged),
                          faults=len(faults), unscored=sum(j.kind == UNSCORED for j in judged), threshold=threshold,
                          first_fault=first, flips=flips, excess=excess(positions, numerics, threshold),
                          alpha=alpha, findings=findings,
                          agreement=sum(agreements) / len(agreements) if agreements else 1.0)
