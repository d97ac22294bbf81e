"""When confirm's served rounds stop (autotune.measure.sequential): the resolution target, the cap, and
the time limit counted from the step's own start, so that "3 minutes of confirm" is the step's."""

from __future__ import annotations

import math

from autotune.measure.sequential import Sequential


def _rounds(n: int, spread: float) -> tuple[list[float], list[float]]:
    """n rounds of a pick near 3x a 100 tok/s baseline, its log ratio alternating +-spread."""
    return [300 * math.exp(spread * (-1) ** i) for i in range(n)], [100.0] * n


def test_the_time_limit_counts_the_steps_start_not_only_its_rounds():
    rule = Sequential(target=0.10, max_s=180.0)
    pick, base = _rounds(6, 0.2)  # far from 10%: only the clock can stop it
    # 6 rounds in 132 s of rounds: two more take 44 s. Counted from the first round (176 s) they fit;
    # after a 15 s start (setup, launcher) the step would end at 191 s, past 180: stop.
    assert rule.stop(pick, base, 132.0) is None
    why = rule.stop(pick, base, 147.0, 15.0)
    assert why is not None and why.startswith("two more rounds would pass 180 s")
    # the start is not projected as if each round repeated it: 100 s of rounds after a 15 s start fit
    assert rule.stop(pick, base, 115.0, 15.0) is None


def test_the_rounds_stop_at_the_target_resolution_and_at_the_cap_never_on_an_odd_round():
    rule = Sequential(target=0.10, max_s=None)
    tight, base = _rounds(4, 0.01)
    assert rule.stop(tight[:3], base[:3], 0.0) is None  # under min_rounds, and odd
    assert "reached" in rule.stop(tight, base, 0.0)
    wide, base = _rounds(12, 0.3)
    assert rule.stop(wide[:10], base[:10], 0.0) is None
    assert rule.stop(wide, base, 0.0).startswith("the cap of 12 rounds")
    assert Sequential(rounds=3).stop(wide[:3], base[:3], 0.0) == "the 3 round(s) asked for (--rounds)"
