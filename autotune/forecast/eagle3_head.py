"""An EAGLE-3 head in plain torch: the layer vLLM 0.32 runs for ``method: eagle3``.

vLLM's ``Eagle3LlamaForCausalLM`` (vllm/model_executor/models/llama_eagle3.py) is one decoder layer
whose attention reads ``[input_layernorm(embed(token)), hidden_norm(h)]`` (2 x hidden wide), with
the residual taken from ``h`` before its norm (after it, where the config says
``norm_before_residual``), and a final norm. ``h`` is, on the first pass of a step, ``fc`` over the
target's auxiliary hidden states (the residual stream after the layers
``eagle_aux_hidden_state_layer_ids`` names, concatenated; normed first where ``norm_before_fc`` or
``fc_norm`` says), and on every further draft position the head's own pre-norm output one position
back (the normed one under ``norm_output``). Its embedding and lm_head are the target's unless the
checkpoint carries its own; an lm_head over a smaller draft vocabulary maps its argmax to the
target's ids through ``d2t`` (target id = draft id + d2t[draft id]). The draft at position p reads
token p + 1 and the target's state at p, so it predicts token p + 2.

The same module trains the bundled head (``scripts/train_eagle3.py``: ``unroll``) and replays what
vLLM drafts (``autotune.forecast.eagle3_trace``). Imports torch; only the training script, the trace
and the tests use it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from autotune.forecast.eagle3_format import BIN, HeadFormat, canonical, rope_parameters


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    var = x.float().pow(2).mean(-1, keepdim=True)
    return (x.float() * torch.rsqrt(var + eps)).to(x.dtype) * w


def inv_freq(rope: dict[str, Any], head_dim: int) -> torch.Tensor:
    """Rotary frequencies as vLLM computes them: ``RotaryEmbedding._compute_inv_freq``, and for
    ``rope_type: llama3`` (Llama 3.1) ``Llama3RotaryEmbedding``'s smoothing of the low frequencies."""
    base = float(rope.get("rope_theta", 10000.0))
    freqs = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
    if rope.get("rope_type") != "llama3":
        return freqs
    factor, low, high = float(rope["factor"]), float(rope["low_freq_factor"]), float(rope["high_freq_factor"])
    orig = float(rope["original_max_position_embeddings"])
    wave_len = 2 * math.pi / freqs
    smooth = (orig / wave_len - low) / (high - low) if low != high else 0
    return torch.where(wave_len < orig / high, freqs,
                       torch.where(wave_len > orig / low, freqs / factor, (1 - smooth) * freqs / factor + smooth * freqs))


