"""The pure choice policies: which candidate to measure next from forecasts and measurements, when
to stop, when a candidate is hopeless, and what lies one step past the space's edge.

``next_predicted`` and ``next_in_grid`` are pure (benchmarks/search_efficiency.py replays them on
a measured table); autotune.study.strategy reads them off a live study.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autotune.core.candidate import Candidate
from autotune.forecast.forecast import SHAPE, Forecast, Model, Observation, knobs


STRATEGIES = ("predict", "grid", "tpe", "random")



@dataclass(frozen=True)
class Step:
    """The strategy's answer: measure ``params`` next, or stop (``stop``), or let the sampler ask."""

    params: dict[str, Any] | None
    why: str
    stop: bool = False
    beyond: dict[str, Any] | None = None  # knob values past the space's edge, on top of ``params``


ASK = Step(None, "the sampler's choice")


def next_in_grid(grid: Sequence[Candidate], tried: set[str]) -> Step:
    for c in grid:
        if c.key() not in tried:
            return Step(dict(c.params), "next in the grid")
    return Step(None, "every point of the space is measured", stop=True)


def _bad_knobs(observations: Sequence[Observation], failed: Sequence[Mapping[str, Any]],
               baseline: Mapping[str, Any]) -> set[tuple[str, Any]]:
    """Knob values seen only in failed or incorrect trials: not tried again in other combinations."""
    good = {kv for o in observations if o.feasible for kv in knobs(o.params, baseline).items()}
    seen = {kv for o in observations if not o.feasible for kv in knobs(o.params, baseline).items()}
    seen |= {kv for p in failed for kv in knobs(p, baseline).items()}
    return seen - good


# Integer knobs whose space may end before the workload stops gaining (deeper drafts, longer lookups).
EDGE_KNOBS = ("num_speculative_tokens", "prompt_lookup_max", "suffix_decoding_max_tree_depth")


def edges(grid: Sequence[Candidate], params: Mapping[str, Any]) -> list[tuple[str, int, int]]:
    """(knob, the space's top value, one step past it) for each integer knob at whose top value
    ``params`` sits, among the grid's candidates of the same method (the step: the grid's own)."""
    same = [c.params for c in grid if c.params.get("method") == params.get("method")]
    out = []
    for k in EDGE_KNOBS:
        vals = sorted({p[k] for p in same if isinstance(p.get(k), int) and not isinstance(p.get(k), bool)})
        if not vals or params.get(k) != vals[-1]:
            continue
        out.append((k, vals[-1], vals[-1] + min((b - a for a, b in zip(vals, vals[1:])), default=1)))
    return out


def past_the_edge(grid: Sequence[Candidate], model: Model, params: Mapping[str, Any]
                  ) -> list[tuple[str, int, int, Forecast]]:
    """Each edge ``params`` sits on, with the forecast one step past it (no engine: a replay)."""
    out = []
    for k, top, beyond in edges(grid, params):
        f = model.forecast({**params, k: beyond})
        if f.speedup is not None:
            out.append((k, top, beyond, f))
    return out


