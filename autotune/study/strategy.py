"""How the study chooses what to measure next: ``predict`` (the default), ``grid``, ``tpe``, ``random``.

``predict``: after the baseline (and one teacher-forced pass of the draft over its outputs), every
point of the space has a forecast (autotune.forecast.forecast). The study measures the best-forecast
candidate of each method first, recalibrates after every trial, then the candidate with the best
optimistic forecast (the top of its interval) while that beats the best measured speedup by more
than the measured noise, and then the knobs no replay sees (KV dtype, dtype, quantization, eager)
one at a time around the best measured config; then it stops, whatever budget is left.
``grid`` walks the space in declaration order; ``tpe`` and ``random`` are Optuna's samplers.
Every measured candidate is an Optuna trial: the planned ones are queued with ``enqueue_trial``.

The policies themselves are pure (autotune.forecast.policy); ``plan`` reads them off a live study.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.core import attrs
from autotune.core.candidate import Candidate
from autotune.forecast.forecast import AcceptanceTable, Forecast, Model, Observation
from autotune.measure.objectives import WINDOWS, metric_key
from autotune.forecast.policy import (ASK, Step, next_in_grid,
                                      next_predicted, past_the_edge)
from autotune.study.head_trace import baseline_key, ensure_eagle3_trace, trace_eagle3, traced_models

__all__ = ["ensure_eagle3_trace", "forecast_table", "needs_trace", "plan", "ranked", "study_model", "trace_draft",
           "trace_eagle3"]

if TYPE_CHECKING:
    from autotune.study.view import StudyView


# --- a live study (as read once: autotune.study.view) ------------------------------------------

_tables: dict[tuple[Any, ...], AcceptanceTable] = {}
_traces: dict[tuple[Any, ...], threading.Lock] = {}  # one lock per baseline and trace: each runs once
_lock = threading.Lock()  # guards the two dicts only; never held while anything is computed or run


def study_model(view: StudyView, space: Any, max_model_len: int | None, *, level: str | None = None
                ) -> tuple[Model, list[Observation], list[dict[str, Any]]] | None:
    """The calibrated model of a study with a baseline, its observations and its failed candidates.

    ``level``: another load level the trials were measured at (``concurrency=8``): the same replayed
    acceptance, the step cost fitted on the throughput measured there (autotune.study.schedule)."""
    from optuna.trial import TrialState

    from autotune.measure.metrics import ratio_interval
    from autotune.study.trials import counts, feasible, is_schedule

    base, ref = view.baseline, view.reference
    if base is None:
        return None
    old = view.superseded
    trace = view.user_attrs.get(attrs.DRAFT_TRACE) or {}
    eagle3 = view.user_attrs.get(attrs.EAGLE3_TRACE) or {}
    dflash = view.user_attrs.get(attrs.DFLASH_TRACE) or {}
    # ngram replays the rule of the runner the baseline's engine ran (autotune.core.runner)
    ngram_runner = attrs.measurement(base).get("model_runner") or "v1"
    # Replays are cached per baseline trial (and its traces, once there are).
    key = (*baseline_key(view, base), bool(trace.get("argmax")), trace.get("failure"), bool(eagle3.get("traces")),
           bool(dflash.get("traces")), ngram_runner)
    with _lock:
        table = _tables.get(key)
    if table is None:  # built outside the lock: two threads may both build it, the first kept
        table = AcceptanceTable(base.user_attrs.get(attrs.OUTPUTS, []), trace.get("argmax"), max_model_len or 1 << 30,
                                trace_failure=trace.get("failure"), eagle3=eagle3.get("traces"),
                                ngram_runner=ngram_runner, dflash=dflash.get("traces"))
        with _lock:
            table = _tables.setdefault(key, table)
    def k(metric: str, suffix: str = "") -> str:  # the measurement key at this level
        return metric_key(metric, level, suffix)

    bm = attrs.measurement(ref)
    observations, failed = [Observation(attrs.candidate(base), 1.0, 1.0, 1.0)], []
    for t in view.trials:
        # the current records, as the tables read them: a holdout instance is the figure's, never a record
        if t.number in (base.number, ref.number) or not counts(t) or attrs.role(t) in (attrs.EXTRA_BASELINE, attrs.HOLDOUT) \
                or t.number in old:
            continue
        if t.state == TrialState.FAIL:
            failed.append(attrs.candidate(t))
        elif t.state == TrialState.COMPLETE:
            m = attrs.measurement(t)
            if m.get(k("output_tok_s")) is None or is_schedule(t):
                continue  # not measured at this level; a schedule is no fixed depth
            c = attrs.candidate(t)
            s = m[k("output_tok_s")] / bm[k("output_tok_s")] if bm.get(k("output_tok_s")) else float("nan")
            lo, hi = ratio_interval(m.get(k("output_tok_s", WINDOWS), []), bm.get(k("output_tok_s", WINDOWS), []))
            if math.isfinite(s):
                observations.append(Observation(c, s, lo, hi, feasible(t)))
    share = bm.get(k("prefill_share"), float("nan"))  # vLLM's own prefill and decode times
    if not math.isfinite(share):  # runs from before they were read: the client's view
        share = bm.get(k("ttft_ms_mean"), 0.0) / bm[k("e2e_ms_mean")] if bm.get(k("e2e_ms_mean")) else 0.0
    return Model(table, observations, attrs.candidate(base), share), observations, failed


def plan(view: StudyView, space: Any, strategy: str, max_model_len: int | None, *, past_edge: bool = False) -> Step:
    """The strategy's next step for a live study (after its baseline)."""
    from optuna.trial import TrialState

    if strategy not in ("predict", "grid"):
        return ASK
    busy = [attrs.candidate(t) for t in view.running]
    got = study_model(view, space, max_model_len)
    if got is None:
        return ASK
    model, observations, failed = got
    # A pruned candidate was tried (so not planned again), though no knob of it failed.
    pruned = [attrs.candidate(t) for t in view.in_state(TrialState.PRUNED) if attrs.PRUNED_WHY in t.user_attrs]
    if strategy == "grid":
        tried = {Candidate(dict(p)).key() for p in [*(o.params for o in observations), *failed, *busy, *pruned]}
        return next_in_grid(space.grid(), tried)
    return next_predicted(space.grid(), model, observations, failed, [*busy, *pruned], past_edge=past_edge)


