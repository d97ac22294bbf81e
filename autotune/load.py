"""Load patterns: how the workload's requests are sent during a measured window.

- ``concurrency=N``: closed loop, at most N requests in flight, the next sent when one finishes.
- ``batch``: offline, everything at once.
- ``poisson=R``: open loop, requests arrive as a Poisson process at R requests/s (seeded).
- ``replay``: open loop, each request sent at its ``arrival_s`` offset from the workload.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any

from autotune.errors import BadInput

KINDS = ("concurrency", "batch", "poisson", "replay")


@dataclass(frozen=True)
class LoadPattern:
    kind: str = "concurrency"
    concurrency: int = 1
    rate: float | None = None
    seed: int = 0

    @property
    def label(self) -> str:
        return {"concurrency": f"concurrency={self.concurrency}", "batch": "batch",
                "poisson": f"poisson={self.rate:g}/s" if self.rate else "poisson", "replay": "replay"}[self.kind]

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "label": self.label}


def parse_load(text: str, *, seed: int = 0) -> LoadPattern:
    """``concurrency=4``, ``batch``, ``poisson=2.5`` or ``replay``."""
    kind, _, arg = text.strip().partition("=")
    try:
        if kind == "concurrency" and arg:
            n = int(arg)
            if n >= 1:
                return LoadPattern("concurrency", concurrency=n, seed=seed)
        elif kind == "poisson" and arg:
            r = float(arg)
            if 0 < r < 1e6:
                return LoadPattern("poisson", rate=r, seed=seed)
        elif kind in ("batch", "replay") and not arg:
            return LoadPattern(kind, seed=seed)
    except ValueError:
        pass
    raise BadInput(f"--load: expected concurrency=N (N >= 1), batch, poisson=RATE (requests/s > 0) or replay, "
                   f"got {text!r}")


def send_offsets(pattern: dict[str, Any], n: int, arrivals: list[float | None]) -> list[float] | None:
    """Seconds after the window start at which each request is sent; None for a closed loop."""
    kind = pattern["kind"]
    if kind == "concurrency":
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
