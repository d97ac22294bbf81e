"""Train the demo target's DFlash block drafter (autotune/demo/models/dflash) from the target's hidden states.

Reproducible: fixed seeds, two CPU threads (``--threads``), minutes on 2 cores. Writes a folder vLLM
0.32 loads with ``speculative_config={"method": "dflash", "model": <folder>, "num_speculative_tokens": k}``
(``DFlashDraftModel``; no embedding and no lm_head: vLLM shares the target's):

    python scripts/train_dflash.py               # writes autotune/demo/models/dflash
    python scripts/train_dflash.py --quick       # a tiny run, to check the script itself

What it learns is what vLLM asks of it (autotune.forecast.dflash_drafter): at a completion's
position a, from the target's states at 0..a (the residual streams after the layers its config
names, teacher-forced over corpus documents) and token a + 1, fill k mask slots at a + 2 .. a + 1 + k
in one pass, each with the target's greedy choice there (the loss is on the target's argmax, not the
corpus token: a draft is judged by agreeing with the target). k is drawn per step from --depths, so
one drafter serves every depth the spaces search.

At the end, the drafter is judged as a forecast would judge it: the target's greedy outputs on
examples/json_edit.jsonl (transformers), the drafter's blocks along them, and the mean accepted
length per depth (``autotune.forecast.predict.eagle3_acceptance``: a block's drafts are walked as a
chain's), written to training.json.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import PreTrainedTokenizerFast

from autotune.demo import TARGET
from autotune.demo.corpus import EOS, TRAINING_MIX, examples
from autotune.demo.dflash import DRAFTER, drafter_config
from autotune.forecast.dflash_drafter import DFlashDrafter, trace
from autotune.forecast.eagle3_trace import load_target, target_pass
from autotune.forecast.predict import Eagle3Trace, eagle3_acceptance

ROOT = Path(__file__).resolve().parent.parent
SEED = 31337  # the drafter's own documents: another seed of the corpus' mix


def corpus(tok: PreTrainedTokenizerFast, n: int, seed: int) -> list[tuple[list[int], int]]:
    """Documents as (ids, prompt length)."""
    rows = []
    for e in examples(n, seed=seed, domains=TRAINING_MIX):
        prompt = tok(e.prompt)["input_ids"]
        full = tok(e.prompt + e.completion + EOS)["input_ids"]
        if full[:len(prompt)] == prompt and len(full) - len(prompt) > 4:
            rows.append((full, len(prompt)))
    return rows


def step_loss(drafter: DFlashDrafter, target_model, rows: list[tuple[list[int], int]], k: int, anchors: int,
              rng: random.Random) -> tuple[torch.Tensor, list[float]]:
    """Cross-entropy of each mask slot against the target's argmax there, over ``anchors`` random
    completion positions of each document."""
    total, hits, count = torch.zeros(()), torch.zeros(k), torch.zeros(k)
    for ids, n_prompt in rows:
        x = torch.tensor([ids])
        aux, logits = target_pass(target_model, x, drafter.aux_layers)
        label = logits[0].argmax(-1)  # entry p: the target's choice for token p + 1
        last = len(ids) - 2  # a block needs token a + 1
        pool = list(range(max(0, n_prompt - 1), last + 1))
        starts = torch.tensor(sorted(rng.sample(pool, min(anchors, len(pool)))))
        kv = drafter.context(aux[0], torch.arange(len(ids)))
        out = drafter.blocks(kv, x[0], starts, k)  # [A, k, V]: slot j drafts token a + 1 + j
        pos = starts[:, None] + torch.arange(1, k + 1)[None, :]  # the target's choice for a + 1 + j sits at a + j
        valid = pos <= len(ids) - 2
        want = label[pos.clamp(max=len(ids) - 2)]
        each = F.cross_entropy(out.reshape(-1, out.shape[-1]), want.reshape(-1), reduction="none").view_as(want)
        total = total + (each * valid).sum() / valid.sum().clamp(min=1)
        hits += ((out.argmax(-1) == want) & valid).sum(0).float()
        count += valid.sum(0).float()
    return total / len(rows), [round(float(h / max(c, 1)), 4) for h, c in zip(hits, count)]


def judge(path: Path, workload: Path, depths: tuple[int, ...], threads: int) -> dict:
    """Mean accepted length per depth on a workload's greedy requests, replayed (the forecast's way)."""
    tok = PreTrainedTokenizerFast.from_pretrained(TARGET)
    target_model = load_target()
    pairs = []
    for line in workload.read_text().splitlines():
        r = json.loads(line)
        ids = tok(r["prompt"], return_tensors="pt")["input_ids"]
        with torch.no_grad():
            out = target_model.generate(ids, max_new_tokens=r.get("max_tokens", 128), do_sample=False,
                                        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        pairs.append((ids[0].tolist(), out[0, ids.shape[1]:].tolist()))
    traced = trace(pairs, ks=depths, drafter_dir=path, target_dir=TARGET, threads=threads)
    got = {}
    for k in depths:
        traces = [Eagle3Trace(tuple(p), tuple(o), tuple(tuple(c) for c in t["drafts"][str(k)]), tuple(t["beyond"]))
                  for (p, o), t in zip(pairs, traced)]
        got[str(k)] = round(eagle3_acceptance(traces, k=k).mean_accepted_length, 3)
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a few steps only, to test the script")
    ap.add_argument("--out", type=Path, default=DRAFTER)
    ap.add_argument("--documents", type=int, default=8000, help="corpus documents drawn for training")
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--batch", type=int, default=8, help="documents a step")
    ap.add_argument("--anchors", type=int, default=48, help="blocks a document a step")
    ap.add_argument("--depths", type=int, nargs="+", default=[2, 3, 4, 5, 6, 8], help="k drawn per step from these")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--intermediate-size", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    ap.add_argument("--judge", type=Path, default=ROOT / "examples" / "json_edit.jsonl",
                    help="workload whose replayed acceptance is recorded")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    rng = random.Random(SEED)
    if args.quick:
        args.documents, args.steps = 200, 3
    tok = PreTrainedTokenizerFast.from_pretrained(TARGET)
    target_model = load_target()
    for p in target_model.parameters():
        p.requires_grad_(False)
    target_cfg = json.loads((TARGET / "config.json").read_text())
    cfg = drafter_config(target_cfg, intermediate_size=args.intermediate_size, layers=args.layers,
                         block_size=max(args.depths) + 1)
    drafter = DFlashDrafter(cfg, target_model.get_input_embeddings().weight)
    for name, p in drafter.named_parameters():
        if p.dim() == 2:
            torch.nn.init.normal_(p, std=0.02)
    rows = corpus(tok, args.documents, SEED)
    params = sum(p.numel() for p in drafter.parameters())
    print(f"corpus: {len(rows)} documents; drafter {params} params", flush=True)
    opt = torch.optim.AdamW(drafter.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.95))
    warm = min(50, args.steps)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(s, args.steps) / args.steps))))
    t0 = time.time()
    accs: list[float] = []
    for step in range(1, args.steps + 1):
        k = rng.choice(args.depths)
        loss, accs = step_loss(drafter, target_model, rng.sample(rows, args.batch), k, args.anchors, rng)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 50 == 0 or step == args.steps:
            print(f"step {step}/{args.steps} k={k} loss {loss.item():.4f} acc/slot {accs} {time.time() - t0:.0f}s",
                  flush=True)
    seconds = round(time.time() - t0, 1)
    drafter.save(args.out)
    report = {"script": "scripts/train_dflash.py", "seed": SEED, "documents": len(rows), "steps": args.steps,
              "batch": args.batch, "anchors": args.anchors, "depths": args.depths, "lr": args.lr,
              "layers": args.layers, "intermediate_size": args.intermediate_size, "params": params,
              "bytes": (args.out / "model.safetensors").stat().st_size, "loss": round(loss.item(), 4),
              "last_step_accuracy_by_slot": accs, "train_seconds": seconds, "threads": args.threads}
    if not args.quick and args.judge.exists():
        report["replayed_mean_accepted_length"] = {"workload": str(args.judge.relative_to(ROOT)),
                                                   **judge(args.out, args.judge, (2, 3, 4, 6, 8), args.threads)}
    (args.out / "training.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
