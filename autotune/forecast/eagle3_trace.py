"""What vLLM 0.32's EAGLE-3 drafting proposes along a baseline's tokens: the head
(autotune.forecast.eagle3_head, in the layout autotune.forecast.eagle3_format reads) chained over the
target's hidden states, at every decode step at once.

The target runs teacher-forced through transformers (``LlamaForCausalLM``: its RoPE, Llama 3.1's
``llama3`` scaling included, is the config's, as vLLM's model applies it), with hooks on the layers
whose residual streams feed the head. On CPU it runs in the calling process in float32; on a GPU it
runs where the target runs, in a trial worker of its own on the worker's device, in the target's
dtype (``run_job``: the worker's entry), never through the CLI's RAM. Only a head and target that
``autotune.forecast.eagle3_fit`` accepts are ever loaded here. The replay
(``autotune.forecast.predict.eagle3_acceptance``) turns these drafts into vLLM's counters.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from autotune.core import snapshots
from autotune.demo import TARGET
from autotune.demo.eagle3 import HEAD
from autotune.forecast import eagle3_head
from autotune.forecast.eagle3_format import HeadFormat, aux_layers, read_head
from autotune.forecast.eagle3_head import Eagle3Head, inv_freq, rms_norm, rope  # noqa: F401 - the training script's names

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def load_target(target: Path = TARGET, *, dtype: torch.dtype = torch.float32, device: str = "cpu") -> Any:
    """The target through transformers, in ``dtype`` on ``device``. Off the CPU its shards are read
    straight onto the device (a GPU target never passes through host RAM whole)."""
    from transformers import LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    if device != "cpu":
        return load_on(target, dtype=dtype, device=device)
    # transformers draws a "Loading weights" bar, which a study's output printed after its report
    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model = LlamaForCausalLM.from_pretrained(target, dtype=dtype, local_files_only=True)
    finally:
        if shown:
            hf_logging.enable_progress_bar()
    return model.eval()


def load_on(target: Path, *, dtype: torch.dtype, device: str) -> Any:
    """The target built on ``device`` and filled shard by shard from its safetensors (transformers'
    ``device_map`` would need accelerate, which vLLM does not bring)."""
    from safetensors.torch import load_file
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.device(device):
        model = LlamaForCausalLM._from_config(LlamaConfig.from_pretrained(target, local_files_only=True), dtype=dtype)
    missing = set(model.state_dict())
    for shard in sorted(Path(target).glob("*.safetensors")):
        part = load_file(str(shard), device=device)
        model.load_state_dict(part, strict=False)
        missing -= set(part)
        del part
    if model.config.tie_word_embeddings:
        model.tie_weights()
        missing.discard("lm_head.weight")
    if missing:
        raise ValueError(f"the target {target}: no weights for {sorted(missing)[:3]}")
    return model.eval()


def head_format(path: Path) -> HeadFormat:
    fmt = read_head(path)
    if isinstance(fmt, str):
        raise ValueError(f"the EAGLE-3 head {path}: {fmt}")
    return fmt


def load_head(path: Path = HEAD, target_model: Any = None) -> Eagle3Head:
    """The head in ``path`` over ``target_model`` (default: the demo target), in the target's dtype
    and on its device, with the aux layers vLLM would use for that target."""
    target_model = target_model if target_model is not None else load_target()
    fmt = head_format(path)
    cfg = {**fmt.cfg, "eagle_aux_hidden_state_layer_ids": list(aux_layers(fmt, target_model.config.num_hidden_layers))}
    embed = target_model.get_input_embeddings().weight
    out = target_model.get_output_embeddings()
    lm_head = None if out is None or out.weight is embed else out.weight
    head = eagle3_head.load_head(fmt, embed.float().cpu(), None if lm_head is None else lm_head.float().cpu(),
                                 dtype=embed.dtype, cfg=cfg)
    return head.to(embed.device)


@torch.no_grad()
def target_pass(target_model: Any, tokens: torch.Tensor, aux_layers: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher-forced target over tokens [B, T]: (aux [B, T, n*H], the residual stream after each
    layer in ``aux_layers`` as vLLM's ``_maybe_add_hidden_state`` takes it; logits [B, T, V])."""
    got: dict[int, torch.Tensor] = {}
    hooks = []
    if 0 in aux_layers:  # before any layer: the embeddings
        hooks.append(target_model.model.embed_tokens.register_forward_hook(
            lambda _m, _inp, out: got.__setitem__(0, out)))
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
    dev = aux.device
    x = torch.tensor([list(tokens)], device=dev)
    nxt = torch.cat([x[:, 1:], x[:, -1:]], 1)
    pos = torch.arange(t, device=dev)
    hidden0 = head.combine(aux[None])
    q, k, v = head.qkv(nxt, hidden0, pos)
    causal = pos[None, :] <= pos[:, None]
    normed, pre = head.finish(F.scaled_dot_product_attention(q, k, v, attn_mask=causal), hidden0)
    first = head.logits(normed[0])
    if not starts:
        return []
    a = torch.tensor(list(starts), device=dev)
    seen = [first[a]]  # [A, V] per step
    drafts = [head.tokens(seen[0])]
    # Keys: the step-1 entries (anchor a sees positions 0..a), then one block per chain step in
    # which each anchor sees only its own entry.
    ks, vs, masks = [k], [v], [pos[None, :] <= a[:, None]]
    own = torch.eye(len(a), dtype=torch.bool, device=dev)
    hidden = pre[:, a]
    for j in range(1, depth):
        qj, kj, vj = head.qkv(drafts[-1][None], hidden, a + j)
        ks.append(kj)
        vs.append(vj)
        masks.append(own)
        att = F.scaled_dot_product_attention(qj, torch.cat(ks, 2), torch.cat(vs, 2), attn_mask=torch.cat(masks, 1))
        normed_j, hidden = head.finish(att, hidden)
        seen.append(head.logits(normed_j[0]))
        drafts.append(head.tokens(seen[-1]))
    if logits is not None:
        logits.extend([step[i] for step in seen] for i in range(len(a)))
    return torch.stack(drafts, 1).tolist()


