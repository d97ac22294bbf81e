"""The EAGLE-3 head's trace in a live study: its chained greedy drafts along the baseline's outputs,
as deep as the space searches, kept in the study (``eagle3_trace``) for every eagle3 forecast.

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

from autotune.core import attrs

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


def _kept(study: Any) -> bool:
    from autotune.study.view import StudyView

    return attrs.EAGLE3_TRACE in StudyView.of(study).user_attrs


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
    from autotune.run.worker import run_trial

    out = run_trial(job(pairs, depth=depth, head=head, target=model, device="cuda", dtype=dtype),
                    Path(cfg.results_dir) / "eagle3-trace", timeout_s=cfg.trial_timeout_s, env=dict(env or {}))
    if out.raw is None:
        raise RuntimeError(f"{out.failure} (worker log: {out.log_path})")
    return out.raw["traces"]


def ensure_eagle3_trace(study: Any, view: StudyView, space: Any, cfg: Any, params: dict[str, Any] | None = None,
                        *, env: dict[str, str] | None = None) -> str | None:
    """The head's trace once a baseline exists (``trace_eagle3``), before planning (``params`` None)
    and before any eagle3 trial, whatever put it in line (--try, a grid, a plan); the line to say, if any."""
    if (params is not None and params.get("method") != "eagle3") or attrs.EAGLE3_TRACE in view.user_attrs \
            or not traced_models(space, cfg.settings)[1]:
        return None
    base = view.baseline
    return None if base is None else trace_eagle3(study, view, space, cfg, base, env)
