"""Near-tie flips and faults: where a greedy output first parts from its reference, was the
reference nearly tied there (numerics), or sure of its token (a fault)?

vLLM promises speculation equal to the baseline "up to numerics": in bfloat16 on a GPU, verifying
k+1 tokens runs other matmul and attention shapes than decoding one, and batches change shape with
the load, so a greedy output flips where the reference's top two tokens were nearly tied. After
its first differing token a request's two texts are no longer comparable, so only that token is
judged: the reference's margin there (its log-prob of its own token minus its log-prob of the
candidate's, from its teacher-forced scores, autotune.run.replay.score_greedy, top 5) below the
threshold is numerics; at or above it, or the candidate's token outside the reference's top 5, a
fault. A request with no scores there (past the scored 64, or one text a prefix of the other) is
"unscored" and judged by token agreement, as before.

The threshold comes per dtype from its rounding at the model's logit scale (``dtype_threshold``),
widened, never narrowed, by the margins of flips the baseline shows against a fresh instance of
itself (``widen``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# Significand bits (the implicit one included): bfloat16 8, float16 11, float32 24 (IEEE 754; torch.finfo).
DTYPE_BITS = {"bfloat16": 8, "float16": 11, "half": 11, "float32": 24, "float": 24}
# The logit magnitude the rounding is taken at. An assumption, not a measurement: large models'
# top logits are tens of nats; the demo target's are smaller (benchmarks/data/near_ties.json).
LOGIT_SCALE = 32.0
# A dtype not known (a served run of a config left to vLLM's "auto"): the widest of the 16-bit ones,
# so that a lossless method is not rejected for numerics, at the cost of excusing flips below it.
UNKNOWN_DTYPE = "bfloat16"
NEAR, FAULT, UNSCORED = "near-tie", "fault", "unscored"


@dataclass(frozen=True)
class Threshold:
    """Margins (nats) below ``value`` are numerics; ``source`` says where it came from."""

    value: float
    source: str


def dtype_threshold(dtype: str | None, logit_scale: float = LOGIT_SCALE) -> Threshold:
    """Twice one logit's rounding error (relative 2^-bits at ``logit_scale``): two logits each off
    by that much can swap when they were closer than twice it."""
    name = (dtype or "").removeprefix("torch.").lower()
    known = name in DTYPE_BITS
    bits = DTYPE_BITS[name if known else UNKNOWN_DTYPE]
    value = 2 * logit_scale * 2.0 ** -bits
    return Threshold(value, f"{name if known else UNKNOWN_DTYPE} rounding at logit scale {logit_scale:g}"
                     + ("" if known else f" (dtype {dtype or 'auto'} not known: {UNKNOWN_DTYPE} assumed)"))


def widen(th: Threshold, floor: list[float]) -> Threshold:
    """The threshold widened to just above the largest margin at which the baseline flipped
    against a fresh instance of itself (such a flip is numerics by definition); never narrowed."""
    if not floor or max(floor) < th.value:
        return th if not floor else Threshold(th.value, f"{th.source}; {len(floor)} baseline-vs-baseline "
                                                        f"flip(s), all below it")
    top = max(floor)
    return Threshold(math.nextafter(top, math.inf), f"widened from {th.value:.3g} ({th.source}) by "
                     f"{len(floor)} baseline-vs-baseline flip(s), largest margin {top:.3g}")


@dataclass(frozen=True)
class Flip:
    """A greedy request's first divergence from its reference."""

    request: str
    position: int
    margin: float | None  # the reference's margin there (None: unscored, or outside its top 5)
    kind: str  # NEAR, FAULT or UNSCORED
    why: str = ""


def margin_at(score: dict[str, Any] | None, prefix: list[int], own: int, other: int) -> tuple[float | None, str]:
    """The scored engine's log-prob of ``own`` minus that of ``other`` after ``prefix``, from its
    teacher-forced scores (None with the reason when they do not say: a path that left ``prefix``,
    or ``own`` not in its top 5; ``other`` not in it is reported as "outside")."""
    n = len(prefix)
    if not score or "logprobs" not in score or score["token_ids"][:n] != prefix or n >= len(score["logprobs"]):
        return None, "unscored"
    lps = {int(t): lp for t, lp in score["top"][n]}
    lps[int(score["token_ids"][n])] = score["logprobs"][n]
    if own not in lps:
        return None, "unscored"
    if other not in lps:
        return None, "outside"
    return lps[own] - lps[other], ""


def first_flip(rid: str, cand: list[int], ref: list[int], score: dict[str, Any] | None,
               threshold: Threshold) -> Flip | None:
    """Judge a request's first divergence (None: identical)."""
    if cand == ref:
        return None
    n = next((i for i, (x, y) in enumerate(zip(cand, ref)) if x != y), min(len(cand), len(ref)))
    if n >= min(len(cand), len(ref)):  # one ended where the other went on: no token to weigh
        return Flip(rid, n, None, UNSCORED, "one output is a prefix of the other")
    m, why = margin_at(score, ref[:n], ref[n], cand[n])
    if why == "outside":
        return Flip(rid, n, None, FAULT, "the candidate's token is outside the reference's top 5")
    if m is None:
        return Flip(rid, n, None, UNSCORED, "no scores at that token")
    return Flip(rid, n, m, NEAR if m < threshold.value else FAULT)


