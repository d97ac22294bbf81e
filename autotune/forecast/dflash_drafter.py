"""A DFlash block drafter in plain torch: what vLLM 0.32 runs for ``method: dflash`` on Model Runner V1
(vllm/v1/spec_decode/dflash.py over vllm/model_executor/models/qwen3_dflash.py).

At a decode step whose last verified position is a (the target has sampled token a + 1), vLLM drafts
k tokens in one pass: queries ``[token a + 1, mask, ..., mask]`` (the mask is ``mask_token_id``'s
embedding) at positions a + 1 .. a + 1 + k, through Qwen3-style layers (per-head ``q_norm``/``k_norm``,
RoPE) whose attention reads, besides the block's own keys (all of them: non-causal unless the config
says ``causal``), keys and values made from the target's hidden states at positions 0..a: ``fc`` over
the auxiliary layers' residual streams, ``hidden_norm``, then each layer's k/v projection, ``k_norm``
and RoPE (``precompute_and_store_context_kv``). The mask slots' logits are the drafts for tokens
a + 2 .. a + 1 + k. Nothing else carries from step to step: a draft is a function of the target's
states up to a and token a + 1, which is what lets ``block_drafts`` replay every step of a request
at once, and what ``scripts/train_dflash.py`` trains (the demo target's drafter).

The embedding and lm_head are the target's (vLLM shares them when the checkpoint has none).
Imports torch; only the training script, the trace and the tests use it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from autotune.forecast.eagle3_head import inv_freq, rms_norm, rope
from autotune.forecast.eagle3_format import rope_parameters


class Layer(nn.Module):
    def __init__(self, h: int, heads: int, kv_heads: int, dim: int, inter: int) -> None:
        super().__init__()
        self.q_proj = nn.Linear(h, heads * dim, bias=False)
        self.k_proj = nn.Linear(h, kv_heads * dim, bias=False)
        self.v_proj = nn.Linear(h, kv_heads * dim, bias=False)
        self.o_proj = nn.Linear(heads * dim, h, bias=False)
        self.q_norm = nn.Parameter(torch.ones(dim))
        self.k_norm = nn.Parameter(torch.ones(dim))
        self.gate_proj = nn.Linear(h, inter, bias=False)
        self.up_proj = nn.Linear(h, inter, bias=False)
        self.down_proj = nn.Linear(inter, h, bias=False)
        self.input_layernorm = nn.Parameter(torch.ones(h))
        self.post_attention_layernorm = nn.Parameter(torch.ones(h))


class DFlashDrafter(nn.Module):
    """DFlash's draft layers over a frozen, shared ``embed`` (and ``lm_head``: None, tied to it)."""

    def __init__(self, cfg: dict[str, Any], embed: torch.Tensor, lm_head: torch.Tensor | None = None) -> None:
        super().__init__()
        h = cfg["hidden_size"]
        self.cfg = cfg
        self.heads, self.kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.dim = cfg.get("head_dim") or h // self.heads
        self.eps = cfg["rms_norm_eps"]
        dflash = cfg.get("dflash_config") or {}
        self.mask_token = int(dflash["mask_token_id"])
        self.causal = bool(dflash.get("causal", False))
        self.target_layers = [int(i) for i in dflash["target_layer_ids"]]
        self.register_buffer("freqs", inv_freq(rope_parameters(cfg), self.dim), persistent=False)
        self.register_buffer("embed", embed.detach().clone(), persistent=False)
        self.register_buffer("lm_head", (embed if lm_head is None else lm_head).detach().clone(), persistent=False)
        self.fc = nn.Linear(len(self.target_layers) * cfg.get("target_hidden_size", h), h, bias=False)
        self.hidden_norm = nn.Parameter(torch.ones(h))
        self.layers = nn.ModuleList(Layer(h, self.heads, self.kv_heads, self.dim, cfg["intermediate_size"])
                                    for _ in range(cfg["num_hidden_layers"]))
        self.norm = nn.Parameter(torch.ones(h))

    @property
    def aux_layers(self) -> list[int]:
        """The target layers whose residual streams feed ``fc`` (vLLM's aux ids: target_layer_ids + 1)."""
        return [i + 1 for i in self.target_layers]

    def _heads(self, x: torch.Tensor, n: int, norm: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """[..., T, n*D] -> per-head RMS-normed, rotated [..., n, T, D]."""
        y = rms_norm(x.unflatten(-1, (n, self.dim)), norm, self.eps).transpose(-2, -3)
        return rope(y, positions, self.freqs)

    def context(self, aux: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer (k, v) [kv_heads, T, D] from the target's aux states [T, n*H] at ``positions``."""
        ctx = rms_norm(self.fc(aux), self.hidden_norm, self.eps)
        out = []
        for layer in self.layers:
            k = self._heads(layer.k_proj(ctx), self.kv_heads, layer.k_norm, positions)
            v = layer.v_proj(ctx).unflatten(-1, (self.kv_heads, self.dim)).transpose(-2, -3)
            out.append((k, v))
        return out

    def blocks(self, kv: list[tuple[torch.Tensor, torch.Tensor]], tokens: torch.Tensor, anchors: torch.Tensor,
               k: int) -> torch.Tensor:
        """The mask slots' logits [A, k, V] of the blocks at ``anchors`` [A] (last verified positions)
        of one sequence, ``tokens`` [T] (token a + 1 starts each block), over its context ``kv``."""
        a = anchors.shape[0]
        q_pos = (anchors[:, None] + 1 + torch.arange(k + 1, device=anchors.device)[None, :]).reshape(-1)  # [A*(k+1)]
        ids = torch.full((a, k + 1), self.mask_token, dtype=torch.long, device=anchors.device)
        ids[:, 0] = tokens[anchors + 1]
        x = F.embedding(ids.reshape(-1), self.embed)
        t = kv[0][0].shape[-2]
        # Each query sees the context up to its block's anchor, and its own block (all of it, or the
        # slots up to its own where causal).
        block = torch.arange(a, device=anchors.device).repeat_interleave(k + 1)
        slot = torch.arange(k + 1, device=anchors.device).repeat(a)
        own = block[:, None] == block[None, :]
        if self.causal:
            own &= slot[None, :] <= slot[:, None]
        mask = torch.cat([torch.arange(t, device=anchors.device)[None, :] <= anchors[block][:, None], own], 1)
        residual = x
        h = rms_norm(x, self.layers[0].input_layernorm, self.eps)
        for i, (layer, (ck, cv)) in enumerate(zip(self.layers, kv)):
            if i:
                h = rms_norm(residual, layer.input_layernorm, self.eps)
            q = self._heads(layer.q_proj(h), self.heads, layer.q_norm, q_pos)
            qk = self._heads(layer.k_proj(h), self.kv_heads, layer.k_norm, q_pos)
            qv = layer.v_proj(h).unflatten(-1, (self.kv_heads, self.dim)).transpose(-2, -3)
            keys, values = torch.cat([ck, qk], -2), torch.cat([cv, qv], -2)
            att = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask,
                                                 enable_gqa=self.heads != self.kv_heads)
            residual = residual + layer.o_proj(att.transpose(-2, -3).flatten(-2))
            y = rms_norm(residual, layer.post_attention_layernorm, self.eps)
            residual = residual + layer.down_proj(F.silu(layer.gate_proj(y)) * layer.up_proj(y))
        out = rms_norm(residual, self.norm, self.eps).view(a, k + 1, -1)[:, 1:]
        return out @ self.lm_head.T

    # -- the format vLLM loads --------------------------------------------------------------------
    def checkpoint(self) -> dict[str, torch.Tensor]:
        out = {"fc.weight": self.fc.weight, "hidden_norm.weight": self.hidden_norm, "norm.weight": self.norm}
        for i, layer in enumerate(self.layers):
            p = f"layers.{i}."
            for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                out[f"{p}self_attn.{name}.weight"] = getattr(layer, name).weight
            out[f"{p}self_attn.q_norm.weight"], out[f"{p}self_attn.k_norm.weight"] = layer.q_norm, layer.k_norm
            for name in ("gate_proj", "up_proj", "down_proj"):
                out[f"{p}mlp.{name}.weight"] = getattr(layer, name).weight
            out[f"{p}input_layernorm.weight"] = layer.input_layernorm
            out[f"{p}post_attention_layernorm.weight"] = layer.post_attention_layernorm
        return out

    def save(self, path: Path) -> None:
        from safetensors.torch import save_file

        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text(json.dumps(self.cfg, indent=2) + "\n")
        state = {k: v.detach().to(torch.float16).contiguous() for k, v in self.checkpoint().items()}
        save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})


