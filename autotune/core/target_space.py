"""The search space fitted to the target: a pre-quantized target's own quantization, and a draft's
tensor-parallel size where the target runs tensor parallel.

- A target whose ``config.json`` declares ``quantization_config`` (FP8, AWQ, GPTQ checkpoints) is
  served in that quantization: vLLM reads it from the config. The space's ``quantization`` knob
  would ask for another on top of it (refused by vLLM, or a second lossy change), so it is left out.
- vLLM takes ``draft_tensor_parallel_size`` in the speculative config, 1 or the target's tensor
  parallel size (``SpeculativeConfig._verify_and_get_draft_tp``; unset, the target's). A small draft
  on one GPU skips the all-reduce of every draft step; the space offers both where the target runs
  tensor parallel and the space has a method with a draft model. Untested on a GPU.
"""

from __future__ import annotations

from dataclasses import replace

from autotune.core.candidate import model_configs
from autotune.core.space import Param, SearchSpace

DRAFTED = ("draft_model", "eagle", "eagle3")  # methods whose draft is a model of its own (not mtp: the target's layers)


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
    drafted = tuple(m for m in methods if m in DRAFTED)
    if tensor_parallel > 1 and drafted and not any(p.name == "draft_tensor_parallel_size" for p in params):
        params.append(Param("draft_tensor_parallel_size", choices=(tensor_parallel, 1), when={"method": drafted}))
        notes.append(f"draft_tensor_parallel_size: {tensor_parallel} (the target's) or 1, for {', '.join(drafted)}")
    if not notes:
        return space, []
    return replace(space, params=tuple(params), baseline=baseline), notes
