"""The demo target's EAGLE-3 head: where it lives and the config it is trained with.

The head's computation (the layer vLLM 0.32 runs for ``method: eagle3``), its loading and the
trace of its drafts serve every user's head, so they live in the forecast floor
(``autotune.forecast.eagle3_trace``); ``scripts/train_eagle3.py`` trains the bundled head with them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from autotune.demo import MODELS

HEAD = MODELS / "eagle3"
# The residual stream after target layers 1, 2 and 4 (of 4): two early layers (what the tokens are)
# and the last (what comes next), as EAGLE-3 fuses low, middle and high features. vLLM's default for
# a 4-layer Llama would be (2, 2, 1), i.e. layers 1 and 2 only; the config says these instead.
AUX_LAYERS = (1, 2, 4)


def head_config(target_cfg: dict[str, Any], *, intermediate_size: int, aux_layers: Sequence[int] = AUX_LAYERS) -> dict:
    """config.json of the head: vLLM reads ``architectures`` (LlamaForCausalLMEagle3 ->
    Eagle3LlamaForCausalLM), the layer shape, ``draft_vocab_size`` (the target's: no d2t/t2d maps)
    and ``eagle_aux_hidden_state_layer_ids`` (which target layers feed fc)."""
    h = target_cfg["hidden_size"]
    keep = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act", "rms_norm_eps",
            "max_position_embeddings", "vocab_size", "rope_parameters", "bos_token_id", "eos_token_id",
            "pad_token_id", "attention_bias", "mlp_bias")
    return {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
            **{k: target_cfg[k] for k in keep if k in target_cfg},
            "intermediate_size": intermediate_size, "num_hidden_layers": 1, "tie_word_embeddings": False,
            "draft_vocab_size": target_cfg["vocab_size"], "target_hidden_size": h,
            "eagle_aux_hidden_state_layer_ids": list(aux_layers), "dtype": "float32"}
