"""An EAGLE-3 head as vLLM 0.32 reads it, from its files' headers (nothing loaded): which layer it is,
which tensors it carries, and where its drafts' tokens come from.

Two layouts reach vLLM's ``Eagle3LlamaForCausalLM`` (vllm/model_executor/models/llama_eagle3.py):

- EAGLE-3's own (``LlamaForCausalLMEagle3``, yuhuili/EAGLE3-*): the layer config at the top of
  config.json, tensors ``midlayer.*``, ``fc``, ``norm``;
- the speculators format (vllm-project/speculators, RedHatAI/*speculator.eagle3): config.json holds
  ``speculators_config`` and ``transformer_layer_config``; vLLM builds the layer config from the
  latter plus the algorithm's fields (vllm/transformers_utils/configs/speculators/algos.py
  ``update_eagle3``: ``norm_before_residual`` defaults to True there; ``update_peagle``, a head trained
  for parallel drafting, which vLLM chains like any other unless ``parallel_drafting`` is set), tensors
  ``layers.0.*``.

Either may carry its own ``lm_head`` over a draft vocabulary (``draft_vocab_size``) smaller than the
target's, with ``d2t`` (draft id -> offset to the target id: vLLM's ``draft_id_to_target_id``;
``t2d`` is skipped), and its own ``embed_tokens``; without them vLLM shares the target's
(``_maybe_share_lm_head``/``_maybe_share_embeddings``). RoPE is the head's own config's
(``rope_parameters``, or the legacy ``rope_theta`` + ``rope_scaling`` vLLM folds into it): Llama 3.1
heads carry the target's ``llama3`` scaling there. A hub id is read where autotune fetched it, else from
the local Hugging Face cache only (autotune.core.snapshots): never a download the engine would not make.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROPE_TYPES = ("default", "llama3")  # what the trace computes (vLLM's RotaryEmbedding, Llama3RotaryEmbedding)
_LAYER_KEYS = ("hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size", "rms_norm_eps",
               "vocab_size")
BIN = "pytorch_model.bin"  # EAGLE-3's published heads (yuhuili/*) ship this, not safetensors


def safetensors_header(path: Path) -> dict[str, dict]:
    """The tensors a .safetensors file declares (name -> dtype, shape, offsets), read from its header only."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > 100_000_000:
            raise ValueError(f"{path}: not a safetensors file (header of {n} bytes)")
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return header


def param_count(folder: Path) -> int:
    """Parameters of a checkpoint folder's safetensors files, from their headers."""
    total = 0
    for f in sorted(folder.glob("*.safetensors")):
        for t in safetensors_header(f).values():
            n = 1
            for d in t.get("shape", []):
                n *= int(d)
            total += n
    return total


def canonical(name: str) -> str:
    """A head tensor's name as vLLM's loader maps it (``midlayer.`` is ``layers.0.``)."""
    return name.replace("midlayer.", "layers.0.", 1) if name.startswith("midlayer.") else name


@dataclass(frozen=True)
class HeadFormat:
    """What the trace needs to know of a head before loading it."""

    folder: Path
    layout: str  # "eagle3" (EAGLE-3's own) or "speculators"
    cfg: dict[str, Any]  # the layer config vLLM builds the head from
    files: tuple[Path, ...]  # the weight files vLLM would read (safetensors first, else pytorch_model.bin)
    names: frozenset[str] = field(default_factory=frozenset)  # tensor names, canonical (empty for a .bin)
    aux_layers: tuple[int, ...] | None = None  # None: vLLM's default for the target (2, n // 2, n - 3)
    norm_before_residual: bool = False
    norm_before_fc: bool = False
    fc_norm: bool = False
    norm_output: bool = False

    @property
    def draft_vocab(self) -> int:
        return int(self.cfg.get("draft_vocab_size") or self.cfg["vocab_size"])

    @property
    def rope(self) -> dict[str, Any]:
        return rope_parameters(self.cfg)

    def owns(self, tensor: str) -> bool:
        """Whether the checkpoint carries ``tensor`` (``lm_head``, ``embed_tokens``, ``d2t``); a .bin's
        names are known only once loaded, so False there (the loader reads them then)."""
        return any(n.split(".")[0] == tensor for n in self.names)


