"""How the study chooses what to measure next: ``predict`` (the default), ``grid``, ``tpe``, ``random``.

``predict``: after the baseline (and one teacher-forced pass of the draft over its outputs), every
point of the space has a forecast (autotune.forecast). The study measures the best-forecast
candidate of each method first, recalibrates after every trial, then the candidate with the best
optimistic forecast (the top of its interval) while that beats the best measured speedup by more
than the measured noise, and then the knobs no replay sees (KV dtype, dtype, quantization, eager)
one at a time around the best measured config; then it stops, whatever budget is left.
``grid`` walks the space in declaration order; ``tpe`` and ``random`` are Optuna's samplers.
Every measured candidate is an Optuna trial: the planned ones are queued with ``enqueue_trial``.

``next_predicted`` and ``next_in_grid`` are pure (the benchmark replays them on a measured table);
``plan`` reads them off a live study.
"""

from __future__ import annotations

import math
import threading
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune import attrs
from autotune.candidate import Candidate
from autotune.forecast import SHAPE, AcceptanceTable, Forecast, Model, Observation, knobs

STRATEGIES = ("predict", "grid", "tpe", "random")
NOISE_MIN = 0.02  # never chase a forecast gain under 2%, however tight the best's interval


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
    bad = _bad_knobs(observations, failed, base)
    open_ = [c for c in grid if c.key() not in tried and not set(knobs(c.params, base).items()) & bad]
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
    noise = max(NOISE_MIN, best.rel_sd(model.noise))
    bar = best.speedup * (1 + noise)
    # 2. The best optimistic forecast among candidates whose every knob value has been measured.
    ready = [f for f in forecasts.values()
             if f.hi is not None and all(model.known(kv) for kv in knobs(f.params, base).items())]
    top = max(ready, key=lambda f: f.hi, default=None)
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
    top_text = f"{top.label} at most {top.hi:.2f}x" if top is not None else "none left"
    return Step(None, f"no unmeasured candidate can beat the best measured ({Candidate(best.params).label}, "
                      f"{best.speedup:.2f}x) by more than the noise ({noise:.0%}): {top_text}", stop=True)


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


# --- a live study ---------------------------------------------------------------------------

_tables: dict[tuple[Any, ...], AcceptanceTable] = {}
_traces: dict[tuple[Any, ...], threading.Lock] = {}  # one lock per baseline and trace: each runs once
_lock = threading.Lock()  # guards the two dicts only; never held while anything is computed or run


def _baseline_key(study: Any, base: Any) -> tuple[str, int, str]:
    # The study's name alone is not enough (two studies of one name in one process, e.g. a test
    # suite's, would share a stale table), so the baseline's start time is part of the key.
    return study.study_name, base.number, str(base.datetime_start)


def study_model(study: Any, space: Any, max_model_len: int | None, *, level: str | None = None
                ) -> tuple[Model, list[Observation], list[dict[str, Any]]] | None:
    """The calibrated model of a study with a baseline, its observations and its failed candidates.

    ``level``: another load level the trials were measured at (``concurrency=8``): the same replayed
    acceptance, the step cost fitted on the throughput measured there (autotune.schedule)."""
    from optuna.trial import TrialState

    from autotune.metrics import ratio_interval
    from autotune.pareto import feasible, is_schedule, reference_trial, superseded
    from autotune.study import baseline_trial

    base, ref = baseline_trial(study), reference_trial(study)
    if base is None:
        return None
    old = superseded(study)
    trace = study.user_attrs.get(attrs.DRAFT_TRACE) or {}
    eagle3 = study.user_attrs.get(attrs.EAGLE3_TRACE) or {}
    # Replays are cached per baseline trial (and its traces, once there are).
    key = (*_baseline_key(study, base), bool(trace.get("argmax")), trace.get("failure"), bool(eagle3.get("traces")))
    with _lock:
        table = _tables.get(key)
    if table is None:  # built outside the lock: two threads may both build it, the first kept
        table = AcceptanceTable(base.user_attrs.get(attrs.OUTPUTS, []), trace.get("argmax"), max_model_len or 1 << 30,
                                trace_failure=trace.get("failure"), eagle3=eagle3.get("traces"))
        with _lock:
            table = _tables.setdefault(key, table)
    at = "" if level is None else f"@{level}"
    bm = attrs.measurement(ref)
    observations, failed = [Observation(attrs.candidate(base), 1.0, 1.0, 1.0)], []
    for t in study.get_trials(deepcopy=False):
        if t.number in (base.number, ref.number) or attrs.is_duplicate(t) or attrs.is_interrupted(t) \
                or attrs.role(t) == attrs.EXTRA_BASELINE or t.number in old:
            continue
        if t.state == TrialState.FAIL:
            failed.append(attrs.candidate(t))
        elif t.state == TrialState.COMPLETE:
            m = attrs.measurement(t)
            if m.get("output_tok_s" + at) is None or is_schedule(t):
                continue  # not measured at this level; a schedule is no fixed depth
            c = attrs.candidate(t)
            s = m["output_tok_s" + at] / bm["output_tok_s" + at] if bm.get("output_tok_s" + at) else float("nan")
            lo, hi = ratio_interval(m.get("output_tok_s_windows" + at, []), bm.get("output_tok_s_windows" + at, []))
            if math.isfinite(s):
                observations.append(Observation(c, s, lo, hi, feasible(t)))
    share = bm.get("prefill_share" + at, float("nan"))  # vLLM's own prefill and decode times
    if not math.isfinite(share):  # runs from before they were read: the client's view
        share = bm.get("ttft_ms_mean" + at, 0.0) / bm["e2e_ms_mean" + at] if bm.get("e2e_ms_mean" + at) else 0.0
    return Model(table, observations, attrs.candidate(base), share), observations, failed


