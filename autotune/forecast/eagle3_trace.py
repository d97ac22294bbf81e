"""An EAGLE-3 head in plain torch: the layer vLLM 0.32 runs for ``method: eagle3``.

vLLM's ``Eagle3LlamaForCausalLM`` (vllm/model_executor/models/llama_eagle3.py) is one decoder layer
whose attention reads ``[input_layernorm(embed(token)), hidden_norm(h)]`` (2 x hidden wide), with
the residual taken from ``h`` before its norm, and a final norm. ``h`` is, on the first pass of a
step, ``fc`` over the target's auxiliary hidden states (the residual stream after the layers
``eagle_aux_hidden_state_layer_ids`` names, concatenated), and on every further draft position the
head's own pre-norm output one position back. Its embedding and lm_head are the target's: the
checkpoint carries neither, and vLLM shares the target's (``_maybe_share_embeddings``,
``_maybe_share_lm_head``). The draft at position p reads token p + 1 and the target's state at p,
so it predicts token p + 2.

This module mirrors that computation, so the same code trains the head
(``scripts/train_eagle3.py``) and replays what vLLM drafts along a baseline's tokens
(``trace``: the forecast's input, ``autotune.forecast.predict.eagle3_acceptance``).
Imports torch and transformers; only the training script, the trace and the tests use it. Only a
head and target that ``autotune.forecast.eagle3_fit`` accepts are ever loaded here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from autotune.demo import TARGET
from autotune.demo.eagle3 import HEAD


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    var = x.pow(2).mean(-1, keepdim=True)
    return x * torch.rsqrt(var + eps) * w


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Neox-style rotary embedding (vLLM's and transformers' Llama): x [..., T, D], positions [T]."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    ang = positions.to(torch.float32)[:, None] * inv[None, :]
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)
    half = d // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rot * sin


class Eagle3Head(nn.Module):
    """One EAGLE-3 decoder layer with fc and norms; ``embed`` is the target's (frozen, shared)."""

    def __init__(self, cfg: dict[str, Any], embed: torch.Tensor) -> None:
        super().__init__()
        h, inter = cfg["hidden_size"], cfg["intermediate_size"]
        self.cfg = cfg
        self.heads, self.kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.head_dim = cfg.get("head_dim") or h // self.heads
        self.eps, self.theta = cfg["rms_norm_eps"], cfg.get("rope_parameters", {}).get("rope_theta", 10000.0)
        n_aux = len(cfg["eagle_aux_hidden_state_layer_ids"])
        self.register_buffer("embed", embed.detach().clone(), persistent=False)
        self.fc = nn.Linear(n_aux * cfg.get("target_hidden_size", h), h, bias=False)
        self.q_proj = nn.Linear(2 * h, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * h, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * h, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, h, bias=False)
        self.gate_proj = nn.Linear(h, inter, bias=False)
        self.up_proj = nn.Linear(h, inter, bias=False)
        self.down_proj = nn.Linear(inter, h, bias=False)
        self.input_layernorm = nn.Parameter(torch.ones(h))
        self.hidden_norm = nn.Parameter(torch.ones(h))
        self.post_attention_layernorm = nn.Parameter(torch.ones(h))
        self.norm = nn.Parameter(torch.ones(h))

    # -- pieces -------------------------------------------------------------------------------
    def qkv(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor):
        """The layer's first half for tokens [B, T] and hidden [B, T, H] at positions [T]:
        (q, k, v) [B, heads, T, D], and the residual (hidden itself: norm after residual)."""
        b, t = tokens.shape
        e = rms_norm(F.embedding(tokens, self.embed), self.input_layernorm, self.eps)
        x = torch.cat([e, rms_norm(hidden, self.hidden_norm, self.eps)], -1)
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        return rope(q, positions, self.theta), rope(k, positions, self.theta), v

    def finish(self, attn: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """attn [B, heads, T, D] -> (normed output for the logits, pre-norm output for the next draft)."""
        b, _, t, _ = attn.shape
        a = self.o_proj(attn.transpose(1, 2).reshape(b, t, -1))
        residual = a + residual
        x = rms_norm(residual, self.post_attention_layernorm, self.eps)
        x = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        pre = x + residual
        return rms_norm(pre, self.norm, self.eps), pre

    def logits(self, normed: torch.Tensor) -> torch.Tensor:
        return normed @ self.embed.T

    def combine(self, aux: torch.Tensor) -> torch.Tensor:
        return self.fc(aux)

    # -- training: test-time-training unroll over whole sequences --------------------------------
    def unroll(self, tokens: torch.Tensor, aux: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """Logits of draft steps 1..steps at every position, as vLLM drafts them.

        ``tokens`` [B, T] (the sequence x), ``aux`` [B, T, n*H] (the target's aux states at each
        position). Step 1 at position q reads (x[q+1], fc(aux[q])) and attends to step-1 entries at
        0..q. Step j at q is the j-th draft of a chain anchored at a = q - j + 1: it reads the step
        j-1 output at q - 1 (its own hidden, chained), the true token x[q+1] (what an accepted
        draft is), and attends to step-1 entries at 0..a and step-i entries at a + i - 1 (i = 2..j).
        Returns ``steps`` tensors [B, T-1, V]: entry q predicts x[q + 2] (the last is unused).
        """
        b, t = tokens.shape
        nxt = torch.cat([tokens[:, 1:], tokens[:, -1:]], 1)  # x[q+1] at q (the last is padding)
        pos = torch.arange(t)
        hidden = self.combine(aux)
        keys, values, out = [], [], []
        for j in range(1, steps + 1):
            q, k, v = self.qkv(nxt, hidden, pos)
            keys.append(k)
            values.append(v)
            # Mask [T, j*T]: block 1 (step-1 keys) at key position <= q - j + 1; block i (>= 2) at
            # key position == q - j + i exactly.
            qi = pos[:, None]
            ki = pos[None, :]
            blocks = [ki <= qi - j + 1] + [ki == qi - j + i for i in range(2, j + 1)]
            mask = torch.cat(blocks, 1)
            mask[:, 0] |= ~mask.any(1)  # rows with no key (q < j - 1) attend to position 0: unused
            att = F.scaled_dot_product_attention(q, torch.cat(keys, 2), torch.cat(values, 2), attn_mask=mask)
            normed, pre = self.finish(att, hidden)
            out.append(self.logits(normed[:, :-1]))
            # The next step's hidden at q is this step's output at q - 1.
            hidden = torch.cat([pre[:, :1], pre[:, :-1]], 1)
        return out

    # -- the format vLLM loads --------------------------------------------------------------------
    def checkpoint(self) -> dict[str, torch.Tensor]:
        m = "midlayer."
        return {
            "fc.weight": self.fc.weight, f"{m}self_attn.q_proj.weight": self.q_proj.weight,
            f"{m}self_attn.k_proj.weight": self.k_proj.weight, f"{m}self_attn.v_proj.weight": self.v_proj.weight,
            f"{m}self_attn.o_proj.weight": self.o_proj.weight, f"{m}mlp.gate_proj.weight": self.gate_proj.weight,
            f"{m}mlp.up_proj.weight": self.up_proj.weight, f"{m}mlp.down_proj.weight": self.down_proj.weight,
            f"{m}input_layernorm.weight": self.input_layernorm, f"{m}hidden_norm.weight": self.hidden_norm,
            f"{m}post_attention_layernorm.weight": self.post_attention_layernorm, "norm.weight": self.norm,
        }

    def save(self, path: Path) -> None:
        from safetensors.torch import save_file

        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text(json.dumps(self.cfg, indent=2) + "\n")
        state = {k: v.detach().to(torch.float16).contiguous() for k, v in self.checkpoint().items()}
        save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})