def trace(pairs: Sequence[tuple[Sequence[int], Sequence[int]]], *, depth: int, head_dir: Path = HEAD,
          target_dir: Path = TARGET, threads: int | None = None, device: str = "cpu",
          dtype: str = "float32") -> list[dict[str, list]]:
    """For each (prompt ids, output ids) pair, what the replay (``autotune.forecast.predict.Eagle3Trace``) needs:

    - ``drafts``: the head's chained greedy drafts of ``depth`` tokens at every decode step a
      request could be at: entry i is what vLLM drafts once output[:i + 1] is known (for
      output[i + 1 ..]), i = 0 .. len(output) - 2;
    - ``beyond``: where the output ends in end-of-sequence, the target's greedy tokens after it
      (``depth`` of them). vLLM verifies a draft past an accepted end-of-sequence token like any
      other and counts it in its acceptance counters before the output is cut at the end.

    ``head_dir``/``target_dir``: local folders or hub ids in the local Hugging Face cache.
    """
    if threads:
        torch.set_num_threads(threads)
    head_path, target_path = snapshots.folder(str(head_dir)), snapshots.folder(str(target_dir))
    if head_path is None or target_path is None:
        raise ValueError(f"{head_dir if head_path is None else target_dir}: not a local folder or cached hub id")
    target_model = load_target(target_path, dtype=DTYPES[dtype], device=device)
    head = load_head(head_path, target_model)
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
                    ids = torch.tensor([seq + beyond], device=device)
                    beyond.append(int(target_model(input_ids=ids).logits[0, -1].argmax()))
        if len(output) < 2:
            out.append({"drafts": [], "beyond": beyond})
            continue
        aux, _ = target_pass(target_model, torch.tensor([seq], device=device), layers)
        n0 = len(prompt)
        # Output token i sits at position n0 + i; with output[:i+1] known the anchor is n0 + i - 1.
        starts = [n0 + i - 1 for i in range(len(output) - 1)]
        out.append({"drafts": chained_drafts(head, seq, aux[0], starts, depth), "beyond": beyond})
    return out


def job(pairs: Sequence[tuple[Sequence[int], Sequence[int]]], *, depth: int, head: str, target: str,
        device: str, dtype: str, gpu_memory: dict[str, Any] | None = None) -> dict[str, Any]:
    """The worker job that traces the head where the target runs (``run_job``), for
    ``autotune.run.worker.run_trial``. It starts no vLLM engine, so it has no engine arguments:
    ``gpu_memory`` says what the worker waits for before it starts on a GPU (the study's
    ``{"utilization": ..., "devices": ...}``: autotune.run.gpu_memory.asked_by)."""
    return {"engine_module": __name__, "requests": [], "gpu_memory": dict(gpu_memory or {}),
            "eagle3_trace": {"pairs": [[list(p), list(o)] for p, o in pairs], "depth": depth, "head": head,
                             "target": target, "device": device, "dtype": dtype}}


def run_job(job: dict[str, Any], phase: Any) -> dict[str, Any]:
    """A trial worker's entry: ``trace`` on the job's device (the worker's GPU), its chains returned."""
    spec = job["eagle3_trace"]
    phase("trace", {"total": len(spec["pairs"])})
    chains = trace([(p, o) for p, o in spec["pairs"]], depth=spec["depth"], head_dir=Path(spec["head"]),
                   target_dir=Path(spec["target"]), device=spec["device"], dtype=spec["dtype"])
    return {"traces": chains}


def param_count(head: Eagle3Head) -> int:
    return sum(p.numel() for p in head.parameters())
