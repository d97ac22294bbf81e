"""How finely a study could tell configs apart: the pick's speedup over the baseline with engine
instances as the unit (paired fresh instances, measured side by side, the trial that selected the
pick left out), and the pick over the runner-up. Pure functions of two measurements; the study loop
adds pairs, at least ``FIGURE_PAIRS``, until ``decided``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from autotune.measure.metrics import instances_of, paired_interval, ratio_interval

# Differences inside 1 +- this are ties: no decision rests on them (the pick over the baseline is
# decided once its paired interval lies outside the band).
TIE_BAND = 0.03
# Re-measurement pairs the pick's figure rests on at least (--pairs, default this many): a t-interval
# on 2 pairs has t(1) = 12.7, on 3 t(2) = 4.3, so 3 is the fewest that can decide anything.
FIGURE_PAIRS = 3


@dataclass(frozen=True)
class Resolution:
    """The pick over the baseline on paired instances, and over the runner-up."""

    speedup: float
    lo: float
    hi: float
    pairs: int  # engine-instance pairs the interval rests on
    decided: bool  # the interval lies outside 1 +- tie_band
    resolution: float  # the smallest relative difference this evidence tells apart: the interval's half-width
    tie_band: float
    runner_up: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        """One line for the console and report.md."""
        if self.resolution is None or not math.isfinite(self.resolution):  # NaN; None once in best.json
            return (f"resolution: the pick over the baseline {self.speedup:.2f}x on {self.pairs} pair(s) of fresh "
                    "engine instances (the selecting trial left out): no interval, too few pairs to tell anything "
                    f"apart (--pairs {FIGURE_PAIRS} or more)")
        iv = f"{self.speedup:.2f}x [{self.lo:.2f}-{self.hi:.2f}]"
        text = (f"resolution: the pick over the baseline {iv} on {self.pairs} pair(s) of fresh engine instances "
                f"(95% t-interval over paired instances, the selecting trial left out); differences under "
                f"{self.resolution:.0%} cannot be told apart here")
        r = self.runner_up
        if r:
            text += (f"; over the runner-up ({r['label']}) {r['ratio']:.2f}x [{r['lo']:.2f}-{r['hi']:.2f}] (windows "
                     "of one instance each)"
                     + ("" if r["decided"] else ", a tie at this resolution"))
        return text


def _outside(lo: float, hi: float, band: float) -> bool:
    return math.isfinite(lo) and math.isfinite(hi) and (lo > 1 + band or hi < 1 - band)


def resolve(pick: dict[str, Any], base: dict[str, Any], *, runner_up: dict[str, Any] | None = None,
            runner_label: str | None = None, tie_band: float = TIE_BAND) -> Resolution | None:
    """``pick`` and ``base`` are measurements (pooled over instances where re-measured); throughput
    is the objective. None where either lacks throughput windows."""
    r, lo, hi, pairs = paired_interval(instances_of(pick), instances_of(base))
    if not pairs or not math.isfinite(r):
        return None
    half = max(hi / r - 1, 1 - lo / r) if r > 0 else float("nan")
    other = None
    if runner_up is not None:
        c, b = pick.get("output_tok_s_windows") or [], runner_up.get("output_tok_s_windows") or []
        o_lo, o_hi = ratio_interval(c, b)
        if c and b and math.isfinite(o_lo):
            ratio = float(pick["output_tok_s"] / runner_up["output_tok_s"])
            other = {"label": runner_label, "ratio": ratio, "lo": o_lo, "hi": o_hi,
                     "decided": _outside(o_lo, o_hi, tie_band)}
    return Resolution(r, lo, hi, pairs, _outside(lo, hi, tie_band), half, tie_band, other)