def next_predicted(grid: Sequence[Candidate], model: Model, observations: Sequence[Observation],
                   failed: Sequence[Mapping[str, Any]] = (), busy: Sequence[Mapping[str, Any]] = (),
                   *, past_edge: bool = False) -> Step:
    """The next candidate to measure under ``predict``, or the reason to stop.

    ``observations``: measured candidates (the baseline among them, speedup 1); ``failed``: the
    parameters of trials that failed; ``busy``: those being measured now (other workers).
    ``past_edge``: before stopping, measure one step past an edge of the space that the best
    measured config sits on, where the forecast there beats it by more than the noise.
    """
    base = model.baseline
    tried = {Candidate(dict(p)).key() for p in [*(o.params for o in observations), *failed, *busy]}
    open_ = unmeasured(grid, model, observations, failed, busy)
    forecasts = {c.key(): model.forecast(c.params) for c in open_}
    started = {p.get("method", "none") for p in [*(o.params for o in observations), *failed, *busy]}
    # 1. The best-forecast candidate of each method not yet measured, best method first; a method no
    #    replay covers at the middle of its depths.
    firsts: list[tuple[float, Forecast]] = []
    for method in dict.fromkeys(c.method for c in open_):
        if method in started:
            continue
        mine = [forecasts[c.key()] for c in open_ if c.method == method and not knobs(c.params, base)]
        scored = [f for f in mine if f.speedup is not None]
        if scored:
            top = max(scored, key=lambda f: f.speedup)
            firsts.append((top.speedup, top))
        elif mine:
            firsts.append((0.0, mine[len(mine) // 2]))
    if firsts:
        f = max(firsts, key=lambda x: x[0])[1]
        return Step(f.params, f"first {f.params.get('method')} candidate: " + _predicted(f))
    feasible = [o for o in observations if o.feasible]
    if not feasible:
        return Step(None, "no correct candidate measured, not even the baseline", stop=True)
    best = max(feasible, key=lambda o: o.speedup)
    noise = best.rel_sd(model.noise)  # at least the model's noise, itself at least forecast.FLOOR
    bar = best.speedup * (1 + noise)
    # 2. The best optimistic forecast among candidates whose every knob value has been measured.
    top = best_optimistic(forecasts.values(), model)
    if top is not None and top.hi > bar:
        return Step(top.params, _predicted(top) + f"; could beat the best measured {best.speedup:.2f}x")
    # 3. Each unmeasured knob value, one at a time around the best measured config.
    for c in open_:
        moved = knobs(c.params, best.params)
        same_shape = all(c.params.get(k) == best.params.get(k) for k in SHAPE) and c.params.keys() == best.params.keys()
        (k, v), = moved.items() if len(moved) == 1 else ((None, None),)
        if same_shape and k is not None and base.get(k) != v and not model.known((k, v)):
            return Step(c.params, f"{k}={v} not measured yet: tried on the best so far "
                                  f"({Candidate(best.params).label})")
    # 4. One step past an edge of the space the best sits on, where the forecast there clears the noise.
    for k, top_value, beyond, f in (past_the_edge(grid, model, best.params) if past_edge else []):
        if Candidate({**best.params, k: beyond}).key() not in tried and f.speedup > bar:
            return Step(dict(best.params), f"past the space's edge: {Candidate(best.params).label} sits at its top "
                                           f"{k} ({top_value}); at {beyond} " + _predicted(f)
                        + f", above the best measured {best.speedup:.2f}x by more than the noise ({noise:.0%})",
                        beyond={k: beyond})
    return Step(None, stop_text(f"the best measured ({Candidate(best.params).label}, {best.speedup:.2f}x)", noise, top),
                stop=True)


STOP_UNMEASURED = "no unmeasured candidate can beat"  # how the predict strategy's stop line begins


def unmeasured(grid: Sequence[Candidate], model: Model, observations: Sequence[Observation],
               failed: Sequence[Mapping[str, Any]] = (), busy: Sequence[Mapping[str, Any]] = ()) -> list[Candidate]:
    """The grid's candidates not measured, failed or being measured, without a knob value seen only in
    failed or incorrect trials: what the strategy may still measure."""
    tried = {Candidate(dict(p)).key() for p in [*(o.params for o in observations), *failed, *busy]}
    bad = _bad_knobs(observations, failed, model.baseline)
    return [c for c in grid if c.key() not in tried and not set(knobs(c.params, model.baseline).items()) & bad]


def best_optimistic(forecasts: Any, model: Model) -> Forecast | None:
    """The forecast with the highest top of its interval among those whose every knob value was measured."""
    ready = [f for f in forecasts if f.hi is not None and all(model.known(kv) for kv in knobs(f.params, model.baseline).items())]
    return max(ready, key=lambda f: f.hi, default=None)


def stop_text(best: str, noise: float, top: Forecast | None) -> str:
    """The stop line: ``best`` (what is named as the best measured, with its figure) and the best optimistic
    forecast left (``top``), which lies within ``noise`` of it."""
    top_text = f"{top.label} at most {top.hi:.2f}x" if top is not None else "none left"
    return f"{STOP_UNMEASURED} {best} by more than the noise ({noise:.0%}): {top_text}"


def hopeless(first: float, best: float, noise: float, forecast_hi: float | None) -> str | None:
    """Why a candidate whose first window measured ``first`` (its speedup over the baseline) cannot
    reach the best measured speedup ``best``, or None while it might: even ``noise`` twice over
    (the spread between instances, which one window's number does not yet include) leaves it
    below, and where there is a forecast its top says so too."""
    if not (math.isfinite(first) and math.isfinite(best)) or first * (1 + 2 * noise) >= best:
        return None
    if forecast_hi is not None and forecast_hi >= best:
        return None
    return (f"its first window measured {first:.2f}x the baseline; with twice the noise ({noise:.0%}) it stays "
            f"below the best measured {best:.2f}x" + (f", as its forecast's top {forecast_hi:.2f}x does"
                                                       if forecast_hi is not None else ""))

def _predicted(f: Forecast) -> str:
    if f.speedup is None:
        return f"no prediction ({f.basis})"
    return f"predicted {f.speedup:.2f}x [{f.lo:.2f}-{f.hi:.2f}]"

