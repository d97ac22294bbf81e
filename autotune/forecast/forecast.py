"""Predicted speedup of every candidate: replayed acceptance (autotune.forecast.predict) x a step-cost model.

A speculative step emits T tokens on average (T from the acceptance replay, exact for ngram, a
greedy draft and suffix decoding at concurrency 1 on greedy requests) and costs r times a baseline
decode step. With f the share of a baseline request's time spent before its first token (prefill,
queueing), the speedup over the baseline is

    S = 1 / (f + (1 - f) * r / T).

T needs no engine. r does: it is calibrated from the trials measured so far (each measured S with
its replayed T gives r = T (1/S - f) / (1 - f)), per method, as r = 1 + a + b*k by Bayesian linear
regression (a fixed cost per step, a cost per drafted token), so a method with one measured depth
already predicts the others, and its uncertainty shrinks as depths are measured. Suffix decoding
drafts anything from 0 to k tokens a step (k is only its cap), so its k in that fit is the draft
tokens per step its replay shows. Knobs that change the step in ways no replay sees (KV dtype,
dtype, quantization, eager or compiled) enter as a measured factor on the speedup, one per knob
value, shrunk towards 1 until it has been measured; so do the lossless verification knobs (block
verification, probabilistic drafts), whose gain on sampled requests the replay of the standard
rule does not see.
EAGLE-3 is replayed from its head's chained drafts along the baseline's tokens (a trace: see
autotune.forecast.predict.eagle3_acceptance), when the study has one.
Methods no replay covers (EAGLE, MTP) get no prediction and are measured as before.
Pure numpy over plain data: no Optuna, no vLLM.
"""

from __future__ import annotations

import math
from statistics import NormalDist
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autotune.core.candidate import SPEC_DEFAULTS, Candidate
from autotune.forecast.predict import (SUFFIX_DEFAULTS, Acceptance, DraftTrace, Eagle3Trace, draft_acceptance, draft_traces,
                              eagle3_acceptance, eagle3_traces, ngram_acceptance, suffix_acceptance,
                              suffix_available)
from autotune.measure.intervals import LEVEL
from autotune.measure.resolution import NOISE_FLOOR

REPLAYED = ("ngram", "draft_model", "suffix", "eagle3", "dflash")  # methods whose acceptance the baseline's tokens give
# Methods vLLM runs with a depth per batch size (the suffix proposer asserts one fixed k).
SCHEDULED = ("ngram", "draft_model")
SUFFIX_KEYS = tuple(SUFFIX_DEFAULTS)
# What acceptance reads.
SHAPE = ("method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", *SUFFIX_KEYS,
         "parallel_drafting")
# What has no replay yet, in one line each (measured without a forecast).
UNFORECAST = {"dflash": "dflash: no forecast (the drafter was not traced over the baseline's outputs); measured",
              "dspark": "dspark: no forecast (a block drafter's drafts are not replayed yet); measured",
              "parallel_drafting": "parallel drafting: no forecast (the head's trace follows chained drafts, "
                                   "not one parallel pass); measured"}
Z = NormalDist().inv_cdf((1 + LEVEL) / 2)  # the forecasts' intervals at the one level (1.96 at 95%)
# Prior step cost r - 1 = a + b*k per method, (mean, sd) of a and of b: wide, so one measured depth
# dominates it. Measured on the demo pair (2 CPU cores): ngram r ~ 1.3 at k=4, draft r ~ 1.75 at k=2.
PRIORS: dict[str, tuple[tuple[float, float], tuple[float, float]]] = {
    "ngram": ((0.2, 0.5), (0.03, 0.15)),
    "draft_model": ((0.2, 0.5), (0.25, 0.3)),
    "suffix": ((0.2, 0.5), (0.03, 0.15)),  # a tree walk per step, and verifying like ngram
    "eagle3": ((0.2, 0.5), (0.15, 0.3)),  # one head layer per drafted token, over the target's states
    "dflash": ((0.2, 0.5), (0.03, 0.15)),  # one drafter pass a step whatever k: k costs the verification
}
FLOOR = NOISE_FLOOR  # least relative noise of one measured speedup beyond its windows: engine instances differ
KNOB_PRIOR_SD = 0.2  # log-factor of an unmeasured knob value: +-20% either way


@dataclass(frozen=True)
class Observation:
    """One measured candidate: its output tok/s over the baseline's, with a 95% interval."""

    params: dict[str, Any]
    speedup: float
    lo: float
    hi: float
    feasible: bool = True  # correct (and within SLOs): can be the best

    def rel_sd(self, floor: float = FLOOR) -> float:
        """Relative standard deviation of the speedup: its interval, and the noise between instances."""
        width = (self.hi - self.lo) / (2 * Z * self.speedup) if self.speedup > 0 and math.isfinite(self.hi - self.lo) \
            else 0.0
        return math.hypot(width, floor)


