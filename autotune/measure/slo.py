"""Service-level objectives: ``--slo "ttft_ms_p95<=500,tpot_ms_p50<=40"`` as Optuna constraints.

A candidate that misses an SLO is infeasible, so it is never on the reported Pareto front. An SLO on a
metric the run did not measure (TPOT and ITL where the stream delivered tokens in bursts) is left out.
Goodput (as in `vllm bench serve`) is the share of requests that meet every per-request SLO:
``ttft``, ``tpot`` and ``e2e`` bounds applied to each request's own latency.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from autotune.core.errors import BadInput
from autotune.measure.metrics import DIRECTIONS

_PART = re.compile(r"^\s*([a-z0-9_]+?)\s*(<=|>=)\s*([0-9.eE+-]+)\s*(ms|s|tok/s)?\s*$")


@dataclass(frozen=True)
class SLO:
    metric: str  # a metric name of autotune.measure.metrics, e.g. ttft_ms_p95
    op: str  # "<=" or ">="
    bound: float

    def violation(self, value: float | None) -> float:
        """Optuna constraint value: <= 0 when met, scaled by the bound. A metric the run did not measure
        (None or NaN: TPOT where the stream delivered tokens in bursts, autotune.measure.metrics.
        unresolved_latency says so) is left out: 0, neither met by a number nor missed."""
        if value is None or value != value:
            return 0.0
        gap = value - self.bound if self.op == "<=" else self.bound - value
        return gap / abs(self.bound) if self.bound else gap

    def met_by_request(self, ttft_ms: float, tpot_ms: float | None, e2e_ms: float) -> bool:
        kind = self.metric.split("_")[0]
        value = {"ttft": ttft_ms, "tpot": tpot_ms, "e2e": e2e_ms}.get(kind)
        return value is None or (value <= self.bound if self.op == "<=" else value >= self.bound)

    @property
    def text(self) -> str:
        return f"{self.metric}{self.op}{self.bound:g}"


def parse_slos(text: str | None) -> tuple[SLO, ...]:
    """Parse a comma-separated SLO list; ``ttft_p95<=500ms`` and ``ttft_ms_p95<=500`` mean the same."""
    if not text:
        return ()
    out = []
    for part in text.split(","):
        m = _PART.match(part)
        if not m:
            raise BadInput(f"--slo: expected METRIC<=VALUE or METRIC>=VALUE (e.g. ttft_ms_p95<=500), got {part.strip()!r}")
        name, op, raw, unit = m.groups()
        if "_ms_" not in name and re.match(r"^(ttft|tpot|itl|e2e)_", name):
            name = name.replace("_", "_ms_", 1)
        try:
            bound = float(raw) * (1000.0 if unit == "s" else 1.0)
        except ValueError:
            raise BadInput(f"--slo: {part.strip()!r}: {raw!r} is not a number") from None
        if name not in DIRECTIONS:
            raise BadInput(f"--slo: {part.strip()!r}: unknown metric {name!r}; expected one of {sorted(DIRECTIONS)}")
        if bound <= 0 or (op == "<=") != (DIRECTIONS[name] == "minimize"):
            raise BadInput(f"--slo: {part.strip()!r} cannot be met: a latency needs <= a positive bound, "
                           f"a throughput >= a positive bound")
        out.append(SLO(name, op, bound))
    return tuple(out)


def goodput(requests: list[dict[str, Any]], slos: tuple[SLO, ...], *, step: int | None = None) -> float:
    """Share of one window's requests that completed and met every per-request SLO (1.0 with no SLOs).
    Where the window's stream delivered tokens in bursts (autotune.measure.coalescing.stream_coalesced;
    ``step``: the most tokens an engine step gives a request, from the window's counters where known)
    no request's TPOT is measured, and a TPOT bound is left out."""
    from autotune.measure.coalescing import stream_coalesced
    from autotune.measure.metrics import complete, request_latency

    if not requests:
        return 0.0
    timed = stream_coalesced([r for r in requests if complete(r)], step=step) is None
    good = 0
    for r in requests:
        if not complete(r):
            continue
        ttft, e2e, tpot, _ = request_latency(r)
        ttft, e2e, tpot = ttft * 1000, e2e * 1000, None if tpot is None or not timed else tpot * 1000
        good += all(s.met_by_request(ttft, tpot, e2e) for s in slos if s.metric.split("_")[0] in ("ttft", "tpot", "e2e"))
    return good / len(requests)
