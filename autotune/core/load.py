"""Load patterns: how the workload's requests are sent during a measured window.

- ``concurrency=N``: closed loop, at most N requests in flight, the next sent when one finishes.
- ``batch``: offline, everything at once.
- ``poisson=R``: open loop, requests arrive as a Poisson process at R requests/s (seeded).
- ``replay``: open loop, each request sent at its ``arrival_s`` offset from the workload.
- ``ramp=N``: closed loop whose limit on requests in flight rises from 1 to N and falls back to 1
  over the window (a service whose load comes and goes: what a depth schedule must survive).
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any

from autotune.core.errors import BadInput

KINDS = ("concurrency", "batch", "poisson", "replay", "ramp")


@dataclass(frozen=True)
class LoadPattern:
    kind: str = "concurrency"
    concurrency: int = 1
    rate: float | None = None
    seed: int = 0

    @property
    def label(self) -> str:
        return {"concurrency": f"concurrency={self.concurrency}", "batch": "batch",
                "poisson": f"poisson={self.rate:g}/s" if self.rate else "poisson", "replay": "replay",
                "ramp": f"ramp={self.concurrency}"}[self.kind]

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "label": self.label}


def parse_load(text: str, *, seed: int = 0) -> LoadPattern:
    """``concurrency=4``, ``batch``, ``poisson=2.5``, ``replay`` or ``ramp=8``."""
    kind, _, arg = text.strip().partition("=")
    try:
        if kind in ("concurrency", "ramp") and arg:
            n = int(arg)
            if n >= 1:
                return LoadPattern(kind, concurrency=n, seed=seed)
        elif kind == "poisson" and arg:
            r = float(arg)
            if 0 < r < 1e6:
                return LoadPattern("poisson", rate=r, seed=seed)
        elif kind in ("batch", "replay") and not arg:
            return LoadPattern(kind, seed=seed)
    except ValueError:
        pass
    raise BadInput(f"--load: expected concurrency=N (N >= 1), batch, poisson=RATE (requests/s > 0), replay "
                   f"or ramp=N, got {text!r}")


def ramp_limits(n: int, top: int) -> list[int]:
    """The in-flight limit for each of ``n`` requests sent in order: 1 up to ``top`` at the middle
    of the window and back down to 1 (a triangle)."""
    if n <= 1:
        return [1] * n
    return [1 + round((top - 1) * (1 - abs(2 * i / (n - 1) - 1))) for i in range(n)]


def send_offsets(pattern: dict[str, Any], n: int, arrivals: list[float | None]) -> list[float] | None:
    """Seconds after the window start at which each request is sent; None for a closed loop."""
    kind = pattern["kind"]
    if kind in ("concurrency", "ramp"):
        return None
    if kind == "batch":
        return [0.0] * n
    if kind == "poisson":
        rng, t, out = random.Random(pattern.get("seed", 0)), 0.0, []
        for _ in range(n):
            out.append(t)
            t += rng.expovariate(pattern["rate"])
        return out
    first = min(a for a in arrivals if a is not None)
    return [a - first for a in arrivals]  # replay: validated to be all present


def parse_levels(text: str) -> tuple[int, ...]:
    """``--levels 1,4,16``: concurrency levels, at least one, each >= 1 (sorted, no repeats)."""
    try:
        levels = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        levels = []
    if not levels or levels[0] < 1:
        raise BadInput(f"--levels: expected concurrency levels as comma-separated integers >= 1 (e.g. 1,8), got {text!r}")
    return tuple(levels)


def level_loads(levels: tuple[int, ...], load: LoadPattern, extra: tuple[LoadPattern, ...]) -> tuple[LoadPattern, ...]:
    """The extra load levels a trial measures: the objectives' (``extra``), every level after the
    first, and with two or more levels a ramp from 1 to the top level and back."""
    out = list(extra)
    more = [LoadPattern("concurrency", concurrency=n, seed=load.seed) for n in levels[1:]]
    if len(levels) >= 2:
        more.append(LoadPattern("ramp", concurrency=levels[-1], seed=load.seed))
    for p in more:
        if p.label != load.label and all(p.label != x.label for x in out):
            out.append(p)
    return tuple(out)


def suggested_levels(n_requests: int) -> tuple[int, ...]:
    """Concurrency levels to suggest where the log has no arrival times: one request in flight, a
    small batch and a large one, none above the requests a window holds (a level over them is the
    workload all at once)."""
    more = [x for x in (8, 32) if x < n_requests] + ([n_requests] if 1 < n_requests <= 32 else [])
    return tuple(sorted({1, *more}))


def default_load(arrivals: list[float | None]) -> tuple[str, str]:
    """The load a study runs when the user gives none (no --load, --levels or --concurrency), and
    why, in one line: the workload's own arrival times where every request has one (what the
    service saw), else one request in flight, saying that speculation gains most there and which
    levels to give instead."""
    n, timed = len(arrivals), [a for a in arrivals if a is not None]
    if n and len(timed) == n:
        span = max(timed) - min(timed)
        rate = f", {(n - 1) / span:.3g} requests/s" if span > 0 else ""
        return "replay", (f"load: replay (every request has arrival_s: {n} over {span:.3g} s{rate}, sent at "
                          "their offsets); give --levels or --load for another")
    levels = ",".join(map(str, suggested_levels(n)))
    why = f"only {len(timed)} of {n} requests have arrival_s" if timed else "the workload has no arrival_s"
    return "concurrency=1", (f"load: concurrency=1, one request in flight ({why}); speculation gains most "
                             f"there and less as the batch grows: give the load you serve, e.g. --levels {levels}")
