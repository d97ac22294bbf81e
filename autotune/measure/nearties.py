"""Near-tie flips and faults at a greedy output's first divergence from its reference, and the
dtype's rounding that bounds numerics.

vLLM promises speculation equal to the baseline "up to numerics": in bfloat16 on a GPU, verifying
k+1 tokens runs other matmul and attention shapes than decoding one, and batches change shape with
the load, so a greedy output flips where the reference's top two tokens were nearly tied. Every
token of a differing output is judged by autotune.measure.every_token, against a threshold measured
per study (autotune.measure.numerics); this module keeps the pieces that rule stands on: the
dtype's rounding at a logit scale (``dtype_threshold``, the threshold's floor), and the first
divergence judged by the reference's own scores (``first_flip``: the reference's margin there, its
log-prob of its own token minus that of the candidate's, top 5), which still fails an output whose
own scores are missing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Significand bits (the implicit one included): bfloat16 8, float16 11, float32 24 (IEEE 754; torch.finfo).
DTYPE_BITS = {"bfloat16": 8, "float16": 11, "half": 11, "float32": 24, "float": 24}
# The logit magnitude the rounding is taken at where the logits' grid cannot be read (float32, an
# unknown dtype; autotune.measure.numerics.logit_scale): large models' top logits are tens of nats.
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