def plan(study: Any, space: Any, strategy: str, max_model_len: int | None, *, past_edge: bool = False) -> Step:
    """The strategy's next step for a live study (after its baseline)."""
    from optuna.trial import TrialState

    if strategy not in ("predict", "grid"):
        return ASK
    busy = [attrs.candidate(t) for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))]
    got = study_model(study, space, max_model_len)
    if got is None:
        return ASK
    model, observations, failed = got
    # A pruned candidate was tried (so not planned again), though no knob of it failed.
    pruned = [attrs.candidate(t) for t in study.get_trials(deepcopy=False, states=(TrialState.PRUNED,))
              if attrs.PRUNED_WHY in t.user_attrs]
    if strategy == "grid":
        tried = {Candidate(dict(p)).key() for p in [*(o.params for o in observations), *failed, *busy, *pruned]}
        return next_in_grid(space.grid(), tried)
    return next_predicted(space.grid(), model, observations, failed, [*busy, *pruned], past_edge=past_edge)


def edge_report(study: Any, pick: Any) -> list[dict[str, Any]] | None:
    """The pick on an edge of the study's space (its recorded one), with the forecast one step past
    it beside the pick's own forecast: whether widening the space could pay. None: no space, no
    baseline, or no pick."""
    from autotune.space import reload_space

    from autotune.pareto import is_schedule

    resolved = study.user_attrs.get(attrs.SPACE_RESOLVED)
    if pick is None or not resolved or is_schedule(pick):
        return None  # a depth schedule's pick has no single depth to look past
    try:
        space = reload_space(resolved)
    except Exception:  # noqa: BLE001 - a space this build cannot rebuild: no edge report
        return None
    got = study_model(study, space, study.user_attrs.get(attrs.MAX_MODEL_LEN))
    if got is None:
        return None
    model, _, _ = got
    params = attrs.candidate(pick)
    own = model.forecast(params)
    return [{"knob": k, "top": top, "beyond": beyond, "forecast": f.speedup, "lo": f.lo, "hi": f.hi,
             "pick_forecast": own.speedup} for k, top, beyond, f in past_the_edge(space.grid(), model, params)]


def forecast_for(study: Any, space: Any, params: Mapping[str, Any], max_model_len: int | None) -> Forecast | None:
    got = study_model(study, space, max_model_len)
    return None if got is None else got[0].forecast(params)


def _traced(space: Any, settings: Any) -> tuple[bool, bool]:
    """(the draft model, the EAGLE-3 head): which the space searches and the study has."""
    methods = next((p.choices for p in space.params if p.name == "method"), ())
    return ("draft_model" in methods and bool(settings.draft_model),
            "eagle3" in methods and bool(getattr(settings, "eagle3_head", None)))


def needs_trace(space: Any, settings: Any) -> bool:
    return any(_traced(space, settings))


def trace_draft(study: Any, space: Any, cfg: Any, env: dict[str, str], results_dir: Path) -> str | None:
    """One teacher-forced pass of the draft over the baseline's outputs (a worker job), kept in the
    study (``draft_trace``) so every forecast of a draft depth reads it; a failure is kept too, and
    returned (to the caller that ran the trace) for it to say. Workers that reach it meanwhile wait
    for this baseline's trace only: planning, forecasts and other studies go on. Where the space
    searches eagle3 with a head, the head's chains are traced first (``trace_eagle3``)."""
    from autotune.predict import trace_job
    from autotune.study import baseline_trial
    from autotune.worker import run_trial

    base = baseline_trial(study)
    draft, eagle3 = _traced(space, cfg.settings)
    if base is not None and eagle3 and attrs.EAGLE3_TRACE not in study.user_attrs:
        trace_eagle3(study, space, cfg, base)
    if base is None or not draft or attrs.DRAFT_TRACE in study.user_attrs:
        return None
    with _lock:
        mine = _traces.setdefault(_baseline_key(study, base), threading.Lock())
    with mine:
        if attrs.DRAFT_TRACE in study.user_attrs:
            return None
        kwargs = {**space.baseline_candidate().engine_kwargs(cfg.settings), "model": cfg.settings.draft_model,
                  "enforce_eager": True}  # eager: the trace is one prefill per request, no compile wanted
        kwargs.pop("kv_cache_dtype", None)
        job = trace_job(kwargs, base.user_attrs.get(attrs.OUTPUTS, []), cfg.engine_module)
        out = run_trial(job, results_dir / "draft-trace", timeout_s=cfg.trial_timeout_s, env=env)
        study.set_user_attr(attrs.DRAFT_TRACE, {"argmax": out.raw["traces"], "wall_s": round(out.wall_s, 1),
                                                    "rank_mismatches": out.raw.get("rank_mismatches")}
                            if out.raw is not None else {"failure": out.failure, "wall_s": round(out.wall_s, 1)})
    return out.failure


