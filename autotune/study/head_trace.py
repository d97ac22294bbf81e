"""The drafters' traces in a live study: the EAGLE-3 head's chained greedy drafts along the baseline's
outputs, as deep as the space searches, kept in the study (``eagle3_trace``) for every eagle3
forecast; and a DFlash drafter's blocks at each depth the space searches (``dflash_trace``, on CPU
only for now: on a GPU dflash is measured without a forecast, said in one line).

Before anything is loaded, autotune.forecast.eagle3_fit checks the head (its layout, read as vLLM
reads it; a hub id from the local Hugging Face cache only) and the target's size against where the
trace runs: on CPU in this process in float32 (the RAM decides); on a GPU as a worker job on the
worker's own device, in the dtype vLLM serves the target in (that device's memory decides; NVML reads
it without initialising CUDA here). Where the check or the trace fails, the failure is kept instead,
one line is said, and eagle3 is measured without a forecast. On a GPU this path is untested.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.core import attrs, snapshots

if TYPE_CHECKING:
    from autotune.study.view import StudyView

_traces: dict[tuple[Any, ...], threading.Lock] = {}  # one lock per baseline: the trace runs once
_lock = threading.Lock()  # guards the dict only


def baseline_key(view: StudyView, base: Any) -> tuple[str, int, str]:
    # The study's name alone is not enough (two studies of one name in one process, e.g. a test
    # suite's, would share a stale table), so the baseline's start time is part of the key.
    return view.name, base.number, str(base.datetime_start)


def traced_models(space: Any, settings: Any) -> tuple[bool, bool]:
    """(the draft model, the EAGLE-3 head): which the space searches and the study has (each drafter
    under the method its config says: a DFlash drafter given as --draft-model is no draft model)."""
    methods = next((p.choices for p in space.params if p.name == "method"), ())
    have = settings.drafters()
    return "draft_model" in methods and "draft_model" in have, "eagle3" in methods and "eagle3" in have


def _depths(space: Any, method: str) -> list[int]:
    """The depths the space searches for ``method``."""
    return sorted({int(v) for p in space.params if p.name == "num_speculative_tokens"
                   and method in p.when.get("method", (method,)) for v in p.values()})


def _kept(study: Any, key: str = attrs.EAGLE3_TRACE) -> bool:
    from autotune.study.view import StudyView

    return key in StudyView.of(study).user_attrs


def where(cfg: Any, env: dict[str, str] | None) -> tuple[str, int | None]:
    """(device, its memory in bytes): ``cuda`` and one GPU of the worker's devices where vLLM runs on
    CUDA, else ``cpu`` (the RAM is read by the fit check itself)."""
    from autotune.run import hardware

    if hardware.detect() != "cuda":
        return "cpu", None
    from autotune.run import gpu_memory

    try:
        return "cuda", gpu_memory.read(gpu_memory.visible(env), count=1)[0].total
    except Exception:  # noqa: BLE001 - NVML unreadable: the size check says "unknown"
        return "cuda", None


def trace_eagle3(study: Any, view: StudyView, space: Any, cfg: Any, base: Any,
                 env: dict[str, str] | None = None) -> str | None:
    """Trace the head over the baseline's outputs (once per baseline) and keep it; the line to say
    when the trace was skipped or failed (to the caller that ran it), else None."""
    from autotune.forecast import eagle3_fit

    with _lock:
        mine = _traces.setdefault((*baseline_key(view, base), "eagle3"), threading.Lock())
    with mine:
        if _kept(study):
            return None
        depth = max((int(v) for p in space.params if p.name == "num_speculative_tokens" for v in p.values()),
                    default=1)
        outputs = [o for o in base.user_attrs.get(attrs.OUTPUTS, []) if o.get("prompt_token_ids") and o.get("token_ids")]
        pairs = [(o["prompt_token_ids"], o["token_ids"]) for o in outputs]
        head, model = cfg.settings.drafters()["eagle3"], str(cfg.settings.model)
        t0 = time.monotonic()
        device, memory = where(cfg, env)
        dtype = eagle3_fit.trace_dtype(model, getattr(cfg.settings, "dtype", None)) if device != "cpu" else "float32"
        skip = eagle3_fit.why_not(head, model, device=device, device_bytes=memory, dtype=dtype)
        if skip is not None:
            study.set_user_attr(attrs.EAGLE3_TRACE, {"failure": f"not traced: {skip}", "wall_s": 0.0})
            return f"eagle3 forecast skipped: {skip}; eagle3 is measured without one"
        got: dict[str, Any]
        try:
            if device == "cpu":
                from autotune.forecast.eagle3_trace import trace

                traced = trace(pairs, depth=depth, head_dir=Path(head), target_dir=Path(model), threads=2)
            else:
                traced = _on_device(pairs, depth, head, model, dtype, cfg, env)
            got = {"traces": {o["id"]: t for o, t in zip(outputs, traced)}, "depth": depth, "device": device}
        except Exception as e:  # noqa: BLE001 - any failure means: measured, not forecast
            got = {"failure": f"{type(e).__name__}: {e}"}
        study.set_user_attr(attrs.EAGLE3_TRACE, {**got, "wall_s": round(time.monotonic() - t0, 1)})
        if "failure" in got:
            return f"eagle3 trace failed: {got['failure']}; eagle3 is measured without a forecast"
        return None


def _on_device(pairs: list, depth: int, head: str, model: str, dtype: str, cfg: Any,
               env: dict[str, str] | None) -> list[dict[str, list]]:
    """The trace as a worker job on the worker's GPU (autotune.forecast.eagle3_trace.run_job)."""
    from autotune.forecast.eagle3_trace import job
    from autotune.run.gpu_memory import engine_devices
    from autotune.run.worker import run_trial

    asks = {"utilization": cfg.settings.gpu_memory_utilization,
            "devices": engine_devices(dict(cfg.settings.serve_flags or {}))}
    # the worker gets folders: it knows nothing of where this process fetched a hub id (--download-dir)
    head, model = (str(snapshots.folder(x) or x) for x in (head, model))
    out = run_trial(job(pairs, depth=depth, head=head, target=model, device="cuda", dtype=dtype, gpu_memory=asks),
                    Path(cfg.results_dir) / "eagle3-trace", timeout_s=cfg.trial_timeout_s, env=dict(env or {}))
    if out.raw is None:
        raise RuntimeError(f"{out.failure} (worker log: {out.log_path})")
    return out.raw["traces"]


