"""The search space fitted to the target: a pre-quantized target's own quantization, and a draft's
tensor-parallel size where the target runs tensor parallel.

- A target whose ``config.json`` declares ``quantization_config`` (FP8, AWQ, GPTQ checkpoints) is
  served in that quantization: vLLM reads it from the config. The space's ``quantization`` knob
  would ask for another on top of it (refused by vLLM, or a second lossy change), so it is left out.
- ``draft_tensor_parallel_size``: vLLM 0.32's config takes 1 or the target's tensor parallel size
  (``SpeculativeConfig._verify_and_get_draft_tp``), but no runner honours 1 under tensor parallel:
  V1's draft proposer refuses a draft TP other than the target's (``DraftModelProposer.
  _raise_if_draft_tp_mismatch``), V2's draft speculator builds the draft's layers on the target's
  tensor-parallel group whatever its config says (``StandaloneARSpeculator.load_draft_model``; the
  layers read ``get_tensor_model_parallel_world_size``), and EAGLE's drafters never read it. So it is
  not offered (``HONOURED`` is empty for this vLLM), and a space that names it keeps only the
  target's own size (tests/test_target_space.py holds this to vLLM's code).
"""

from __future__ import annotations

from dataclasses import replace

from autotune.core.candidate import model_configs, mtp_layers
from autotune.core.space import Param, SearchSpace

DRAFTED = ("draft_model", "eagle", "eagle3")  # methods whose draft is a model of its own (not mtp: the target's layers)
# The methods whose draft vLLM 0.32 runs on fewer GPUs than the target when asked: none (see above).
HONOURED: tuple[str, ...] = ()


def declared_quantization(model: str) -> str | None:
    """The quantization the model's config declares (its ``quant_method``), or None."""
    for c in model_configs(model):
        q = c.get("quantization_config")
        if isinstance(q, dict):
            return str(q.get("quant_method") or "declared")
    return None


def fit_to_target(space: SearchSpace, model: str, *, tensor_parallel: int = 1) -> tuple[SearchSpace, list[str]]:
    """``space`` without what the target rules out and with what its tensor parallel size offers,
    and one line for each change."""
    notes: list[str] = []
    params = list(space.params)
    baseline = dict(space.baseline)
    q = declared_quantization(model)
    if q is not None and any(p.name == "quantization" for p in params):
        params = [p for p in params if p.name != "quantization"]
        baseline.pop("quantization", None)
        notes.append(f"quantization: not searched: {model} is already quantized ({q}, its config's "
                     "quantization_config), and vLLM serves it so")
    methods = next((p.choices or () for p in params if p.name == "method"), ())
    params, mtp_note = _mtp_depths(params, model, methods)
    notes += mtp_note
    honoured = tuple(m for m in methods if m in HONOURED)
    if tensor_parallel > 1 and honoured and not any(p.name == "draft_tensor_parallel_size" for p in params):
        params.append(Param("draft_tensor_parallel_size", choices=(tensor_parallel, 1), when={"method": honoured}))
        notes.append(f"draft_tensor_parallel_size: {tensor_parallel} (the target's) or 1, for {', '.join(honoured)}")
    dtp = next((p for p in params if p.name == "draft_tensor_parallel_size"), None)
    if dtp is not None and not honoured and set(dtp.values()) != {tensor_parallel}:
        params = [p for p in params if p.name != "draft_tensor_parallel_size"]
        baseline.pop("draft_tensor_parallel_size", None)
        notes.append(f"draft_tensor_parallel_size: not searched: vLLM 0.32 runs every draft on the target's "
                     f"{tensor_parallel} GPU(s) whatever it is set to (V1 refuses another size, V2 and EAGLE ignore it)")
    if not notes:
        return space, []
    return replace(space, params=tuple(params), baseline=baseline), notes


def _mtp_depths(params: list[Param], model: str, methods: tuple) -> tuple[list[Param], list[str]]:
    """MTP's depths from the model's MTP layers (vLLM's ``n_predict``): vLLM refuses a depth above
    n_predict that is no multiple of it (``SpeculativeConfig.__post_init__``: "must be divisible by
    n_predict"). With one layer every depth runs (the layer is reused); with n > 1 layers MTP searches
    1..n, each draft token from a layer of its own, as the model was trained. The depth knob is split
    in two of one name, each active for its own methods (Optuna takes an int range of another span
    under one name; only its log scale must agree)."""
    n = mtp_layers(model) if "mtp" in methods else None
    k = next((p for p in params if p.name == "num_speculative_tokens" and p.int_range is not None
              and "mtp" in p.when.get("method", ())), None)
    if n is None or n < 2 or k is None or k.int_range[1] <= n:
        return params, []
    lo, hi = k.int_range
    others = tuple(m for m in k.when["method"] if m != "mtp")
    mtp = replace(k, int_range=(min(lo, n), n), step=None, when={**k.when, "method": ("mtp",)})
    out: list[Param] = []
    for p in params:
        if p is k:
            out += ([replace(k, when={**k.when, "method": others})] if others else []) + [mtp]
        else:
            out.append(p)
    return out, [f"num_speculative_tokens: mtp searches {min(lo, n)}..{n}, the model's {n} MTP layers (vLLM takes a "
                 f"deeper k only as a multiple of {n}, reusing them)"]