def trace_eagle3(study: Any, space: Any, cfg: Any, base: Any) -> None:
    """The EAGLE-3 head's chained greedy drafts along the baseline's outputs, as deep as the space
    searches (transformers: the target's hidden states and the head, autotune.demo.eagle3.trace),
    kept in the study (``eagle3_trace``) for every eagle3 forecast; a failure is kept instead, and
    eagle3 is then measured without a forecast (a head the trace cannot read, a target transformers
    cannot load)."""
    import time

    with _lock:
        mine = _traces.setdefault((*_baseline_key(study, base), "eagle3"), threading.Lock())
    with mine:
        if attrs.EAGLE3_TRACE in study.user_attrs:
            return
        depth = max((int(v) for p in space.params if p.name == "num_speculative_tokens" for v in p.values()),
                    default=1)
        outputs = [o for o in base.user_attrs.get(attrs.OUTPUTS, []) if o.get("prompt_token_ids") and o.get("token_ids")]
        t0 = time.monotonic()
        try:
            from autotune.demo.eagle3 import trace

            traced = trace([(o["prompt_token_ids"], o["token_ids"]) for o in outputs], depth=depth,
                           head_dir=Path(cfg.settings.eagle3_head), target_dir=Path(cfg.settings.model), threads=2)
            got: dict[str, Any] = {"traces": {o["id"]: t for o, t in zip(outputs, traced)}, "depth": depth}
        except Exception as e:  # noqa: BLE001 - any failure means: measured, not forecast
            got = {"failure": f"{type(e).__name__}: {e}"}
        study.set_user_attr(attrs.EAGLE3_TRACE, {**got, "wall_s": round(time.monotonic() - t0, 1)})


def ranked(study: Any, space: Any, max_model_len: int | None) -> list[dict[str, Any]]:
    """Every point of the space, forecast by the study's calibrated model, best first, each with what
    it measured (if it was measured): `autotune predict`."""
    got = study_model(study, space, max_model_len)
    if got is None:
        return []
    model, observations, failed = got
    measured = {Candidate(o.params).key(): o for o in observations}
    bad = {Candidate(p).key() for p in failed}
    rows = []
    for c in space.grid():
        f, o = model.forecast(c.params), measured.get(c.key())
        rows.append({"label": c.label, "params": c.params, **f.to_dict(),
                     "measured": None if o is None else o.speedup, "measured_lo": None if o is None else o.lo,
                     "measured_hi": None if o is None else o.hi, "correct": None if o is None else o.feasible,
                     "failed": c.key() in bad})
    return sorted(rows, key=lambda r: -(r["speedup"] if r["speedup"] is not None else -1.0))


def forecast_table(results: Path, *, study: str | None = None, storage: str | None = None,
                   space: str | None = None) -> tuple[list[dict[str, Any]], str]:
    """`autotune predict`: the ranked forecast of a saved study (and a title), without an engine."""
    import optuna

    from autotune import hardware
    from autotune.errors import BadInput
    from autotune.space import load_space, reload_space
    from autotune.storage import open_storage

    name = study or results.name
    if storage is None:
        db = results / "study.db"
        if not db.is_file():
            raise BadInput(f"{db}: no such study storage (expected a results folder from `autotune search`, "
                           "or pass --storage)")
        storage = f"sqlite:///{db.resolve()}"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)  # heartbeats (RDB)
    try:
        st = optuna.load_study(study_name=name, storage=open_storage(storage))
    except KeyError:
        raise BadInput(f"--study: no study {name!r} in {storage}") from None
    resolved = st.user_attrs.get(attrs.SPACE_RESOLVED)
    if space is not None:
        platform = hardware.detect()
        sp = load_space(space, platform=platform, models=set((resolved or {}).get("models", ["draft_model"])),
                        tags=hardware.platform_tags(platform))
    elif resolved:
        sp = reload_space(resolved)
    else:
        raise BadInput(f"{results}: the study does not record its search space; pass --space")
    rows = ranked(st, sp, st.user_attrs.get(attrs.MAX_MODEL_LEN))
    if not rows:
        raise BadInput(f"{results}: study {name!r} has no completed baseline yet: nothing to forecast from")
    trace = st.user_attrs.get(attrs.DRAFT_TRACE) or {}
    measured = sum(r["measured"] is not None for r in rows)
    title = (f"{name}: {len(rows)} candidates of space '{sp.name}', forecast from the baseline's tokens"
             + (", the draft's trace" if trace.get("argmax") else "") + f" and {measured} measured")
    return rows, title