def rope_parameters(cfg: dict[str, Any]) -> dict[str, Any]:
    """A layer config's RoPE parameters as vLLM standardises them (``patch_rope_parameters``:
    ``rope_parameters``, else the legacy ``rope_scaling`` with ``rope_theta`` folded in)."""
    got = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    got["rope_type"] = got.get("rope_type") or got.get("type") or "default"
    got.setdefault("rope_theta", cfg.get("rope_theta", 10000.0))
    return got


def _flag(cfg: dict[str, Any], name: str, default: bool) -> bool:
    eagle = cfg.get("eagle_config") or {}
    return bool(eagle.get(name, cfg.get(name, default)))


def read_head(folder: Path) -> HeadFormat | str:
    """The head in ``folder`` as vLLM reads it, or why the trace cannot follow it (one line)."""
    try:
        raw = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as e:
        return f"no readable config.json ({type(e).__name__})"
    if raw.get("speculators_config") is not None:
        kind = raw.get("speculators_model_type")
        if kind not in ("eagle3", "peagle"):  # peagle: a P-EAGLE head, which vLLM chains unless parallel_drafting
            return f"a speculators-format {kind!r} drafter; the trace follows EAGLE-3 heads only"
        layer = dict(raw.get("transformer_layer_config") or {})
        if layer.get("model_type", "llama") != "llama":
            return f"a speculators head over a {layer.get('model_type')!r} layer; the trace runs Llama layers only"
        cfg = {**layer, "draft_vocab_size": raw.get("draft_vocab_size"),
               "target_hidden_size": raw.get("target_hidden_size") or layer.get("hidden_size"),
               "eagle_aux_hidden_state_layer_ids": raw.get("eagle_aux_hidden_state_layer_ids")}
        flags = {"norm_before_residual": bool(raw.get("norm_before_residual", kind == "eagle3")),
                 "norm_before_fc": bool(raw.get("norm_before_fc", False)), "fc_norm": bool(raw.get("fc_norm", False)),
                 "norm_output": bool(raw.get("norm_output", False))}
        layout = "speculators"
    else:
        arch = (raw.get("architectures") or [""])[0]
        if "Eagle3" not in arch or raw.get("model_type", "llama") != "llama":
            return f"architecture {arch or '(none)'} ({raw.get('model_type')}); the trace runs Llama EAGLE-3 heads only"
        cfg, layout = raw, "eagle3"
        flags = {k: _flag(raw, k, False) for k in ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")}
    lacking = [k for k in _LAYER_KEYS if cfg.get(k) is None]
    if lacking:
        return f"its layer config has no {', '.join(lacking)}"
    if not _flag(cfg, "use_aux_hidden_state", True):
        return "use_aux_hidden_state is off (the head reads the target's last state, not fused layers)"
    if int(cfg.get("num_hidden_layers", 1)) != 1:
        return f"{cfg.get('num_hidden_layers')} decoder layers; the trace runs one-layer heads (EAGLE-3's)"
    if cfg.get("attention_bias") or cfg.get("mlp_bias"):
        return "attention or MLP biases, which the trace does not compute"
    fmt = HeadFormat(folder, layout, cfg, (), **flags)
    rope = fmt.rope
    if rope["rope_type"] not in ROPE_TYPES or rope.get("partial_rotary_factor", 1.0) != 1.0:
        return f"RoPE {rope['rope_type']!r}; the trace computes {' and '.join(ROPE_TYPES)}"
    files = tuple(sorted(folder.glob("*.safetensors")))
    names: set[str] = set()
    try:
        for f in files:
            names |= {canonical(n) for n in safetensors_header(f)}
    except (OSError, ValueError, struct.error) as e:
        return f"safetensors unreadable ({type(e).__name__}: {e})"
    if not files:
        if not (folder / BIN).is_file():
            return "no *.safetensors or pytorch_model.bin"
        files = (folder / BIN,)
    layers = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") \
        or cfg.get("eagle_aux_hidden_state_layer_ids")
    return HeadFormat(folder, layout, cfg, files, frozenset(names), tuple(layers) if layers else None, **flags)


def aux_layers(fmt: HeadFormat, target_layers: int) -> tuple[int, ...]:
    """The target layers whose residual streams feed fc: the head's, else vLLM's default
    (``SupportsEagle3.get_eagle3_default_aux_hidden_state_layers``)."""
    return fmt.aux_layers or (2, target_layers // 2, target_layers - 3)


def file_bytes(fmt: HeadFormat) -> int:
    return sum(f.stat().st_size for f in fmt.files)