def edge_report(view: StudyView, pick: Any) -> list[dict[str, Any]] | None:
    """The pick on an edge of the study's space (its recorded one), with the forecast one step past
    it beside the pick's own forecast: whether widening the space could pay. None: no space, no
    baseline, or no pick."""
    from autotune.core.space import reload_space

    from autotune.study.trials import is_schedule

    resolved = view.user_attrs.get(attrs.SPACE_RESOLVED)
    if pick is None or not resolved or is_schedule(pick):
        return None  # a depth schedule's pick has no single depth to look past
    try:
        space = reload_space(resolved)
    except Exception:  # noqa: BLE001 - a space this build cannot rebuild: no edge report
        return None
    got = study_model(view, space, view.user_attrs.get(attrs.MAX_MODEL_LEN))
    if got is None:
        return None
    model, _, _ = got
    params = attrs.candidate(pick)
    own = model.forecast(params)
    return [{"knob": k, "top": top, "beyond": beyond, "forecast": f.speedup, "lo": f.lo, "hi": f.hi,
             "pick_forecast": own.speedup} for k, top, beyond, f in past_the_edge(space.grid(), model, params)]


def stop_line(view: StudyView, pick: Any) -> str | None:
    """The predict strategy's stop line, read again from the final records (the ones every table shows):
    no unmeasured candidate beats the pick (its speedup as the Pareto table shows it) by more than the
    noise, or which one might now, and how to measure it. None: no space, baseline or pick to read."""
    from autotune.core.space import reload_space
    from autotune.forecast.policy import best_optimistic, stop_text, unmeasured
    from autotune.study.pareto import record_speedup

    resolved = view.user_attrs.get(attrs.SPACE_RESOLVED)
    if pick is None or not resolved:
        return None
    try:
        space = reload_space(resolved)
    except Exception:  # noqa: BLE001 - a space this build cannot rebuild: the line as the study wrote it
        return None
    got = study_model(view, space, view.user_attrs.get(attrs.MAX_MODEL_LEN))
    record = view.latest(pick)
    s = (record_speedup(view, record) or {}).get("output_tok_s")
    if got is None or not isinstance(s, (int, float)) or not math.isfinite(s):
        return None
    model, observations, failed = got
    key = Candidate(attrs.candidate(pick)).key()
    own = next((o for o in observations if Candidate(o.params).key() == key), None)
    noise = own.rel_sd(model.noise) if own is not None else model.noise
    top = best_optimistic([model.forecast(c.params) for c in unmeasured(space.grid(), model, observations, failed)],
                          model)
    over = f"{s:.2f}x over trial {view.reference.number}" if view.reference is not None else f"{s:.2f}x"
    named = f"the pick ({attrs.label(pick)}, {over}, as the table shows it)"
    if top is not None and top.hi > s * (1 + noise):  # the records moved after the strategy stopped
        return (f"stopped when no unmeasured candidate could beat the best measured then; on the final records "
                f"{top.label} could reach {top.hi:.2f}x, above {named} by more than the noise ({noise:.0%}): "
                f"--resume with --candidates {len(view.finished) + 1} measures it")
    return stop_text(named, noise, top)


