"""How finely a study tells configs apart: the pick's figure over the baseline with its interval (over
holdout pairs measured after the choice, or served rounds), and the pick over the runner-up (over the
selection rounds' pairs, or the windows of one instance each where there were none). Pure functions
of numbers already computed (autotune.study.figures, autotune.study.select).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from autotune.measure.intervals import UNIT_HOLDOUT, UNIT_PAIRS, resolution as half_width

# The least relative difference the study treats as real: fresh instances of one config differ at least
# this much (benchmarks/data/instance_noise*.json: 8-36% on a shared 2-core machine). The one home of the
# number: the tie band below, and the forecast's least noise (autotune.forecast.forecast.FLOOR).
NOISE_FLOOR = 0.03
# Differences inside 1 +- the noise floor are ties: no decision rests on them (the figure over the baseline
# is decided once its interval lies outside the band; so is the pick over the runner-up).
TIE_BAND = NOISE_FLOOR


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

    unit: str = UNIT_PAIRS  # what the figure's interval is over (best.json before round 5: paired instances)

    def line(self) -> str:
        """One line for the console and report.md."""
        if self.resolution is None or not math.isfinite(self.resolution):  # NaN; None once in best.json
            return (f"resolution: the pick over the baseline {self.speedup:.2f}x on {self.pairs} {self.unit}: no "
                    "interval, too few pairs to tell anything apart")
        iv = f"{self.speedup:.2f}x [{self.lo:.2f}-{self.hi:.2f}]"
        text = (f"resolution: the pick over the baseline {iv} on {self.pairs} {self.unit} (95% t-interval); "
                f"differences under {self.resolution:.0%} cannot be told apart here")
        r = self.runner_up
        if r:
            unit = f"{r['pairs']} selection round(s), paired" if r.get("pairs") else "windows of one instance each"
            iv = f" [{r['lo']:.2f}-{r['hi']:.2f}]" if r.get("lo") is not None and r.get("hi") is not None else ""
            text += (f"; over the runner-up ({r['label']}) {r['ratio']:.2f}x{iv} ({unit})"
                     + ("" if r["decided"] else ", a tie at this resolution"))
        return text


def _outside(lo: float, hi: float, band: float) -> bool:
    return math.isfinite(lo) and math.isfinite(hi) and (lo > 1 + band or hi < 1 - band)


def resolve(speedup: float, lo: float | None, hi: float | None, pairs: int, *, unit: str = UNIT_HOLDOUT,
            runner_up: dict[str, Any] | None = None, tie_band: float = TIE_BAND) -> Resolution | None:
    """The figure (``speedup`` [``lo``-``hi``] over ``pairs`` of ``unit``) and the pick over the runner-up
    (``runner_up``: label, ratio, lo, hi, pairs; decided here). None without a figure."""
    if speedup is None or not math.isfinite(speedup):
        return None
    lo = float("nan") if lo is None else lo
    hi = float("nan") if hi is None else hi
    half = half_width(lo, hi)
    other = None
    if runner_up is not None and runner_up.get("ratio") is not None:
        r_lo, r_hi = runner_up.get("lo"), runner_up.get("hi")
        decided = r_lo is not None and r_hi is not None and _outside(r_lo, r_hi, tie_band)
        other = {**runner_up, "decided": decided}
    return Resolution(speedup, lo, hi, pairs, _outside(lo, hi, tie_band), float("nan") if half is None else half,
                      tie_band, other, unit)


