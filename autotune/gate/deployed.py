"""What a study knows of its deployed config, for `autotune watch` to hold live traffic against.

The deployed config is the study's pick, the one ``serve.sh`` / `autotune serve` runs (best.json's
``best``). What it should show live:
- Acceptance by position, mean accepted length and tokens per decode step, with an interval: the
  study's per-request acceptance of that config (replayed from the baseline's tokens, as
  `autotune predict` does; vLLM's counters agree within a few percent) resampled, as many requests
  as the live window had. The interval is the spread a window of that size shows while the traffic
  is still the study's kind: requests differ far more from each other than windows of one engine
  (which replay the same requests), so that is the noise live traffic meets. Where no replay covers
  the method, or the study's storage is gone, the measured values with a fixed tolerance.
- Requests in flight: the study's (req/s x mean latency, Little's law) at each load level measured.
- Forecasts at live acceptance: the study's calibrated step-cost model (autotune.forecast.forecast.Model,
  as `autotune predict` builds it) with the live acceptance in place of the replayed one. The other
  depths of the deployed method get the live acceptance projected to their depth (the live
  conditional rate of each position, the last one carried deeper); other methods' acceptance on live
  traffic is not observed, so they are not forecast.
Reads best.json and the study's storage; needs Optuna, never vLLM.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from autotune.core.candidate import Candidate
from autotune.core.errors import BadInput
from autotune.forecast.forecast import AcceptanceTable, Forecast, Model, Observation
from autotune.forecast.predict import Acceptance

LEVEL = 0.99  # several metrics are judged every window, maybe every minute: false alarms must be rare
DRAWS = 2000
TOLERANCE = 0.15  # relative, where the study gives no per-request acceptance to resample
SUFFIX_REQUESTS = 64  # suffix decoding's per-request replay is quadratic (a shared cache): the first N
REQUESTS = 2000  # others: the first N (the bootstrap holds draws x requests counts)


@dataclass(frozen=True)
class Band:
    """A value the study expects, and the interval a live window of ``n`` requests should fall in."""

    value: float
    lo: float
    hi: float

    @property
    def known(self) -> bool:
        """The study gives a value and an interval to judge against (NaN: no drafts replayed, no value)."""
        return all(math.isfinite(x) for x in (self.value, self.lo, self.hi))

    def holds(self, x: float) -> bool:
        """Inside the band; a live value that is not a number, or a band that is not one, holds
        nothing (they used to count as inside: ok on a server that drafted nothing)."""
        return math.isfinite(x) and self.known and self.lo <= x <= self.hi


@dataclass(frozen=True)
class Expected:
    by_pos: list[Band]
    mean_accepted_length: Band
    tokens_per_step: Band | None  # None: no replay, no per-step figure in the study
    basis: str


@dataclass
class Deployed:
    results: Path
    report: dict[str, Any]
    params: dict[str, Any]
    label: str
    measured: dict[str, Any]  # best.json's measurement of the pick
    model: Model | None = None  # the study's calibrated step-cost model
    observations: list[Observation] = field(default_factory=list)
    per_request: list[Acceptance] = field(default_factory=list)
    pooled: Acceptance | None = None  # the replay over the whole workload
    note: str = ""  # why there is no model or no replay

    @property
    def method(self) -> str:
        return str(self.params.get("method", "none"))

    @property
    def depth(self) -> int:
        return int(self.params.get("num_speculative_tokens") or 0)

    def in_flight(self) -> list[float]:
        """Requests in flight in the study, at each load level measured (req/s x mean E2E latency)."""
        m, out = self.measured, []
        from autotune.measure.objectives import metric_key, parse_key

        for metric, suffix, level in [parse_key(k) for k in m]:
            key, e2e = metric_key("req_s", level), metric_key("e2e_ms_mean", level)
            if (metric, suffix) == ("req_s", "") and isinstance(m.get(key), (int, float)) \
                    and isinstance(m.get(e2e), (int, float)):
                out.append(m[key] * m[e2e] / 1000.0)
        return out

    def expected(self, n: int, *, seed: int = 0) -> Expected:
        """What a live window of ``n`` requests of the study's traffic shows, with a LEVEL interval."""
        if self.per_request and self.pooled is not None:
            return _resampled(self.per_request, self.pooled, max(n, 1), seed=seed)
        by = self.measured.get("acceptance_by_pos") or []
        tol = lambda v: Band(v, v * (1 - TOLERANCE), v * (1 + TOLERANCE))  # noqa: E731
        mal = self.measured.get("mean_accepted_length")
        return Expected([tol(float(v)) for v in by], tol(float(mal) if mal is not None else math.nan), None,
                        f"the measured values +-{TOLERANCE:.0%} ({self.note})")

    def forecasts(self, live: Acceptance) -> tuple[Forecast | None, Forecast | None, list[Forecast]]:
        """The deployed config forecast at the study's acceptance and at ``live``, and every measured
        config at the live traffic, best first (those it cannot forecast last, speedup None)."""
        if self.model is None:
            return None, None, []
        at_live = copy.copy(self.model)  # the same fit (step costs, knob factors, prefill share)
        at_live.table = LiveTable(self.method, self.depth, live)  # type: ignore[assignment]
        seen, rows = set(), []
        for o in self.observations:
            key = Candidate(dict(o.params)).key()
            if o.feasible and key not in seen:
                seen.add(key)
                rows.append(at_live.forecast(o.params))
        rows.sort(key=lambda f: -(f.speedup if f.speedup is not None else -1.0))
        return self.model.forecast(self.params), at_live.forecast(self.params), rows