def load_target(target: Path = TARGET) -> Any:
    from transformers import LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    # transformers draws a "Loading weights" bar, which a study's output printed after its report
    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model = LlamaForCausalLM.from_pretrained(target, dtype=torch.float32)
    finally:
        if shown:
            hf_logging.enable_progress_bar()
    model.eval()
    return model


def load_head(path: Path = HEAD, target_model: Any = None) -> Eagle3Head:
    from safetensors.torch import load_file

    cfg = json.loads((path / "config.json").read_text())
    target_model = target_model if target_model is not None else load_target()
    head = Eagle3Head(cfg, target_model.get_input_embeddings().weight)
    by_name = dict(head.checkpoint())
    for k, v in load_file(str(path / "model.safetensors")).items():
        by_name[k].data.copy_(v.to(torch.float32))
    head.eval()
    return head


@torch.no_grad()
def target_pass(target_model: Any, tokens: torch.Tensor, aux_layers: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher-forced target over tokens [B, T]: (aux [B, T, n*H], the residual stream after each
    layer in ``aux_layers`` as vLLM's ``_maybe_add_hidden_state`` takes it; logits [B, T, V])."""
    got: dict[int, torch.Tensor] = {}
    hooks = []
    for i, layer in enumerate(target_model.model.layers):
        if i + 1 in aux_layers:
            hooks.append(layer.register_forward_hook(
                lambda _m, _inp, out, n=i + 1: got.__setitem__(n, out[0] if isinstance(out, tuple) else out)))
    try:
        logits = target_model(input_ids=tokens).logits
    finally:
        for hk in hooks:
            hk.remove()
    return torch.cat([got[n] for n in sorted(set(aux_layers))], -1), logits


@torch.no_grad()
def chained_drafts(head: Eagle3Head, tokens: Sequence[int], aux: torch.Tensor, starts: Sequence[int],
                   depth: int, *, logits: list | None = None) -> list[list[int]]:
    """What vLLM drafts (greedy, ``depth`` tokens) after each anchor position a in ``starts``.

    ``tokens``: the whole sequence (prompt + output); ``aux`` [T, n*H]: the target's aux states.
    At anchor a the target has verified tokens 0..a and sampled token a + 1: the first draft reads
    the step-1 entries at 0..a (token p + 1 with the target's state at p), the next ones chain on
    the head's own output and its previous draft token, attending to step-1 entries at 0..a and the
    chain's own entries. Returns, per anchor, drafts for tokens a + 2 .. a + 1 + depth (and, into
    ``logits`` where given, each anchor's list of draft logits).

    Every anchor's chain advances at once, one step at a time (the anchors as the sequence axis,
    each query masked to its own keys): the same drafts as one chain after another, 13x faster
    (11,080 draft tokens of the demo's baseline at depth 8: none differed, logits within 2e-5).
    """
    t = len(tokens)
    x = torch.tensor([list(tokens)])
    nxt = torch.cat([x[:, 1:], x[:, -1:]], 1)
    pos = torch.arange(t)
    hidden0 = head.combine(aux[None])
    q, k, v = head.qkv(nxt, hidden0, pos)
    causal = pos[None, :] <= pos[:, None]
    normed, pre = head.finish(F.scaled_dot_product_attention(q, k, v, attn_mask=causal), hidden0)
    first = head.logits(normed[0])
    if not starts:
        return []
    a = torch.tensor(list(starts))
    seen = [first[a]]  # [A, V] per step
    drafts = [seen[0].argmax(-1)]
    # Keys: the step-1 entries (anchor a sees positions 0..a), then one block per chain step in
    # which each anchor sees only its own entry.
    ks, vs, masks = [k], [v], [pos[None, :] <= a[:, None]]
    own = torch.eye(len(a), dtype=torch.bool)
    hidden = pre[:, a]
    for j in range(1, depth):
        qj, kj, vj = head.qkv(drafts[-1][None], hidden, a + j)
        ks.append(kj)
        vs.append(vj)
        masks.append(own)
        att = F.scaled_dot_product_attention(qj, torch.cat(ks, 2), torch.cat(vs, 2), attn_mask=torch.cat(masks, 1))
        normed_j, hidden = head.finish(att, hidden)
        seen.append(head.logits(normed_j[0]))
        drafts.append(seen[-1].argmax(-1))
    if logits is not None:
        logits.extend([step[i] for step in seen] for i in range(len(a)))
    return torch.stack(drafts, 1).tolist()


def trace(pairs: Sequence[tuple[Sequence[int], Sequence[int]]], *, depth: int, head_dir: Path = HEAD,
          target_dir: Path = TARGET, threads: int | None = None) -> list[dict[str, list]]:
    """For each (prompt ids, output ids) pair, what the replay (``autotune.forecast.predict.Eagle3Trace``) needs:

    - ``drafts``: the head's chained greedy drafts of ``depth`` tokens at every decode step a
      request could be at: entry i is what vLLM drafts once output[:i + 1] is known (for
      output[i + 1 ..]), i = 0 .. len(output) - 2;
    - ``beyond``: where the output ends in end-of-sequence, the target's greedy tokens after it
      (``depth`` of them). vLLM verifies a draft past an accepted end-of-sequence token like any
      other and counts it in its acceptance counters before the output is cut at the end.
    """
    if threads:
        torch.set_num_threads(threads)
    target_model = load_target(target_dir)
    head = load_head(head_dir, target_model)
    layers = head.cfg["eagle_aux_hidden_state_layer_ids"]
    eos = target_model.config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    out = []
    for prompt, output in pairs:
        seq = list(prompt) + list(output)
        beyond: list[int] = []
        if output and output[-1] in eos:
            with torch.no_grad():
                for _ in range(depth):
                    beyond.append(int(target_model(input_ids=torch.tensor([seq + beyond])).logits[0, -1].argmax()))
        if len(output) < 2:
            out.append({"drafts": [], "beyond": beyond})
            continue
        aux, _ = target_pass(target_model, torch.tensor([seq]), layers)
        n0 = len(prompt)
        # Output token i sits at position n0 + i; with output[:i+1] known the anchor is n0 + i - 1.
        starts = [n0 + i - 1 for i in range(len(output) - 1)]
        out.append({"drafts": chained_drafts(head, seq, aux[0], starts, depth), "beyond": beyond})
    return out


def param_count(head: Eagle3Head) -> int:
    return sum(p.numel() for p in head.parameters())
