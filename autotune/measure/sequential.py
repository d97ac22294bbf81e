"""When confirm's served rounds stop: decided as they come, at a stated resolution, with a cap.

Rounds come two at a time (the ABBA order of autotune.measure.intervals.abba is balanced on an even
number), at least ``min_rounds``; after each even round the paired t-interval's resolution (its
relative half-width, autotune.measure.intervals.resolution) is read, and the rounds stop once it is
``target`` or better, at ``max_rounds``, or when two more rounds would pass ``max_s`` counted from the
step's own start (its setup and launcher too: "3 minutes of confirm" is the step's, not its rounds'). Stopping on a
narrow interval favours intervals that are narrow by chance: a 95% t-interval read where this rule
stopped covered 91.5% of 600 simulated confirms at independent rounds, so the served interval is the
t-interval at ``LEVEL`` (97.5%), which covers 94.5% under the rule (benchmarks/calibration_fake.py,
benchmarks/data/calibration_holdout.json measures it through this very rule).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from autotune.measure.intervals import paired_t, resolution

TARGET = 0.10  # confirm's --resolution default: the relative half-width its rounds aim for
MIN_ROUNDS = 4
MAX_ROUNDS = 12
MAX_S = 180.0  # confirm's rounds stop before passing this many seconds (two more would not fit)
LEVEL = 0.975  # the t-interval's level where this rule stopped: 95% coverage under the rule (see above)


@dataclass(frozen=True)
class Sequential:
    """The stopping rule of a sequence of paired rounds (``rounds`` fixed: exactly that many)."""

    target: float = TARGET
    min_rounds: int = MIN_ROUNDS
    max_rounds: int = MAX_ROUNDS
    max_s: float | None = MAX_S
    rounds: int | None = None  # a fixed number (confirm --rounds): no sequential decision

    @property
    def level(self) -> float:
        """The served interval's t level: 95% for a fixed number of rounds, LEVEL where this rule stopped."""
        return 0.95 if self.rounds is not None else LEVEL

    def stop(self, pick: Sequence[float], base: Sequence[float], elapsed_s: float, start_s: float = 0.0) -> str | None:
        """Why to stop after the rounds so far (pick and baseline tok/s, round by round), or None to
        measure two more. ``elapsed_s``: the seconds since the step started; ``start_s``: of those, the
        seconds before its first round (setup, launcher), which two more rounds do not repeat."""
        n = min(len(pick), len(base))
        if self.rounds is not None:
            return f"the {self.rounds} round(s) asked for (--rounds)" if n >= self.rounds else None
        if n < self.min_rounds or n % 2:
            return None
        _, lo, hi, _ = paired_t(pick[:n], base[:n], level=self.level)
        res = resolution(lo, hi)
        if res is not None and res <= self.target:
            return f"resolution +-{res:.0%} reached (target +-{self.target:.0%})"
        said = f"+-{res:.0%}" if res is not None else "none"
        if n >= self.max_rounds:
            return f"the cap of {self.max_rounds} rounds, resolution {said} (target +-{self.target:.0%})"
        if self.max_s is not None and elapsed_s + 2 * max(0.0, elapsed_s - start_s) / n > self.max_s:
            return (f"two more rounds would pass {self.max_s:g} s, resolution {said} (target +-{self.target:.0%}; "
                    "autotune confirm --max-minutes for more)")
        return None