class LiveTable:
    """Stands in for the study's AcceptanceTable: the live window's acceptance for the deployed
    method, projected to other depths; nothing for other methods (not observed live)."""

    def __init__(self, method: str, depth: int, live: Acceptance):
        self.method, self.depth, self.live = method, depth, live

    def get(self, params: Mapping[str, Any]) -> Acceptance | None:
        if params.get("method") != self.method or not self.live.drafts and not self.live.steps:
            return None
        k = int(params.get("num_speculative_tokens") or 0)
        return self.live if k == self.depth else project(self.live, k, suffix=self.method == "suffix")

    def why_not(self, method: str) -> str:
        return f"{method}: its acceptance on live traffic is not observed (the server runs {self.method})"


def project(live: Acceptance, k: int, *, suffix: bool = False) -> Acceptance:
    """``live`` (one depth) at depth ``k``: the same draft rate per step and the same chance to
    accept position j given a draft, the last position's conditional rate carried deeper."""
    d, steps = live.drafts, max(live.steps, 1)
    if not d or not live.per_pos or k <= 0:
        return Acceptance(0, 0, 0, (0,) * max(k, 0), live.tokens, live.steps, live.requests)
    c = [a / d for a in live.per_pos]
    ratio = c[-1] / c[-2] if len(c) > 1 and c[-2] > 0 else c[0]
    while len(c) < k:
        c.append(c[-1] * ratio)
    c = c[:k]
    q = d / steps  # drafts per decode step
    per_pos = tuple(q * steps * x for x in c)
    accepted = sum(per_pos)
    length = min(k, live.draft_tokens / d) if suffix else k  # suffix drafts any length up to k
    decoded = steps * (1 + q * sum(c))
    return Acceptance(q * steps, q * steps * length, accepted, per_pos, live.requests + decoded, steps,  # type: ignore[arg-type]
                      live.requests)


def _minus(a: Acceptance, b: Acceptance) -> Acceptance:
    n = len(a.per_pos)
    pb = tuple(b.per_pos) + (0,) * (n - len(b.per_pos))
    return Acceptance(a.drafts - b.drafts, a.draft_tokens - b.draft_tokens, a.accepted - b.accepted,
                      tuple(x - y for x, y in zip(a.per_pos, pb)), a.tokens - b.tokens, a.steps - b.steps,
                      a.requests - b.requests)


def per_request(table: AcceptanceTable, params: Mapping[str, Any]) -> list[Acceptance]:
    """The config's replayed acceptance, one entry per request of the study's baseline outputs.

    Suffix decoding's proposer keeps one cache over requests, so a request's acceptance is the
    replay of it and all before it, less the replay of those before (the first SUFFIX_REQUESTS)."""
    outs = [o for o in table.outputs if o.get("prompt_token_ids") and o.get("token_ids")]
    # the study's table (its traces too) over a subset of its requests, with an empty cache
    one = lambda os: replace(table, outputs=os, _cache={}).get(params)  # noqa: E731
    if params.get("method") != "suffix":
        return [a for a in (one([o]) for o in outs[:REQUESTS]) if a is not None]
    got, before = [], Acceptance()
    for i in range(min(len(outs), SUFFIX_REQUESTS)):
        upto = one(outs[:i + 1])
        if upto is None:
            return []
        got.append(_minus(upto, before))
        before = upto
    return got


