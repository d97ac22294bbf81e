"""Train the demo target's EAGLE-3 head (autotune/demo/models/eagle3) from the target's hidden states.

Reproducible: fixed seeds, two CPU threads (``--threads``), a few minutes on 2 cores. Writes a folder
vLLM 0.32 loads with ``speculative_config={"method": "eagle3", "model": <folder>,
"num_speculative_tokens": k}`` (EAGLE-3's own checkpoint layout: ``midlayer.*``, ``fc``, ``norm``,
config ``LlamaForCausalLMEagle3``; no embedding and no lm_head: vLLM shares the target's):

    python scripts/train_eagle3.py                 # writes autotune/demo/models/eagle3
    python scripts/train_eagle3.py --quick         # a tiny run, to check the script itself

Why not vllm-project/speculators: it trains EAGLE-3 heads into this very format, but its trainer
has no CPU path (with no accelerator its device falls back to "cuda") and it would add torchvision,
torchaudio and more to the engine's venv (eagle3/training.json, ``why_not_speculators``). This script does the part it would do here: the
target runs teacher-forced over the demo corpus (``autotune.demo.corpus``, the documents the pair
was trained on) with hooks on the layers vLLM takes auxiliary states from; the head learns, at each
position p of a completion, to predict the target's greedy choice for token p + 2 from token p + 1
and the fused states at p, unrolled over ``--ttt-steps`` draft positions the way vLLM chains its
drafts (test-time training: from the second draft on, the head reads its own output, not the
target's). The loss is on the target's argmax, not the corpus token, since the head is judged on
agreeing with the target.

At the end, the head is judged as the forecast judges it: the target's greedy outputs on
examples/json_edit.jsonl (transformers), the head's chained drafts along them, and the mean
accepted length per depth (``autotune.forecast.predict.eagle3_acceptance``), written to training.json.
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
from autotune.demo.eagle3 import AUX_LAYERS, HEAD, head_config
from autotune.forecast.eagle3_trace import Eagle3Head, load_head, load_target, target_pass, trace
from autotune.forecast.predict import Eagle3Trace, eagle3_acceptance

ROOT = Path(__file__).resolve().parent.parent
SEED = 20260  # the head's own: its documents are drawn after the pair's (another seed of the same mix)


class Rows:
    """Corpus documents as (ids, prompt length), drawn in batches of like length."""

    def __init__(self, tok: PreTrainedTokenizerFast, n: int, *, seed: int) -> None:
        self.rows = []
        for e in examples(n, seed=seed, domains=TRAINING_MIX):
            prompt = tok(e.prompt)["input_ids"]
            full = tok(e.prompt + e.completion + EOS)["input_ids"]
            if full[:len(prompt)] == prompt:
                self.rows.append((full, len(prompt)))
        self.by_length = sorted(range(len(self.rows)), key=lambda i: len(self.rows[i][0]))
        self.rng = random.Random(seed)
        self.pad = tok.pad_token_id

    def batch(self, size: int, window: int = 256) -> tuple[torch.Tensor, list[tuple[int, int]]]:
        start = self.rng.randrange(max(1, len(self.by_length) - window))
        picked = [self.rows[self.by_length[start + self.rng.randrange(min(window, len(self.by_length)))]]
                  for _ in range(size)]
        width = max(len(ids) for ids, _ in picked)
        x = torch.full((size, width), self.pad, dtype=torch.long)
        for i, (ids, _) in enumerate(picked):
            x[i, :len(ids)] = torch.tensor(ids)
        return x, [(len(ids), n) for ids, n in picked]


def losses(head: Eagle3Head, target_model, x: torch.Tensor, spans: list[tuple[int, int]], steps: int,
           decay: float) -> tuple[torch.Tensor, list[float]]:
    """The TTT loss: cross-entropy of each draft step's logits against the target's argmax, over the
    anchors a >= prompt - 1 of each completion (where vLLM drafts)."""
    aux, tlogits = target_pass(target_model, x, head.cfg["eagle_aux_hidden_state_layer_ids"])
    label = tlogits.argmax(-1)[:, 1:]  # entry q: the target's choice for x[q + 2] (from position q + 1)
    outs = head.unroll(x, aux, steps)
    t = x.shape[1]
    q = torch.arange(t - 1)[None, :]
    length = torch.tensor([n for n, _ in spans])[:, None]
    prompt = torch.tensor([p for _, p in spans])[:, None]
    total, accs = torch.zeros(()), []
    for j, logits in enumerate(outs, start=1):
        mask = (q <= length - 3) & (q - j + 1 >= prompt - 1)
        each = F.cross_entropy(logits.reshape(-1, logits.size(-1)), label.reshape(-1), reduction="none")
        m = mask.reshape(-1).float()
        total = total + decay ** (j - 1) * (each * m).sum() / m.sum().clamp(min=1)
        hit = (logits.argmax(-1) == label).reshape(-1).float()
        accs.append(round(float((hit * m).sum() / m.sum().clamp(min=1)), 4))
    return total, accs


def judge(head_dir: Path, workload: Path, depths: tuple[int, ...], threads: int) -> dict:
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
    traced = trace(pairs, depth=max(depths), head_dir=head_dir, threads=threads)
    traces = [Eagle3Trace(tuple(p), tuple(o), tuple(tuple(c) for c in t["drafts"]), tuple(t["beyond"]))
              for (p, o), t in zip(pairs, traced)]
    return {str(k): round(eagle3_acceptance(traces, k=k).mean_accepted_length, 3) for k in depths}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a few steps only, to test the script")
    ap.add_argument("--out", type=Path, default=HEAD)
    ap.add_argument("--documents", type=int, default=8000, help="corpus documents drawn for training")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--ttt-steps", type=int, default=3, help="draft positions unrolled per training step")
    ap.add_argument("--decay", type=float, default=0.8, help="loss weight of draft step j: decay^(j-1)")
    ap.add_argument("--intermediate-size", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    ap.add_argument("--judge", type=Path, default=ROOT / "examples" / "json_edit.jsonl",
                    help="workload whose replayed acceptance is recorded")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.quick:
        args.documents, args.steps = 200, 3
    tok = PreTrainedTokenizerFast.from_pretrained(TARGET)
    target_model = load_target()
    for p in target_model.parameters():
        p.requires_grad_(False)
    target_cfg = json.loads((TARGET / "config.json").read_text())
    cfg = head_config(target_cfg, intermediate_size=args.intermediate_size, aux_layers=AUX_LAYERS)
    head = Eagle3Head(cfg, target_model.get_input_embeddings().weight)
    for lin in (head.fc, head.q_proj, head.k_proj, head.v_proj, head.o_proj, head.gate_proj, head.up_proj,
                head.down_proj):
        torch.nn.init.normal_(lin.weight, std=0.02)
    rows = Rows(tok, args.documents, seed=SEED)
    print(f"corpus: {len(rows.rows)} documents; head {sum(p.numel() for p in head.parameters())} params", flush=True)
    opt = torch.optim.AdamW(head.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.95))
    warm = min(50, args.steps)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(s, args.steps) / args.steps))))
    t0 = time.time()
    accs: list[float] = []
    for step in range(1, args.steps + 1):
        x, spans = rows.batch(args.batch)
        loss, accs = losses(head, target_model, x, spans, args.ttt_steps, args.decay)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 50 == 0 or step == args.steps:
            print(f"step {step}/{args.steps} loss {loss.item():.4f} acc/step {accs} {time.time() - t0:.0f}s", flush=True)
    seconds = round(time.time() - t0, 1)
    head.save(args.out)
    # Held-out teacher-forced accuracy per draft step, on documents of another seed.
    held = Rows(tok, 64 if args.quick else 384, seed=SEED + 1)
    shipped = load_head(args.out, target_model)  # the float16-rounded weights vLLM loads
    sums = []
    with torch.no_grad():
        for i in range(0, len(held.rows), 32):
            chunk = held.rows[i:i + 32]
            x = torch.full((len(chunk), max(len(ids) for ids, _ in chunk)), held.pad, dtype=torch.long)
            for r, (ids, _) in enumerate(chunk):
                x[r, :len(ids)] = torch.tensor(ids)
            _, got = losses(shipped, target_model, x, [(len(ids), n) for ids, n in chunk], 4, args.decay)
            sums.append(got)
    held_accs = [round(sum(c[j] for c in sums) / len(sums), 4) for j in range(4)]
    report = {"script": "scripts/train_eagle3.py", "seed": SEED, "documents": len(rows.rows), "steps": args.steps,
              "batch": args.batch, "lr": args.lr, "ttt_steps": args.ttt_steps, "decay": args.decay,
              "aux_layers": list(AUX_LAYERS), "intermediate_size": args.intermediate_size,
              "params": sum(p.numel() for p in head.parameters()),
              "bytes": (args.out / "model.safetensors").stat().st_size, "loss": round(loss.item(), 4),
              "train_accuracy_by_step": accs, "heldout_accuracy_by_step": held_accs, "train_seconds": seconds,
              "threads": args.threads,
              "why_not_speculators": "speculators 0.9.0 (wheel metadata: torch>=2.9,<=2.14.1, transformers<=5.19) "
                                     "would resolve beside torch 2.13 cpu but adds torchvision, torchaudio, "
                                     "datasets and hs-connectors to the engine's venv, and its trainer has no CPU "
                                     "path: with no accelerator its device falls back to 'cuda' "
                                     "(speculators/train/trainer.py, utils/util.py); its data generation asks a "
                                     "running vLLM server for hidden states"}
    if not args.quick and args.judge.exists():
        report["replayed_mean_accepted_length"] = {"workload": str(args.judge.relative_to(ROOT)),
                                                   **judge(args.out, args.judge, (1, 2, 3, 4), args.threads)}
    (args.out / "training.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