def rope(x: torch.Tensor, positions: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Neox-style rotary embedding (vLLM's and transformers' Llama): x [..., T, D], positions [T]."""
    ang = positions.to(torch.float32)[:, None] * freqs.to(positions.device)[None, :]
    cos = torch.cat([ang.cos(), ang.cos()], -1).to(x.dtype)
    sin = torch.cat([ang.sin(), ang.sin()], -1).to(x.dtype)
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rot * sin


class Eagle3Head(nn.Module):
    """One EAGLE-3 decoder layer with fc and norms. ``embed``/``lm_head``: the target's (shared,
    frozen; ``lm_head`` None: tied to ``embed``); ``fmt``: the checkpoint's layout and flags (None:
    the bundled head's: no norms moved, no vocabulary of its own)."""

    def __init__(self, cfg: dict[str, Any], embed: torch.Tensor, lm_head: torch.Tensor | None = None,
                 fmt: HeadFormat | None = None) -> None:
        super().__init__()
        h, inter = cfg["hidden_size"], cfg["intermediate_size"]
        self.cfg, self.fmt = cfg, fmt
        self.heads, self.kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.head_dim = cfg.get("head_dim") or h // self.heads
        self.eps = cfg["rms_norm_eps"]
        self.register_buffer("freqs", inv_freq(rope_parameters(cfg), self.head_dim), persistent=False)
        n_aux = len(cfg.get("eagle_aux_hidden_state_layer_ids") or ()) or 3
        fc_in = n_aux * (cfg.get("target_hidden_size") or h)
        self.register_buffer("embed", embed.detach().clone(), persistent=False)
        self.register_buffer("shared_lm_head", (embed if lm_head is None else lm_head).detach().clone(), persistent=False)
        self.fc = nn.Linear(fc_in, h, bias=False)
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
        # The norms a format may put before fc (one over the whole input, or one per aux state).
        self.input_norm = nn.Parameter(torch.ones(fc_in)) if fmt is not None and fmt.norm_before_fc else None
        self.fc_norms = nn.ParameterList([nn.Parameter(torch.ones(fc_in // n_aux)) for _ in range(n_aux)]
                                         if fmt is not None and fmt.fc_norm else [])
        self.register_buffer("lm_head", None, persistent=False)  # the head's own, over its draft vocabulary
        self.register_buffer("d2t", None, persistent=False)  # draft id -> offset to the target's id

    # -- pieces -------------------------------------------------------------------------------
    def qkv(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor):
        """The layer's first half for tokens [B, T] and hidden [B, T, H] at positions [T]:
        (q, k, v) [B, heads, T, D]."""
        b, t = tokens.shape
        e = rms_norm(F.embedding(tokens, self.embed), self.input_layernorm, self.eps)
        x = torch.cat([e, rms_norm(hidden, self.hidden_norm, self.eps)], -1)
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        return rope(q, positions, self.freqs), rope(k, positions, self.freqs), v

    def finish(self, attn: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """attn [B, heads, T, D] and the layer's input ``hidden`` -> (normed output for the logits,
        the hidden the next draft reads)."""
        b, _, t, _ = attn.shape
        a = self.o_proj(attn.transpose(1, 2).reshape(b, t, -1))
        before = self.fmt is not None and self.fmt.norm_before_residual
        residual = a + (rms_norm(hidden, self.hidden_norm, self.eps) if before else hidden)
        x = rms_norm(residual, self.post_attention_layernorm, self.eps)
        x = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        pre = x + residual
        normed = rms_norm(pre, self.norm, self.eps)
        return normed, (normed if self.fmt is not None and self.fmt.norm_output else pre)

    def logits(self, normed: torch.Tensor) -> torch.Tensor:
        """Over the draft vocabulary (the target's, unless the head has its own lm_head)."""
        return normed @ (self.lm_head if self.lm_head is not None else self.shared_lm_head).T

    def tokens(self, logits: torch.Tensor) -> torch.Tensor:
        """The greedy draft, in the target's ids (``d2t`` maps a draft vocabulary's)."""
        ids = logits.argmax(-1)
        return ids if self.d2t is None else ids + self.d2t[ids]

    def combine(self, aux: torch.Tensor) -> torch.Tensor:
        if self.input_norm is not None:
            aux = rms_norm(aux, self.input_norm, self.eps)
        if len(self.fc_norms):
            aux = torch.cat([rms_norm(c, w, self.eps) for w, c in zip(self.fc_norms, aux.chunk(len(self.fc_norms), -1))], -1)
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
        """Tensors by canonical name (``layers.0.*``; the bundled head saves them as ``midlayer.*``)."""
        m = "layers.0."
        return {
            "fc.weight": self.fc.weight, f"{m}self_attn.q_proj.weight": self.q_proj.weight,
            f"{m}self_attn.k_proj.weight": self.k_proj.weight, f"{m}self_attn.v_proj.weight": self.v_proj.weight,
            f"{m}self_attn.o_proj.weight": self.o_proj.weight, f"{m}mlp.gate_proj.weight": self.gate_proj.weight,
            f"{m}mlp.up_proj.weight": self.up_proj.weight, f"{m}mlp.down_proj.weight": self.down_proj.weight,
            f"{m}input_layernorm.weight": self.input_layernorm, f"{m}hidden_norm.weight": self.hidden_norm,
            f"{m}post_attention_layernorm.weight": self.post_attention_layernorm, "norm.weight": self.norm,
            **({"input_norm.weight": self.input_norm} if self.input_norm is not None else {}),
            **{f"fc_norm.{i}.weight": w for i, w in enumerate(self.fc_norms)},
        }

    def save(self, path: Path) -> None:
        """EAGLE-3's own layout (``midlayer.*``, float16), the bundled head's."""
        from safetensors.torch import save_file

        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text(json.dumps(self.cfg, indent=2) + "\n")
        state = {k.replace("layers.0.", "midlayer.", 1): v.detach().to(torch.float16).contiguous()
                 for k, v in self.checkpoint().items()}
        save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})


def read_tensors(fmt: HeadFormat) -> dict[str, torch.Tensor]:
    """Every tensor of the head's checkpoint files, by canonical name."""
    out: dict[str, torch.Tensor] = {}
    for f in fmt.files:
        if f.name == BIN:
            got = torch.load(str(f), map_location="cpu", weights_only=True)
        else:
            from safetensors.torch import load_file

            got = load_file(str(f))
        out.update({canonical(k): v for k, v in got.items()})
    return out


def load_head(fmt: HeadFormat, embed: torch.Tensor, lm_head: torch.Tensor | None = None, *,
              dtype: torch.dtype = torch.float32, cfg: dict[str, Any] | None = None) -> Eagle3Head:
    """The head of ``fmt`` over the target's ``embed``/``lm_head`` (its own where it brings them), in
    ``dtype``. ``cfg``: the layer config to build (default the format's; the trace passes it with the
    aux layers resolved against the target)."""
    head = Eagle3Head(cfg or fmt.cfg, embed, lm_head, fmt)
    by_name = dict(head.checkpoint())
    for k, v in read_tensors(fmt).items():
        if k in by_name:
            by_name[k].data.copy_(v.to(torch.float32))
        elif k == "embed_tokens.weight" and v.shape[-1] == head.embed.shape[-1]:
            head.embed = v.to(torch.float32)  # vLLM keeps a head's own embedding where widths match
        elif k == "lm_head.weight":
            head.lm_head = v.to(torch.float32)
        elif k == "d2t" and fmt.draft_vocab != head.shared_lm_head.shape[0]:
            head.d2t = v.to(torch.long)  # vLLM's draft_id_to_target_id: only where the vocabularies differ
    head.eval()
    return head.to(dtype)