def describe(flip: Flip) -> str:
    """``request 'x' at token 40 (margin 3.1 nats)``."""
    what = f"margin {flip.margin:.3g} nats" if flip.margin is not None else flip.why
    return f"request {flip.request!r} at token {flip.position} ({what})"


@dataclass(frozen=True)
class FlipCount:
    """Greedy outputs that differ from their reference, by kind, and the threshold they were judged by."""

    differ: int
    near: int
    faults: int
    unscored: int
    threshold: Threshold
    first_fault: Flip | None
    margins: tuple[float, ...]  # every scored first divergence's margin (near-ties and faults)

    def fields(self) -> dict[str, Any]:
        """The verdict's fields (autotune.measure.validate.Verdict)."""
        return {"near_ties": self.near, "flip_faults": self.faults, "flips_unscored": self.unscored,
                "near_tie_threshold": self.threshold.value, "near_tie_source": self.threshold.source,
                "flip_margins": self.margins}

    def text(self, greedy: int) -> str:
        """``3/32 greedy outputs differ: 2 at near-ties, 1 not (...); threshold 0.25 nats (...)``."""
        parts = [f"{self.near} at near-ties", f"{self.faults} not"]
        if self.unscored:
            parts.append(f"{self.unscored} unscored")
        head = f"{self.differ}/{greedy} greedy outputs differ: " + ", ".join(parts)
        first = f" (first: {describe(self.first_fault)})" if self.first_fault else ""
        return f"{head}{first}; near-tie threshold {self.threshold.value:.3g} nats ({self.threshold.source})"


def count_flips(flips: list[Flip], threshold: Threshold) -> FlipCount:
    faults = [f for f in flips if f.kind == FAULT]
    return FlipCount(differ=len(flips), near=sum(f.kind == NEAR for f in flips), faults=len(faults),
                     unscored=sum(f.kind == UNSCORED for f in flips), threshold=threshold,
                     first_fault=min(faults, key=lambda f: f.position) if faults else None,
                     margins=tuple(f.margin for f in flips if f.margin is not None))


def flip_gap(flips: FlipCount, excused: float, budget: float, greedy: int) -> tuple[float, str]:
    """The constraint and the reason of greedy flips judged by their first divergence: a fault fails
    (one per fault); unscored flips are held to the token-agreement budget, near-ties counted as agreeing."""
    gap = (1.0 - excused) - budget
    if flips.faults:
        return max(gap, float(flips.faults)), flips.text(greedy)
    if gap > 0:
        return gap, f"token agreement {excused:.3f} < {1 - budget:.3f} (near-ties excused); {flips.text(greedy)}"
    return gap, ""


def judge_flips(requests: list[dict[str, Any]], by_id: dict[str, Any], ref_by_id: dict[str, Any],
                scores: dict[str, dict[str, Any]] | None, threshold: Threshold) -> tuple[FlipCount, float]:
    """Every greedy request's first divergence from its reference, counted by kind, and the mean
    token agreement with near-tie requests counted as agreeing (what the unscored ones are judged by)."""
    flips: list[Flip] = []
    agreements: list[float] = []
    for req in requests:
        if req["sampling"].get("temperature", 0) != 0:
            continue
        cand, ref = by_id[req["id"]]["token_ids"], ref_by_id[req["id"]]["token_ids"]
        flip = first_flip(req["id"], cand, ref, (scores or {}).get(req["id"]), threshold)
        if flip is not None:
            flips.append(flip)
        # token agreement as autotune.measure.validate.agreement has it: common prefix over the longer
        agreements.append(1.0 if flip is None or flip.kind == NEAR else flip.position / max(len(cand), len(ref)))
    return count_flips(flips, threshold), sum(agreements) / len(agreements) if agreements else 1.0


def run_dtype(reported: str | None, engine_kwargs: dict[str, Any]) -> str | None:
    """The dtype a run computed in: the engine's own word (vLLM's resolved ``model_config.dtype``),
    else the one asked for, else the checkpoint's (a float32 one is left unknown: vLLM's "auto"
    downcasts it to the platform's first supported dtype, vllm/config/model.py ``_resolve_auto_dtype``)."""
    from autotune.core.candidate import model_configs

    if reported:
        return reported
    asked = str(engine_kwargs.get("dtype") or "auto")
    if asked != "auto":
        return asked
    for c in model_configs(str(engine_kwargs.get("model", ""))):
        found = c.get("dtype") or c.get("torch_dtype")
        if isinstance(found, str) and found.lower() not in ("float32", "float"):
            return found
    return None