def forecast_for(view: StudyView, space: Any, params: Mapping[str, Any], max_model_len: int | None
                 ) -> Forecast | None:
    got = study_model(view, space, max_model_len)
    return None if got is None else got[0].forecast(params)


def needs_trace(space: Any, settings: Any) -> bool:
    return any(traced_models(space, settings))


def trace_draft(study: Any, view: StudyView, space: Any, cfg: Any, env: dict[str, str], results_dir: Path
                ) -> str | None:
    """One teacher-forced pass of the draft over the baseline's outputs (a worker job), kept in the
    study (``draft_trace``) so every forecast of a draft depth reads it; a failure is kept too, and
    returned (to the caller that ran the trace) for it to say. Workers that reach it meanwhile wait
    for this baseline's trace only: planning, forecasts and other studies go on. Where the space
    searches eagle3 with a head, the head's chains are traced first (``trace_eagle3``).
    ``study``: for keeping the trace; ``view``: the study as this step read it."""
    from autotune.forecast.predict import trace_job
    from autotune.run.engine import UNTIMED_ENV
    from autotune.run.worker import run_trial

    base = view.baseline
    draft, eagle3 = traced_models(space, cfg.settings)
    if base is not None and eagle3 and attrs.EAGLE3_TRACE not in view.user_attrs:
        trace_eagle3(study, view, space, cfg, base, env)
    if base is None or not draft or attrs.DRAFT_TRACE in view.user_attrs:
        return None
    with _lock:
        mine = _traces.setdefault(baseline_key(view, base), threading.Lock())
    with mine:
        if _kept(study, attrs.DRAFT_TRACE):
            return None
        kwargs = {**space.baseline_candidate().engine_kwargs(cfg.settings), "model": cfg.settings.draft_model,
                  "enforce_eager": True}  # eager: the trace is one prefill per request, no compile wanted
        kwargs.pop("kv_cache_dtype", None)
        job = trace_job(kwargs, base.user_attrs.get(attrs.OUTPUTS, []), cfg.engine_module)
        out = run_trial(job, results_dir / "draft-trace", timeout_s=cfg.trial_timeout_s, env={**env, **UNTIMED_ENV})
        study.set_user_attr(attrs.DRAFT_TRACE, {"argmax": out.raw["traces"], "wall_s": round(out.wall_s, 1),
                                                    "rank_mismatches": out.raw.get("rank_mismatches")}
                            if out.raw is not None else {"failure": out.failure, "wall_s": round(out.wall_s, 1)})
    return out.failure


def _kept(study: Any, key: str) -> bool:
    """Whether the study holds ``key`` now: read again after waiting for a trace's lock, since the
    thread that held it may have kept the trace meanwhile (the step's view predates that)."""
    from autotune.study.view import StudyView

    return key in StudyView.of(study).user_attrs


def ranked(view: StudyView, space: Any, max_model_len: int | None) -> list[dict[str, Any]]:
    """Every point of the space, forecast by the study's calibrated model, best first, each with what
    it measured (if it was measured): `autotune predict`."""
    got = study_model(view, space, max_model_len)
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
    from autotune.run import hardware
    from autotune.core.errors import BadInput
    from autotune.core.space import load_space, reload_space
    from autotune.study.storage import load_saved
    from autotune.study.view import StudyView

    name = study or results.name
    if storage is None:
        db = results / "study.db"
        if not db.is_file():
            raise BadInput(f"{db}: no such study storage (expected a results folder from `autotune search`, "
                           "or pass --storage)")
        storage = f"sqlite:///{db.resolve()}"
    view = StudyView.of(load_saved(name, storage))
    resolved = view.user_attrs.get(attrs.SPACE_RESOLVED)
    if space is not None:
        platform = hardware.detect()
        sp = load_space(space, platform=platform, models=set((resolved or {}).get("models", ["draft_model"])),
                        tags=hardware.platform_tags(platform))
    elif resolved:
        sp = reload_space(resolved)
    else:
        raise BadInput(f"{results}: the study does not record its search space; pass --space")
    rows = ranked(view, sp, view.user_attrs.get(attrs.MAX_MODEL_LEN))
    if not rows:
        raise BadInput(f"{results}: study {name!r} has no completed baseline yet: nothing to forecast from")
    trace = view.user_attrs.get(attrs.DRAFT_TRACE) or {}
    measured = sum(r["measured"] is not None for r in rows)
    title = (f"{name}: {len(rows)} candidates of space '{sp.name}', forecast from the baseline's tokens"
             + (", the draft's trace" if trace.get("argmax") else "") + f" and {measured} measured")
    return rows, title
