"""EAGLE-3 heads in the layouts users have, written here at the demo target's shape (hidden 256,
vocabulary 1042, 4 layers) for tests/test_eagle3_heads.py and tests/test_engine_eagle3_formats.py:

- ``eagle3``: EAGLE-3's own layout (``LlamaForCausalLMEagle3``, ``midlayer.*``), the bundled head's;
- ``d2t``: the same layout with a draft vocabulary smaller than the target's, its own ``lm_head``
  over it and ``d2t``/``t2d`` maps, saved as ``pytorch_model.bin`` (yuhuili/EAGLE3-LLaMA3.1-Instruct-8B's);
- ``speculators``: vllm-project/speculators' layout (``speculators_config``,
  ``transformer_layer_config``, ``layers.0.*``, its own ``embed_tokens``, ``lm_head``, ``d2t``, ``t2d``),
  with Llama 3.1's ``llama3`` RoPE scaling in its layer config (RedHatAI/*speculator.eagle3's).

A head is either random (``seed``) or the bundled head's weights (``source``), so that a converted
head drafts what the bundled one drafts wherever its vocabulary holds the bundled head's choice.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from autotune import demo

TARGET_CFG = json.loads((demo.TARGET / "config.json").read_text())
LLAMA31_ROPE = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192, "rope_type": "llama3"}


def layer_config() -> dict:
    from autotune.demo.eagle3 import head_config

    return head_config(TARGET_CFG, intermediate_size=512)


def random_tensors(seed: int, *, std: float = 0.05) -> dict[str, torch.Tensor]:
    """A head's tensors by canonical name, random (norms at 1, as a fresh head has them)."""
    from autotune.forecast.eagle3_head import Eagle3Head

    torch.manual_seed(seed)
    head = Eagle3Head(layer_config(), torch.zeros(TARGET_CFG["vocab_size"], TARGET_CFG["hidden_size"]))
    out = {}
    for name, p in head.checkpoint().items():
        out[name] = torch.ones_like(p) if p.dim() == 1 else torch.randn_like(p) * std
    return out


def bundled_tensors() -> dict[str, torch.Tensor]:
    from autotune.forecast.eagle3_format import read_head
    from autotune.forecast.eagle3_head import read_tensors

    return read_tensors(read_head(demo.EAGLE3))


def target_embed() -> torch.Tensor:
    from safetensors import safe_open

    with safe_open(str(demo.TARGET / "model.safetensors"), "pt") as f:
        return f.get_tensor("model.embed_tokens.weight").float()


def vocab_maps(keep: list[int]) -> dict[str, torch.Tensor]:
    """``d2t`` (draft id -> target id - draft id) and ``t2d`` (target id kept) for a draft vocabulary."""
    keep = sorted(keep)
    t2d = torch.zeros(TARGET_CFG["vocab_size"], dtype=torch.bool)
    t2d[keep] = True
    return {"d2t": torch.tensor([t - i for i, t in enumerate(keep)], dtype=torch.long), "t2d": t2d}


def write(path: Path, layout: str, tensors: dict[str, torch.Tensor], *, keep: list[int] | None = None,
          norm_before_residual: bool | None = None, rope_scaling: dict | None = None) -> Path:
    """A head in ``layout`` from canonical ``tensors``; ``keep``: a draft vocabulary (target ids) for an
    lm_head of its own (rows of the target's tied embedding) with ``d2t``/``t2d``."""
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    cfg = layer_config()
    extra: dict[str, torch.Tensor] = {}
    if keep is not None:
        extra = {"lm_head.weight": target_embed()[sorted(keep)].contiguous(), **vocab_maps(keep)}
        cfg["draft_vocab_size"] = len(keep)
    if rope_scaling is not None:
        cfg.pop("rope_parameters", None)
        cfg.update(rope_theta=10000.0, rope_scaling=rope_scaling, max_position_embeddings=131072)
    half = {k: v.to(torch.float16) for k, v in tensors.items()}
    if layout == "speculators":
        eagle_keys = ("draft_vocab_size", "target_hidden_size", "eagle_aux_hidden_state_layer_ids")
        layer = {k: v for k, v in cfg.items() if k not in eagle_keys and k != "architectures"}
        layer["architectures"] = ["LlamaForCausalLM"]
        doc = {"speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"],
               "transformer_layer_config": layer, **{k: cfg[k] for k in eagle_keys},
               "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                      "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                                      "verifier": {"name_or_path": str(demo.TARGET),
                                                   "architectures": ["LlamaForCausalLM"]}}}
        if norm_before_residual is not None:
            doc["norm_before_residual"] = norm_before_residual
        (path / "config.json").write_text(json.dumps(doc, indent=1))
        from safetensors.torch import save_file

        state = {**half, **extra, "embed_tokens.weight": target_embed().to(torch.float16)}
        save_file({k: v.contiguous() for k, v in state.items()}, str(path / "model.safetensors"))
        return path
    if norm_before_residual is not None:
        cfg["norm_before_residual"] = norm_before_residual
    (path / "config.json").write_text(json.dumps(cfg, indent=1))
    state = {k.replace("layers.0.", "midlayer.", 1): v for k, v in half.items()} | extra
    if layout == "d2t":
        torch.save(state, str(path / "pytorch_model.bin"))
    else:
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in state.items()}, str(path / "model.safetensors"))
    return path


def hub_cache(cache: Path, repo: str, folder: Path) -> None:
    """``folder`` as hub id ``repo``'s snapshot in a Hugging Face cache at ``cache`` (the layout
    huggingface_hub writes: refs/main -> snapshots/<commit>)."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    root = cache / f"models--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / "main").write_text(commit)
    shutil.copytree(folder, root / "snapshots" / commit, dirs_exist_ok=True)