@dataclass(frozen=True)
class Forecast:
    """What a candidate is predicted to do, and from what."""

    params: dict[str, Any]
    label: str
    speedup: float | None = None  # None: no replay covers the method
    lo: float | None = None
    hi: float | None = None
    step_cost: float | None = None  # r: a step's cost over a baseline decode step
    acceptance: Acceptance | None = None
    basis: str = ""  # one line: what the number rests on

    @property
    def key(self) -> str:
        return Candidate(self.params).key()

    def to_dict(self) -> dict[str, Any]:
        a = self.acceptance
        return {"speedup": self.speedup, "lo": self.lo, "hi": self.hi, "step_cost": self.step_cost,
                "tokens_per_step": a.tokens_per_step if a else None,
                "mean_accepted_length": a.mean_accepted_length if a else None,
                "acceptance_rate": a.acceptance_rate if a else None, "basis": self.basis}


def shape(params: Mapping[str, Any]) -> tuple[Any, ...]:
    return tuple(params.get(k) for k in SHAPE)


@dataclass
class AcceptanceTable:
    """Replayed acceptance per (method, k, lookup), computed once per baseline and cached.

    ``outputs``: the baseline trial's outputs (with vLLM's ``prompt_token_ids``); ``argmax``: a draft
    trace's result (request id -> the draft's teacher-forced choices), or None when not traced;
    ``trace_failure``: why the trace failed, where it did (the draft's forecasts say so).
    """

    outputs: Sequence[dict[str, Any]]
    argmax: Mapping[str, list[int]] | None
    max_model_len: int
    trace_failure: str | None = None
    # An EAGLE-3 head's trace along each output (request id -> its chained greedy drafts, one per
    # decode step, and the target's tokens past an end-of-sequence: autotune.forecast.eagle3_trace.trace),
    # or None when not traced.
    eagle3: Mapping[str, dict[str, list]] | None = None
    # The model runner ngram runs on (autotune.core.runner): the baseline's own, as its engine
    # reported it (ngram needs nothing V2 lacks); V1 for studies that did not record one (CPU).
    ngram_runner: str = "v1"
    # A DFlash drafter's blocks along each output, per depth (request id -> {"drafts": {k: blocks},
    # "beyond": ...}: autotune.forecast.dflash_drafter.trace); a block's drafts are walked as a chain's.
    dflash: Mapping[str, dict[str, Any]] | None = None
    _cache: dict[tuple[Any, ...], Acceptance | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        usable = [o for o in self.outputs if o.get("prompt_token_ids") and o.get("token_ids")]
        self._pairs = [(o["prompt_token_ids"], o["token_ids"]) for o in usable]
        self._traces: list[DraftTrace] = draft_traces(usable, self.argmax) if self.argmax else []
        self._eagle3: list[Eagle3Trace] = eagle3_traces(usable, self.eagle3) if self.eagle3 else []
        # The depth the chains were traced to: deeper drafts are not known.
        self._eagle3_depth = min((len(c) for t in self._eagle3 for c in t.drafts), default=0)
        depths = {k for t in (self.dflash or {}).values() for k in t.get("drafts", {})}
        self._dflash: dict[int, list[Eagle3Trace]] = {
            int(k): eagle3_traces(usable, {rid: {"drafts": t["drafts"][k], "beyond": t.get("beyond", [])}
                                           for rid, t in (self.dflash or {}).items()}) for k in depths}

    def get(self, params: Mapping[str, Any]) -> Acceptance | None:
        s = shape(params)
        if s not in self._cache:
            self._cache[s] = self._replay(params)
        return self._cache[s]

    def _replay(self, p: Mapping[str, Any]) -> Acceptance | None:
        k = int(p.get("num_speculative_tokens") or 0)
        if p.get("method") == "ngram" and self._pairs and k:
            lo = int(p.get("prompt_lookup_min") or p.get("prompt_lookup_max") or 1)
            hi = int(p.get("prompt_lookup_max") or lo)
            return ngram_acceptance(self._pairs, k=k, min_n=lo, max_n=hi, max_model_len=self.max_model_len,
                                    runner=self.ngram_runner)
        if p.get("method") == "draft_model" and self._traces and k:
            return draft_acceptance(self._traces, k=k)
        if p.get("method") == "eagle3" and self._eagle3 and 0 < k <= self._eagle3_depth and not p.get("parallel_drafting"):
            return eagle3_acceptance(self._eagle3, k=k)
        if p.get("method") == "dflash" and k in self._dflash:
            return eagle3_acceptance(self._dflash[k], k=k)
        if p.get("method") == "suffix" and self._pairs and k and suffix_available():
            knob = {key: p.get(key) if p.get(key) is not None else d for key, d in SUFFIX_DEFAULTS.items()}
            return suffix_acceptance(self._pairs, k=k, max_model_len=self.max_model_len,
                                     max_tree_depth=int(knob["suffix_decoding_max_tree_depth"]),
                                     max_spec_factor=float(knob["suffix_decoding_max_spec_factor"]),
                                     min_token_prob=float(knob["suffix_decoding_min_token_prob"]),
                                     max_cached_requests=int(knob["suffix_decoding_max_cached_requests"]))
        return None

    def why_not(self, method: str, params: Mapping[str, Any] | None = None) -> str:
        if method == "dflash" and self._dflash:
            return f"dflash: the drafter was traced at k={', '.join(map(str, sorted(self._dflash)))}; other depths are measured"
        if method in UNFORECAST:
            return UNFORECAST[method]
        if (params or {}).get("parallel_drafting"):
            return UNFORECAST["parallel_drafting"]
        if method == "draft_model" and not self._traces:
            if self.trace_failure:
                return f"no draft trace: the trace failed ({self.trace_failure})"
            return "no draft trace (the draft was not traced over the baseline's outputs)"
        if method == "eagle3" and not self._eagle3:
            return "eagle3: no head trace (the EAGLE-3 head was not traced over the baseline's outputs); measured"
        if method == "eagle3":
            return f"eagle3: the head's trace goes {self._eagle3_depth} drafts deep; deeper is measured"
        if not self._pairs:
            return "the baseline's outputs have no token ids to replay"
        if method == "suffix" and not suffix_available():
            return "suffix: Arctic Inference is not installed here (pip install arctic-inference); measured"
        return f"{method}: no replay (needs the target's hidden states or a cache across requests); measured"


def knobs(params: Mapping[str, Any], baseline: Mapping[str, Any]) -> dict[str, Any]:
    """The knobs no replay sees, where they differ from the baseline's values."""
    return {k: v for k, v in params.items() if k not in SHAPE and baseline.get(k, SPEC_DEFAULTS.get(k)) != v}


def plain(params: Mapping[str, Any], baseline: Mapping[str, Any]) -> dict[str, Any]:
    """The candidate with its unreplayed knobs at the baseline's values."""
    base = {**SPEC_DEFAULTS, **baseline}
    return {**params, **{k: base[k] for k in knobs(params, baseline) if k in base}}


@dataclass(frozen=True)
class StepCost:
    """r = 1 + a + b*k for one method: the posterior mean and covariance of (a, b)."""

    mean: np.ndarray
    cov: np.ndarray
    points: int  # measured trials it was fitted on

    def at(self, k: float) -> tuple[float, float]:
        x = np.array([1.0, float(k)])
        return 1.0 + float(x @ self.mean), math.sqrt(max(float(x @ self.cov @ x), 0.0))


def fit_step_cost(method: str, points: Sequence[tuple[float, float, float]]) -> StepCost:
    """Bayesian linear regression of r - 1 on (1, k) from (k, r, sd of r) points, under PRIORS."""
    (a0, sa), (b0, sb) = PRIORS.get(method, ((0.3, 0.5), (0.1, 0.3)))
    precision = np.diag([1 / sa**2, 1 / sb**2])
    shift = precision @ np.array([a0, b0])
    for k, r, sd in points:
        x = np.array([1.0, float(k)])
        precision = precision + np.outer(x, x) / sd**2
        shift = shift + x * (r - 1) / sd**2
    cov = np.linalg.inv(precision)
    return StepCost(cov @ shift, cov, len(points))


def speedup_of(r: float, tokens_per_step: float, prefill_share: float) -> float:
    f = min(max(prefill_share, 0.0), 0.95)
    return 1.0 / (f + (1 - f) * max(r, 1e-3) / tokens_per_step)


def cost_depth(params: Mapping[str, Any], a: Acceptance) -> float:
    """The k of the step-cost fit: the depth, or for suffix decoding (whose k only caps a draft of
    any length) the draft tokens per decode step its replay shows."""
    if params.get("method") == "suffix":
        return a.draft_tokens / a.steps if a.steps else 0.0
    return float(params["num_speculative_tokens"])


def step_cost_of(speedup: float, tokens_per_step: float, prefill_share: float) -> float:
    """The inverse of speedup_of: the step cost a measured speedup implies."""
    f = min(max(prefill_share, 0.0), 0.95)
    return tokens_per_step * (1 / speedup - f) / (1 - f)


class Model:
    """Step-cost models and knob factors calibrated on the observations; forecasts any candidate."""

    def __init__(self, table: AcceptanceTable, observations: Sequence[Observation], baseline: Mapping[str, Any],
                 prefill_share: float):
        self.table, self.baseline, self.f = table, dict(baseline), prefill_share
        self.noise = FLOOR  # between engine instances; raised to what the fit's residuals show
        self._fit(observations)
        seen = self._residual_sd(observations)
        if seen > self.noise:
            self.noise = seen
            self._fit(observations)

    def _plain_points(self, observations: Sequence[Observation], method: str) -> list[tuple[Observation, float]]:
        out = []
        for o in observations:
            a = self.table.get(o.params) if o.params.get("method") == method else None
            if a is not None and not knobs(o.params, self.baseline) and math.isfinite(a.tokens_per_step):
                out.append((o, a.tokens_per_step))
        return out

    def _fit(self, observations: Sequence[Observation]) -> None:
        self.costs: dict[str, StepCost] = {}
        for method in REPLAYED:
            pts = []
            for o, t in self._plain_points(observations, method):
                r = step_cost_of(o.speedup, t, self.f)
                a = self.table.get(o.params)
                assert a is not None  # a plain point has a replay
                pts.append((cost_depth(o.params, a), r, max(r, 0.05) * o.rel_sd(self.noise) * 1.2))
            self.costs[method] = fit_step_cost(method, pts)
        self.factors = self._knob_factors(observations)

    def _residual_sd(self, observations: Sequence[Observation]) -> float:
        """The relative spread of measured speedups around the fit (2 parameters per fitted method):
        on a noisy machine, configs that do the same work measure apart, and the forecasts' intervals
        and the stop rule must widen to match."""
        res, params = [], 0
        for method in REPLAYED:
            pts = self._plain_points(observations, method)
            params += 2 if pts else 0
            for o, _ in pts:
                s = self._plain_speedup(o.params)
                if s is not None and o.speedup > 0:
                    res.append(math.log(o.speedup / s[0]))
        dof = len(res) - params
        return math.sqrt(sum(x * x for x in res) / dof) if dof >= 2 else 0.0

    def _plain_speedup(self, params: Mapping[str, Any]) -> tuple[float, float, float, Acceptance | None] | None:
        """(speedup, log-sd, r, acceptance) with the unreplayed knobs at the baseline's values."""
        method = params.get("method", "none")
        if method == "none":
            return 1.0, 0.0, 1.0, None
        a = self.table.get(params)
        if a is None or not math.isfinite(a.tokens_per_step):
            return None
        r, sd = self.costs[method].at(cost_depth(params, a))
        s = speedup_of(r, a.tokens_per_step, self.f)
        # d log S / d r = -(1 - f) / (T * (f + (1 - f) r / T)) = -(1 - f) S / T
        log_sd = (1 - self.f) * s / a.tokens_per_step * math.hypot(sd, self.noise * r)
        return s, log_sd, r, a

    def _knob_factors(self, observations: Sequence[Observation]) -> dict[tuple[str, Any], tuple[float, float, int]]:
        """(knob, value) -> (log-factor, its sd, observations), from measured/plain-predicted residuals,
        shrunk towards 0 by the prior."""
        residuals: dict[tuple[str, Any], list[float]] = {}
        for o in observations:
            extra = knobs(o.params, self.baseline)
            base = self._plain_speedup(plain(o.params, self.baseline)) if extra else None
            if base is None or o.speedup <= 0:
                continue
            for kv in extra.items():  # shared out when several knobs move at once
                residuals.setdefault(kv, []).append((math.log(o.speedup) - math.log(base[0])) / len(extra))
        out = {}
        for kv, res in residuals.items():
            each = max(0.05, self.noise)  # one residual's noise
            precision = len(res) / each**2 + 1 / KNOB_PRIOR_SD**2
            out[kv] = (sum(res) / each**2 / precision, math.sqrt(1 / precision), len(res))
        return out

    def known(self, kv: tuple[str, Any]) -> bool:
        return kv in self.factors

    def forecast(self, params: Mapping[str, Any]) -> Forecast:
        c = Candidate(dict(params))
        base = self._plain_speedup(plain(params, self.baseline))
        if base is None:
            return Forecast(dict(params), c.label, basis=self.table.why_not(c.method, params))
        s, log_sd, r, a = base
        log_s, parts = math.log(s), []
        for kv in knobs(params, self.baseline).items():
            mean, sd, n = self.factors.get(kv, (0.0, KNOB_PRIOR_SD, 0))
            log_s += mean
            log_sd = math.hypot(log_sd, sd)
            parts.append(f"{kv[0]}={kv[1]} x{math.exp(mean):.2f}" + ("" if n else " (not measured)"))
        if c.method in REPLAYED:
            cost = self.costs[c.method]
            parts.insert(0, f"{a.tokens_per_step:.2f} tokens/step replayed, step cost {r:.2f}x "
                            f"({'prior' if not cost.points else f'fit on {cost.points} trial(s)'})")
        return Forecast(dict(params), c.label, math.exp(log_s), math.exp(log_s - Z * log_sd),
                        math.exp(log_s + Z * log_sd), r, a, "; ".join(parts) or "the baseline")