def load_drafter(path: Path, embed: torch.Tensor, lm_head: torch.Tensor | None = None) -> DFlashDrafter:
    from safetensors.torch import load_file

    drafter = DFlashDrafter(json.loads((path / "config.json").read_text()), embed.float(),
                            None if lm_head is None else lm_head.float())
    by_name = drafter.checkpoint()
    for k, v in load_file(str(path / "model.safetensors")).items():
        by_name[k].data.copy_(v.to(torch.float32))
    return drafter.eval()


@torch.no_grad()
def block_drafts(drafter: DFlashDrafter, tokens: Sequence[int], aux: torch.Tensor, starts: Sequence[int],
                 k: int) -> list[list[int]]:
    """What vLLM drafts (greedy, ``k`` tokens) after each anchor position a in ``starts``: the drafts
    for tokens a + 2 .. a + 1 + k. ``aux`` [T, n*H]: the target's aux states along ``tokens``."""
    if not starts:
        return []
    x = torch.tensor(list(tokens))
    kv = drafter.context(aux, torch.arange(len(tokens)))
    return drafter.blocks(kv, x, torch.tensor(list(starts)), k).argmax(-1).tolist()


def trace(pairs: Sequence[tuple[Sequence[int], Sequence[int]]], *, ks: Sequence[int], drafter_dir: Path,
          target_dir: Path, threads: int | None = None) -> list[dict[str, Any]]:
    """For each (prompt ids, output ids) pair, the drafter's blocks at every decode step a request could
    be at, for each depth in ``ks`` (``drafts``: k -> entry i is the block once output[:i + 1] is known),
    and, where the output ends in end-of-sequence, the target's greedy tokens past it (``beyond``), as
    autotune.forecast.eagle3_trace.trace gives them for the replay (one block's drafts read like a chain's)."""
    from autotune.core import snapshots
    from autotune.forecast.eagle3_trace import load_target, target_pass

    if threads:
        torch.set_num_threads(threads)
    found, target = snapshots.folder(str(drafter_dir)), snapshots.folder(str(target_dir))
    if found is None or target is None:
        raise ValueError(f"{drafter_dir if found is None else target_dir}: not a local folder or cached hub id")
    drafter_dir = found
    target_model = load_target(target)
    embed = target_model.get_input_embeddings().weight
    head = target_model.get_output_embeddings()
    drafter = load_drafter(drafter_dir, embed, None if head is None or head.weight is embed else head.weight)
    eos = target_model.config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    out = []
    for prompt, output in pairs:
        seq = list(prompt) + list(output)
        beyond: list[int] = []
        if output and output[-1] in eos:
            with torch.no_grad():
                for _ in range(max(ks)):
                    beyond.append(int(target_model(input_ids=torch.tensor([seq + beyond])).logits[0, -1].argmax()))
        drafts: dict[str, list] = {str(k): [] for k in ks}
        if len(output) >= 2:
            aux, _ = target_pass(target_model, torch.tensor([seq]), drafter.aux_layers)
            starts = [len(prompt) + i - 1 for i in range(len(output) - 1)]
            drafts = {str(k): block_drafts(drafter, seq, aux[0], starts, k) for k in ks}
        out.append({"drafts": drafts, "beyond": beyond})
    return out
