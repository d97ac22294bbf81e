"""The demo target's DFlash block drafter: where it lives and the config it is trained with.

vLLM 0.32 loads it with ``speculative_config={"method": "dflash", "model": <folder>,
"num_speculative_tokens": k}``: ``DFlashDraftModel`` (vLLM's ``DFlashQwen3ForCausalLM``: Qwen3-style
layers with per-head q/k norms), no embedding and no lm_head of its own (vLLM shares the target's),
``dflash_config`` naming the mask token and the target layers whose states it reads. Its computation,
loading and trace live in the forecast floor (``autotune.forecast.dflash_drafter``);
``scripts/train_dflash.py`` trains it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from autotune.demo import MODELS

DRAFTER = MODELS / "dflash"
# The target layers it reads (0-indexed: vLLM feeds fc the residual stream after layers 1, 2 and 4 of
# 4, the EAGLE-3 head's), and the token its mask slots embed: the target's <pad>, which no text uses.
TARGET_LAYERS = (0, 1, 3)
MASK_TOKEN = 3


def drafter_config(target_cfg: dict[str, Any], *, intermediate_size: int, layers: int = 1,
                   target_layers: Sequence[int] = TARGET_LAYERS, block_size: int = 8) -> dict:
    """config.json of the drafter (the layout of z-lab's DFlash drafters, which vLLM loads)."""
    h = target_cfg["hidden_size"]
    keep = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act", "rms_norm_eps",
            "max_position_embeddings", "vocab_size", "bos_token_id", "eos_token_id", "pad_token_id")
    return {"architectures": ["DFlashDraftModel"], "model_type": "qwen3",
            **{k: target_cfg[k] for k in keep if k in target_cfg},
            "rope_theta": (target_cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0),
            "intermediate_size": intermediate_size, "num_hidden_layers": layers, "tie_word_embeddings": False,
            "attention_bias": False, "target_hidden_size": h, "block_size": block_size,
            "dflash_config": {"mask_token_id": MASK_TOKEN, "target_layer_ids": list(target_layers)},
            "dtype": "float32"}
