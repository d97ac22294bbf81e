"""The numerics a study's greedy verdicts allow, measured on its own baseline.

Speculation verifies k+1 tokens in one pass where plain decoding runs one, and a prefill scores
many: other matmul and attention shapes, so the logits move by the dtype's rounding, and a greedy
token flips where the top two were closer than that. How far they move is this model's, this
platform's and this dtype's own: the baseline measures it once per study. After its measured windows
it decodes (a sample of) its greedy requests again with their top log-probs (``decode``) and scores
the same tokens teacher-forced in one prefill (``scores``, autotune.run.replay); the **drift** is the
decoded token's log-prob under the two shapes, |decode - prefill|, at every position.

The **threshold** is ``DRIFT_MULT`` times its ``DRIFT_QUANTILE`` quantile (twice: at a tie a margin
moves twice as far as each token's log-prob), never below the dtype's rounding at the model's own
logit scale (autotune.measure.nearties.dtype_threshold). That scale is read from the logits: in a
16-bit dtype every logit is on the dtype's grid, so the difference of the top two log-probs (a
difference of two logits) is a multiple of the grid's step, which says the logits' binade
(``logit_scale``). In float32 the step is below the scores' 1e-5 resolution: the scale is assumed.

The drift is also the **null** of the excess test (autotune.measure.every_token): under numerics alone
a position whose top token leads by m nats flips with probability at most ``null_rate(m)``, the
share of the baseline's positions whose top-two lead moved by m between decode and prefill.

A baseline's fresh instance that flips against the first widens the threshold (numerics by
definition), but only up to ``CAP_MULT`` times it (``widen``): a flip above the cap is a finding
("the baseline does not reproduce itself"), reported and widening nothing.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from autotune.measure.nearties import DTYPE_BITS, LOGIT_SCALE, Threshold, dtype_threshold

DRIFT_MULT = 2.0  # threshold: this many times the drift's high quantile (a tie's margin moves twice as far)
DRIFT_QUANTILE = 0.999
CAP_MULT = 2.0  # a baseline's own flips widen the threshold up to this many times it, no further
TAIL_POINTS = 512  # the drift's nonzero values kept (as quantiles) for the null
GRID_MIN_POSITIONS = 20  # positions needed to read the logits' grid
NEAR_LEAD = 1.0  # positions whose top two lead by less (nats) read the top logit's own binade
GRID_STEPS = range(8, -11, -1)  # the grid steps tried, 2^8 down to 2^-10 nats (finer is below the scores' 1e-5)
GRID_TOL = 3e-5  # scores are rounded to 1e-5 (autotune.run.replay); their float32 error is below it
# A grid that says the logits are larger than this is no grid (round numbers, as a fake engine's):
# language models' top logits are tens of nats (the demo target's at most 24, benchmarks/data/near_ties.json).
GRID_MAX_SCALE = 128.0


def top_gap(top: list[list[float]], own: int, own_lp: float) -> tuple[float, float]:
    """At one scored position: the top log-prob minus the emitted token's (0: it is a top token),
    and the top minus the best log-prob below it (inf: nothing below it in the top k)."""
    lps = {int(t): float(lp) for t, lp in top}
    lps[int(own)] = float(own_lp)
    best = max(lps.values())
    below = [lp for lp in lps.values() if lp < best]
    return best - float(own_lp), best - max(below) if below else math.inf


def _quantile(xs: list[float], q: float) -> float:
    return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))] if xs else 0.0


@dataclass(frozen=True)
class Tail:
    """A drift's distribution, kept small: how many positions, how many moved, and the moves at
    ``TAIL_POINTS`` quantiles (ascending)."""

    positions: int
    nonzero: int
    values: tuple[float, ...] = ()

    @staticmethod
    def of(xs: list[float]) -> Tail:
        moved = sorted(x for x in xs if x > 0)
        step = max(1, len(moved) // TAIL_POINTS)
        return Tail(len(xs), len(moved), tuple(round(x, 7) for x in moved[step - 1::step]))

    def share_at_least(self, x: float) -> float:
        """The share of positions whose drift reached ``x``."""
        if x <= 0:
            return 1.0
        if not self.positions or not self.values or x > self.values[-1]:
            return 0.0
        return sum(v >= x for v in self.values) / len(self.values) * self.nonzero / self.positions


@dataclass(frozen=True)
class Drift:
    """The baseline's drift between decode and prefill shapes: each decoded token's log-prob (the
    threshold's measure), and the lead of the prefill's top token over its runner-up (the null's: a
    flip needs the lead to move, and at a sure position a logit's move barely shows in the token's
    log-prob, so the token's drift alone would understate how often leads move)."""

    positions: int
    requests: int
    max: float
    quantile: float  # DRIFT_QUANTILE's, of the token's drift
    p99: float
    token: Tail
    lead: Tail

    @property
    def lead_max(self) -> float:
        return self.lead.values[-1] if self.lead.values else 0.0


def _lead_move(dec: list[list[float]], pre: list[list[float]]) -> float | None:
    """How far the prefill's top-two lead moved in the decode, where the decode's top k holds both."""
    p = sorted(((float(lp), int(t)) for t, lp in pre), reverse=True)
    d = {int(t): float(lp) for t, lp in dec}
    if len(p) < 2 or p[0][1] not in d or p[1][1] not in d:
        return None
    return abs((d[p[0][1]] - d[p[1][1]]) - (p[0][0] - p[1][0]))


def measure_drift(decode: dict[str, dict[str, Any]], scores: dict[str, dict[str, Any]]) -> Drift | None:
    """Each decoded token's log-prob against its teacher-forced one, and each position's top-two lead,
    on the common prefix of the decoded path and the scored one (both are the baseline's greedy
    output; they part only where its own decodes do). ``decode``, ``scores``: request id ->
    {token_ids, logprobs, top}."""
    diffs: list[float] = []
    leads: list[float] = []
    requests = 0
    for rid, d in decode.items():
        s = scores.get(rid)
        if not s or "logprobs" not in s or "logprobs" not in d:
            continue
        n = 0
        for a, b in zip(d["token_ids"], s["token_ids"]):
            if a != b:
                break
            n += 1
        diffs += [abs(x - y) for x, y in zip(d["logprobs"][:n], s["logprobs"][:n])]
        leads += [m for dt, st in zip(d["top"][:n], s["top"][:n]) if (m := _lead_move(dt, st)) is not None]
        requests += n > 0
    if not diffs:
        return None
    diffs.sort()
    return Drift(positions=len(diffs), requests=requests, max=diffs[-1], quantile=_quantile(diffs, DRIFT_QUANTILE),
                 p99=_quantile(diffs, 0.99), token=Tail.of(diffs), lead=Tail.of(leads))


def _grid_step(d: float) -> int | None:
    """The largest power of two (its exponent) that ``d`` is a multiple of, within the scores' rounding."""
    for j in GRID_STEPS:
        k = d / 2.0 ** j
        if round(k) >= 1 and abs(d - round(k) * 2.0 ** j) <= GRID_TOL:
            return j
    return None


def logit_scale(scores: dict[str, dict[str, Any]], dtype: str | None) -> tuple[float | None, str]:
    """The logits' magnitude read from the grid of a 16-bit dtype, and how it was read (None: not
    readable). A value in [2^e, 2^(e+1)) has step 2^(e - bits + 1); the difference of two logits is a
    multiple of the smaller one's step, so its largest power-of-two divisor (more by chance for an even
    multiple) bounds that step from above. The median over positions of 2^(step exponent + bits), the
    top of that binade, is the scale: over the positions whose top two lead by under ``NEAR_LEAD``
    where there are ``GRID_MIN_POSITIONS`` of them (both logits in one binade: the top's, where ties
    are), else over all (the runner-up's binade where the lead is large: a smaller scale)."""
    name = (dtype or "").removeprefix("torch.").lower()
    bits = DTYPE_BITS.get(name)
    if bits is None or bits > 11:
        return None, f"{name or 'the dtype unknown'}: no grid above the scores' resolution"
    gaps = [lps[0] - lps[1] for s in scores.values() for lp, top in zip(s.get("logprobs", ()), s.get("top", ()))
            if len(lps := sorted({float(x) for _, x in top} | {float(lp)}, reverse=True)) > 1]
    near = [g for g in gaps if g < NEAR_LEAD]
    chosen, which = (near, f"leads under {NEAR_LEAD:g} nats") if len(near) >= GRID_MIN_POSITIONS else (gaps, "all leads")
    steps = [j for g in chosen if (j := _grid_step(g)) is not None]
    if len(chosen) < GRID_MIN_POSITIONS or len(steps) < 0.8 * len(chosen):
        return None, f"no {name} grid in {len(chosen)} scored positions"
    scale = 2.0 ** (statistics.median_low(steps) + bits)
    if scale > GRID_MAX_SCALE:
        return None, f"the {name} grid read says logits of {scale:g}, above {GRID_MAX_SCALE:g}: not a grid"
    return scale, f"measured: the median step of the top two logits on the {name} grid, {len(steps)} positions ({which})"


@dataclass(frozen=True)
class Numerics:
    """What a study's greedy verdicts allow: the threshold, what it was made of, and the drift (the
    excess test's null). Stored in the study (autotune.core.attrs.NUMERICS) as ``to_dict()``."""

    threshold: Threshold
    dtype: str | None
    floor: float  # the dtype's rounding at the logit scale
    scale: float  # the logit scale the floor is taken at
    scale_source: str
    drift: Drift | None = None
    cap: float = 0.0  # a baseline's own flips widen the threshold up to here

    def null_rate(self, margin: float) -> float | None:
        """At most the chance that numerics flip a top token that leads by ``margin`` nats: the share
        of the baseline's positions whose lead moved that far between decode and prefill, counted one
        more (no drift measured: None)."""
        if self.drift is None:
            return None
        if margin <= 0:
            return 1.0
        lead = self.drift.lead
        return (1.0 + lead.positions * lead.share_at_least(margin)) / (1.0 + lead.positions)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["threshold"] = {"value": self.threshold.value, "source": self.threshold.source}
        return out

    @staticmethod
    def from_dict(d: dict[str, Any] | None) -> Numerics | None:
        if not d:
            return None
        dd = d.get("drift")
        drift = Drift(**{**dd, "token": _tail(dd["token"]), "lead": _tail(dd["lead"])}) if dd else None
        return Numerics(threshold=Threshold(**d["threshold"]), dtype=d.get("dtype"), floor=d["floor"],
                        scale=d["scale"], scale_source=d.get("scale_source", ""), drift=drift, cap=d.get("cap", 0.0))


def _tail(d: dict[str, Any]) -> Tail:
    return Tail(d["positions"], d["nonzero"], tuple(d.get("values", ())))


def measure_numerics(dtype: str | None, scores: dict[str, dict[str, Any]] | None,
                     decode: dict[str, dict[str, Any]] | None) -> Numerics:
    """The threshold from the baseline's own drift (``decode`` against ``scores``), never below the
    dtype's rounding at the logit scale read from ``scores`` (assumed where unreadable)."""
    scale, how = logit_scale(scores or {}, dtype)
    if scale is None:
        scale, how = LOGIT_SCALE, f"assumed ({how})"
    floor = dtype_threshold(dtype, scale)
    drift = measure_drift(decode or {}, scores or {}) if decode else None
    parts = [f"{floor.source}, the scale {how}"]
    value = floor.value
    if drift is None:
        parts.append("decode-vs-prefill drift not measured")
    else:
        by_drift = DRIFT_MULT * drift.quantile
        parts.append(f"{DRIFT_MULT:g} x the decode-vs-prefill drift's {DRIFT_QUANTILE:g} quantile "
                     f"{drift.quantile:.3g} nats ({drift.positions} positions of {drift.requests} requests)")
        value = max(value, by_drift)
    th = Threshold(value, "the larger of: " + "; ".join(parts) if drift is not None else "; ".join(parts))
    return Numerics(threshold=th, dtype=dtype, floor=floor.value, scale=scale, scale_source=how, drift=drift,
                    cap=CAP_MULT * value)


def numerics_for(base: Numerics | None, dtype: str | None, base_scores: dict[str, dict[str, Any]] | None) -> Numerics:
    """The numerics a candidate computing in ``dtype`` is judged by: the baseline's where it computed
    in the same dtype; else (a lossy dtype, or a study from before they were measured) the dtype's
    rounding at the logit scale the baseline read, with no drift (no excess test)."""
    if base is not None and base.dtype == dtype:
        return base
    if base is None:
        return measure_numerics(dtype, base_scores, None)
    floor = dtype_threshold(dtype, base.scale)
    th = Threshold(floor.value, f"{floor.source} ({base.scale_source}); drift measured in {base.dtype}, not {dtype}")
    return Numerics(threshold=th, dtype=dtype, floor=floor.value, scale=base.scale, scale_source=base.scale_source,
                    cap=CAP_MULT * floor.value)


@dataclass(frozen=True)
class Widened:
    """A threshold after a baseline's own flips, and the flips it would not take (findings)."""

    threshold: Threshold
    findings: tuple[str, ...] = field(default_factory=tuple)


def widen(th: Threshold, cap: float, flips: list[tuple[str, float]]) -> Widened:
    """The threshold widened to just above the largest of the baseline's own flips (request, margin)
    under ``cap`` (such a flip is numerics by definition); never narrowed. A flip at or above the cap
    widens nothing and is a finding: the baseline does not reproduce itself there."""
    under = [m for _, m in flips if m < cap]
    findings = tuple(f"the baseline does not reproduce itself at margin {m:.3g} nats, request {rid!r} "
                     f"(above the cap {cap:.3g}: widens nothing)" for rid, m in flips if m >= cap)
    if not under or max(under) < th.value:
        said = f"; {len(under)} baseline-vs-baseline flip(s), all below it" if under else ""
        return Widened(Threshold(th.value, th.source + said) if said else th, findings)
    top = max(under)
    return Widened(Threshold(math.nextafter(top, math.inf), f"widened from {th.value:.3g} ({th.source}) by "
                             f"{len(under)} baseline-vs-baseline flip(s), largest margin {top:.3g} (cap {cap:.3g})"),
                   findings)