def trace_dflash(study: Any, view: StudyView, space: Any, cfg: Any, base: Any,
                 env: dict[str, str] | None = None) -> str | None:
    """Trace the DFlash drafter over the baseline's outputs at each depth the space searches (once
    per baseline; CPU only) and keep it; the line to say when skipped or failed, else None."""
    from autotune.forecast import eagle3_fit

    with _lock:
        mine = _traces.setdefault((*baseline_key(view, base), "dflash"), threading.Lock())
    with mine:
        if _kept(study, attrs.DFLASH_TRACE):
            return None
        depths = _depths(space, "dflash")
        outputs = [o for o in base.user_attrs.get(attrs.OUTPUTS, []) if o.get("prompt_token_ids") and o.get("token_ids")]
        drafter, model = cfg.settings.drafters()["dflash"], str(cfg.settings.model)
        t0 = time.monotonic()
        skip = ("the DFlash trace runs on CPU only (yet)" if where(cfg, env)[0] != "cpu"
                else eagle3_fit.dflash_why_not(drafter, model))
        if skip is not None:
            study.set_user_attr(attrs.DFLASH_TRACE, {"failure": f"not traced: {skip}", "wall_s": 0.0})
            return f"dflash forecast skipped: {skip}; dflash is measured without one"
        got: dict[str, Any]
        try:
            from autotune.forecast.dflash_drafter import trace

            traced = trace([(o["prompt_token_ids"], o["token_ids"]) for o in outputs], ks=depths,
                           drafter_dir=Path(drafter), target_dir=Path(model), threads=2)
            got = {"traces": {o["id"]: t for o, t in zip(outputs, traced)}, "depths": depths}
        except Exception as e:  # noqa: BLE001 - any failure means: measured, not forecast
            got = {"failure": f"{type(e).__name__}: {e}"}
        study.set_user_attr(attrs.DFLASH_TRACE, {**got, "wall_s": round(time.monotonic() - t0, 1)})
        return f"dflash trace failed: {got['failure']}; dflash is measured without a forecast" if "failure" in got \
            else None


def ensure_eagle3_trace(study: Any, view: StudyView, space: Any, cfg: Any, params: dict[str, Any] | None = None,
                        *, env: dict[str, str] | None = None) -> str | None:
    """The drafters' traces once a baseline exists (``trace_eagle3``, ``trace_dflash``), before planning
    (``params`` None) and before any eagle3 or dflash trial, whatever put it in line (--try, a grid, a
    plan); the lines to say, if any (one a drafter)."""
    base = view.baseline
    if base is None:
        return None
    methods = next((p.choices for p in space.params if p.name == "method"), ())
    have = cfg.settings.drafters()
    lines = []
    for method, key, run in (("eagle3", attrs.EAGLE3_TRACE, trace_eagle3), ("dflash", attrs.DFLASH_TRACE, trace_dflash)):
        if (params is None or params.get("method") == method) and key not in view.user_attrs \
                and method in methods and method in have:
            lines.append(run(study, view, space, cfg, base, env))
    return "\n".join(x for x in lines if x) or None
