"""Benchmark (GPU): how far do bfloat16 log-probs move between the shapes that decoding and
speculative verification run, and does the greedy token flip (issue 43's near-tie threshold)?

No vLLM: the demo target through transformers on one CUDA device, in each dtype. Per workload
prompt, greedy decoding one token a step with the KV cache (the baseline's shape) gives each
generated token's log-probs; the same tokens are then scored in chunks of c tokens on the prompt's
cache (c = k+1: the shape that verifies k draft tokens) and in one teacher-forced pass over the
whole text. Per shape against decoding: positions whose argmax differs (with the decode margin
there), the largest and the quantiles of |change| of the decoded token's log-prob and of any logit,
and the top logit's size (the logit scale autotune.measure.nearties assumes 32 for).

    python benchmarks/bf16_shapes.py [--device cuda] [--tokens 48] [--out benchmarks/data/h200_bf16_shapes.json]
"""

from __future__ import annotations

import harness  # first: this checkout's autotune on the path

import json
import time
from typing import Any

from autotune import demo
from autotune.measure.nearties import dtype_threshold


def _decode(model: Any, ids: Any, tokens: int) -> tuple[list[int], Any, Any]:
    """Greedy, one token a step on the KV cache; the tokens, their rows of log-probs and raw logits."""
    import torch

    out = model(ids, use_cache=True)
    cache, rows, gen = out.past_key_values, [out.logits[0, -1].float()], []
    for _ in range(tokens - 1):
        nxt = int(rows[-1].argmax())
        gen.append(nxt)
        out = model(torch.tensor([[nxt]], device=ids.device), past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        rows.append(out.logits[0, -1].float())
    gen.append(int(rows[-1].argmax()))
    logits = torch.stack(rows)
    return gen, torch.log_softmax(logits, -1), logits


def _chunked(model: Any, ids: Any, gen: list[int], chunk: int) -> tuple[Any, Any]:
    """The same tokens scored ``chunk`` at a time on the prompt's cache (row i: token i's log-probs)."""
    import torch

    out = model(ids, use_cache=True)
    cache, rows = out.past_key_values, [out.logits[0, -1:].float()]
    feed = gen[:-1]
    for i in range(0, len(feed), chunk):
        out = model(torch.tensor([feed[i:i + chunk]], device=ids.device), past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        rows.append(out.logits[0].float())
    logits = torch.cat(rows)
    return torch.log_softmax(logits, -1), logits


def _whole(model: Any, ids: Any, gen: list[int]) -> tuple[Any, Any]:
    """One teacher-forced pass over prompt + tokens (the scoring pass's shape)."""
    import torch

    full = torch.cat([ids, torch.tensor([gen[:-1]], device=ids.device)], 1)
    logits = model(full).logits[0, ids.shape[1] - 1:].float()
    return torch.log_softmax(logits, -1), logits


def _compare(gen: list[int], ref: Any, ref_logits: Any, other: Any, other_logits: Any, acc: dict[str, Any]) -> None:
    import torch

    idx = torch.tensor(gen, device=ref.device)
    d_tok = (ref.gather(1, idx[:, None]) - other.gather(1, idx[:, None])).abs()[:, 0]
    acc["tok"] += d_tok.tolist()
    acc["logit_max"] = max(acc["logit_max"], float((ref_logits - other_logits).abs().max()))
    top2 = ref.topk(2, -1).values
    margins = (top2[:, 0] - top2[:, 1]).tolist()
    for i, (a, b) in enumerate(zip(ref.argmax(-1).tolist(), other.argmax(-1).tolist())):
        if a != b:
            acc["flips"].append({"position": i, "decode_margin": round(margins[i], 5)})
    acc["positions"] += len(gen)


def _summary(acc: dict[str, Any]) -> dict[str, Any]:
    import numpy as np

    tok = np.array(acc["tok"])
    return {"positions": acc["positions"], "argmax_flips": len(acc["flips"]), "flips": acc["flips"][:20],
            "tok_logprob_abs_change": {"max": float(tok.max()), "p99": float(np.quantile(tok, 0.99)),
                                       "p50": float(np.quantile(tok, 0.5)), "mean": float(tok.mean())},
            "logit_abs_change_max": acc["logit_max"]}


def main() -> None:
    ap = harness.parser(__doc__, out="h200_bf16_shapes.json", summary=True)
    ap.add_argument("--workload", default="examples/json_edit.jsonl")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--chunks", default="4,8", help="verification widths k+1")
    ap.add_argument("--dtypes", default="bfloat16,float32")
    args = ap.parse_args()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    prompts = [json.loads(line)["prompt"] for line in (harness.ROOT / args.workload).read_text().splitlines()
               if line.strip()]
    tok = AutoTokenizer.from_pretrained(str(demo.TARGET))
    chunks = [int(c) for c in args.chunks.split(",")]
    result: dict[str, Any] = {"workload": args.workload, "prompts": len(prompts), "tokens": args.tokens,
                              "device": torch.cuda.get_device_name() if args.device == "cuda" else args.device,
                              "torch": torch.__version__, "dtypes": {}}
    for dtype in args.dtypes.split(","):
        t0 = time.perf_counter()
        model = AutoModelForCausalLM.from_pretrained(str(demo.TARGET), torch_dtype=getattr(torch, dtype))
        model = model.to(args.device).eval()
        shapes = {**{f"chunk{c}": c for c in chunks}, "whole": None}
        accs = {s: {"tok": [], "flips": [], "positions": 0, "logit_max": 0.0} for s in shapes}
        margins, top_logit = [], []
        with torch.inference_mode():
            for p in prompts:
                ids = tok(p, return_tensors="pt").input_ids.to(args.device)
                gen, ref, ref_logits = _decode(model, ids, args.tokens)
                top2 = ref.topk(2, -1).values
                margins += (top2[:, 0] - top2[:, 1]).tolist()
                top_logit += ref_logits.max(-1).values.tolist()
                for name, c in shapes.items():
                    other, other_logits = _chunked(model, ids, gen, c) if c else _whole(model, ids, gen)
                    _compare(gen, ref, ref_logits, other, other_logits, accs[name])
        th = dtype_threshold(dtype)
        m = sorted(margins)
        result["dtypes"][dtype] = {
            "autotune_threshold": th.value, "threshold_source": th.source,
            "decode_margins_below": {str(x): sum(v < x for v in m) for x in (0.01, 0.05, 0.1, 0.25)},
            "top_logit": {"mean": sum(top_logit) / len(top_logit), "max": max(top_logit)},
            "shapes": {s: _summary(a) for s, a in accs.items()}, "seconds": round(time.perf_counter() - t0, 1)}
        print(json.dumps({dtype: result["dtypes"][dtype]["shapes"]}, indent=1)[:3000], flush=True)
        del model
    harness.save(args.out, result)


if __name__ == "__main__":
    main()