def _resampled(reqs: Sequence[Acceptance], pooled: Acceptance, n: int, *, seed: int) -> Expected:
    """Two-sample bootstrap: a window of ``n`` requests and a study of as many as it had, both drawn
    from the study's requests and pooled as vLLM's counters pool; the band is the study's value plus
    the spread of their difference (the study's own mean is an estimate too: many live requests
    still meet the study's sampling error). Counts per request (multinomial draws) keep the memory
    at draws x study requests however long the window."""
    k = max(len(r.per_pos) for r in reqs)
    cols = np.array([[r.drafts, r.accepted, r.tokens - r.requests, r.steps, *r.per_pos, *[0] * (k - len(r.per_pos))]
                     for r in reqs], dtype=float)
    rng = np.random.default_rng(seed)
    uniform = np.full(len(reqs), 1 / len(reqs))

    def metrics(size: int) -> np.ndarray:  # (draws, [mean accepted length, tokens/step, position 1..k])
        sums = rng.multinomial(size, uniform, size=DRAWS) @ cols
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.column_stack([1 + sums[:, 1] / sums[:, 0], sums[:, 2] / sums[:, 3],
                                    sums[:, 4:] / sums[:, :1]])

    diff = metrics(n) - metrics(len(reqs))
    tail = (1 - LEVEL) / 2 * 100

    def band(value: float, j: int) -> Band:
        ok = diff[:, j][np.isfinite(diff[:, j])]
        if not len(ok) or not math.isfinite(value):
            return Band(value, math.nan, math.nan)
        lo, hi = np.percentile(ok, [tail, 100 - tail])
        return Band(value, value + min(float(lo), 0.0), value + max(float(hi), 0.0))

    by_value = [a / pooled.drafts if pooled.drafts else math.nan for a in pooled.per_pos]
    return Expected([band(v, 2 + j) for j, v in enumerate(by_value)], band(pooled.mean_accepted_length, 0),
                    band(pooled.tokens_per_step, 1),
                    f"{len(reqs)} requests of the study and a window of {n} resampled, {LEVEL:.0%} interval")


def load_deployed(results: Path, *, storage: str | None = None) -> Deployed:
    """The deployed pick of a results folder, with the study's model and per-request replay where
    its storage is at hand (else the measured values alone, and why)."""
    from autotune.core.study_report import load_report

    report = load_report(results)
    folder = results.parent if results.is_file() else results
    best = report.get("best")
    if not best or "measurement" not in best:
        raise BadInput(f"{folder}: no deployed pick in best.json (the study found no feasible configuration): "
                       "nothing to watch against")
    d = Deployed(folder, report, dict(best["candidate"]), best["label"], best["measurement"])
    if d.method == "none":
        raise BadInput(f"{folder}: the deployed pick ({d.label}) runs without speculation: there is no "
                       "acceptance to watch")
    if storage is None and not (folder / "study.db").is_file():
        d.note = f"no study storage at {folder / 'study.db'} (pass --storage): no forecast"
        return d
    _attach_study(d, storage or f"sqlite:///{(folder / 'study.db').resolve()}")
    return d


def _attach_study(d: Deployed, storage: str) -> None:
    from autotune.core import attrs
    from autotune.core.space import reload_space
    from autotune.study.storage import load_saved
    from autotune.study.strategy import study_model
    from autotune.study.view import StudyView

    view = StudyView.of(load_saved(d.report["study"], storage, flag="--storage"))
    resolved = view.user_attrs.get(attrs.SPACE_RESOLVED)
    got = study_model(view, reload_space(resolved) if resolved else None, view.user_attrs.get(attrs.MAX_MODEL_LEN))
    if got is None:
        d.note = "the study has no completed baseline: no forecast"
        return
    d.model, d.observations, _ = got
    d.pooled = d.model.table.get(d.params)
    if d.pooled is None:
        d.note = d.model.table.why_not(d.method)
        return
    d.per_request = per_request(d.model.table, d.params)
