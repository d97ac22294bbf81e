"""Which speculative method a drafter is, read from its config.json as vLLM 0.32 reads it (no vLLM here).

A drafter the user gives (``--draft-model``, ``--eagle-head``, ``--eagle3-head``) may be a plain draft
model or one of vLLM's model-based methods; the space offers the method its config says:

- the speculators format (``speculators_config``): ``speculators_model_type`` names it, mapped as
  ``SpeculatorsConfig.build_vllm_speculative_config`` maps it (``peagle`` is eagle3 with
  ``parallel_drafting``, ``dflash2`` is dflash; vllm/transformers_utils/configs/speculators/);
- otherwise ``SpeculativeConfig.__post_init__``'s detection for a drafter given as a draft model: its
  name (``eagle-``, ``eagle3``, ``dflash``, ``dspark``), then its architectures (a DFlash/DSpark
  draft's, as the model registry names them) and its ``model_type`` (``medusa``, ``mlp_speculator``,
  MTP layers), else ``draft_model``.

vLLM itself, given a drafter without a method, finds a DFlash drafter by its name only (and reads a
speculators config's method only when the speculator is the served ``--model``), so a DFlash drafter
under another name would be run as a plain draft model: autotune reads the config and always passes
the method it read.

A head trained for EAGLE's parallel drafting carries the token its masked slots read
(``pard_token``/``ptd_token_id``, or ``mask_token_id`` where speculators' ``update_peagle`` puts it;
vLLM's ``_init_parallel_drafting_params``) and a ``mask_hidden`` tensor.
"""

from __future__ import annotations

from typing import Any

# speculators_model_type -> vLLM's method (SUPPORTED_SPECULATORS_TYPES; anything else vLLM refuses)
SPECULATORS = {"eagle3": "eagle3", "peagle": "eagle3", "dflash": "dflash", "dflash2": "dflash", "dspark": "dspark"}
DFLASH_ARCHS = ("DFlashDraftModel", "DFlash2DraftModel", "MuseGlimmerAssistantModel", "DFlashLagunaForCausalLM")
DSPARK_ARCHS = ("Qwen3DSparkModel", "Qwen3OmniDSparkModel", "Gemma4DSparkModel")
PARALLEL_TOKENS = ("pard_token", "ptd_token_id", "mask_token_id")
# methods a drafter's config may name that the spaces do not search (vLLM runs them; autotune has no knob set)
UNSEARCHED = ("medusa", "mlp_speculator", "mtp")
# ... and why, in one line each. vLLM 0.33.0 removed medusa and mlp_speculator (its SpeculativeMethod
# lists neither; such a drafter would be loaded as a plain draft model and fail).
WHY_UNSEARCHED = {
    "medusa": "a Medusa head: autotune searches no medusa method (vLLM 0.32 runs it on Model Runner V1; "
              "vLLM 0.33 removed it)",
    "mlp_speculator": "an MLPSpeculator: autotune searches no mlp_speculator method (vLLM 0.32 runs it on Model "
                      "Runner V1; vLLM 0.33 removed it)",
    "mtp": "a model's own MTP layers: give the target itself (--model), whose MTP layers the gpu space searches",
}


def drafter_method(model: str, configs: list[dict[str, Any]]) -> str:
    """The method vLLM runs ``model`` with when it is given as a drafter; ``configs``: its config.json
    and text_config (autotune.core.candidate.model_configs), empty when unreadable."""
    cfg = configs[0] if configs else {}
    if cfg.get("speculators_config") is not None:
        return SPECULATORS.get(str(cfg.get("speculators_model_type")), "draft_model")
    name = model.lower()
    archs = set(cfg.get("architectures") or [])
    if "eagle-" in name:
        return "eagle"
    if "eagle3" in name or any("Eagle3" in a for a in archs):
        return "eagle3"
    if "dflash" in name or archs & set(DFLASH_ARCHS):
        return "dflash"
    if "dspark" in name or archs & set(DSPARK_ARCHS) or ("DSparkDraftModel" in archs and cfg.get("model_type") == "qwen3"):
        return "dspark"
    if cfg.get("model_type") in ("medusa", "mlp_speculator"):
        return str(cfg["model_type"])
    if str(cfg.get("model_type", "")).endswith("_mtp"):
        return "mtp"
    return "draft_model"


def parallel_drafting(configs: list[dict[str, Any]]) -> bool:
    """Whether an EAGLE head is trained for parallel drafting (P-EAGLE): vLLM then drafts all k tokens
    in one pass where ``parallel_drafting`` is set."""
    cfg = configs[0] if configs else {}
    if cfg.get("speculators_config") is not None:
        return cfg.get("speculators_model_type") == "peagle"
    return any(cfg.get(k) is not None for k in PARALLEL_TOKENS)


def drafters(settings: Any, configs_of: Any) -> dict[str, str]:
    """Method -> the drafter the study has for it, each drafter under the method its config says
    (a head under the method of its flag unless its config says another; where two claim one
    method, the head's flag wins over --draft-model)."""
    out: dict[str, str] = {}
    for attr, given in (("eagle3_head", "eagle3"), ("eagle_head", "eagle"), ("draft_model", "draft_model")):
        model = getattr(settings, attr, None)
        if not model:
            continue
        said = drafter_method(str(model), configs_of(str(model)))
        method = given if said == "draft_model" else said
        out.setdefault(method, str(model))
    return out


def unsearched(settings: Any, configs_of: Any) -> list[str]:
    """One line for each drafter the user gave whose config names a method the spaces do not search
    (``WHY_UNSEARCHED``): it is not tried, and the line says why, rather than the space saying only
    that the method its flag names needs a drafter."""
    out = []
    for attr in ("draft_model", "eagle_head", "eagle3_head"):
        model = getattr(settings, attr, None)
        if model and (said := drafter_method(str(model), configs_of(str(model)))) in WHY_UNSEARCHED:
            out.append(f"--{attr.replace('_', '-')} {model}: not searched: {WHY_UNSEARCHED[said]}")
    return out
