"""Train the bundled demo model pair (target + draft) from the generated corpus.

Reproducible: fixed seeds, two CPU threads (`--threads`). Writes Hugging Face folders (config.json,
model.safetensors, tokenizer files) that vLLM loads directly:

    python scripts/train_demo_models.py                 # writes autotune/demo/models/{target,draft}
    python scripts/train_demo_models.py --resume        # go on from the last checkpoint
    python scripts/train_demo_models.py --quick         # a tiny run, to check the script itself
    python scripts/train_demo_models.py --tokenizer-from autotune/demo/models --only target --target-steps 300 \
        --docs 6000 --eval-every 300 --eval-n 8 --out build/undertrained --work build/undertrained/work
                                                        # an under-trained target (benchmarks/near_ties.py)
    python scripts/train_demo_models.py --init-from autotune/demo/models --only target --target-steps 2000 \
        --lr 4e-4 --copy-share 0 --json-share 0.2 --multi-share 0.3 --eval-n 96
                                                        # go on from a shipped pair on today's corpus
                                                        # (the shipped target's last phase)

The target must do the corpus tasks the way an instruction-tuned LLM does: copy the record it is
asked to edit and change one field. Copying needs an induction mechanism (two or more attention
layers with RoPE) and many steps of copy-heavy text, so: each training row is one whole document
starting at position 0 (as vLLM serves it), the loss is on the completion only (the prompt's
random order ids and prices teach nothing but noise), and training goes on until the exact-edit
rate on held-out corpus examples (greedy, `autotune.demo.quality`) reaches --stop-at twice in a
row. Every evaluation is a line of `training_log.jsonl` and a checkpoint, so a long run can be
watched and resumed.

Weights are stored as float16 to keep the repo small; config.json says float32, so
vLLM and transformers compute in float32 on CPU.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from autotune.demo.corpus import EOS, TRAINING_DOCS, TRAINING_MIX, TRAINING_SEED, documents, examples
from autotune.demo.quality import check, rates

OUT = Path(__file__).resolve().parent.parent / "autotune" / "demo" / "models"
SPECIALS = ["<unk>", "<s>", EOS, "<pad>"]
# Role-tagged chat rendering, matching the corpus' "### Support chat." layout.
CHAT_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}### {{ messages[0]['content'] }}\n{% else %}### Support chat.\n{% endif %}"
    "{% for m in messages %}{% if m['role'] == 'user' %}Customer: {{ m['content'] }}\n"
    "{% elif m['role'] == 'assistant' %}Agent: {{ m['content'] }}</s>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}Agent:{% endif %}"
)
SIZES = {
    # Deep enough to copy (induction needs two attention layers; four give it room), narrow
    # enough to train on 2 cores in about an hour, and clearly costlier per step than the draft.
    "target": dict(hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=4),
    # The draft stays cheap: one layer, so what it can copy is limited (a measured fact, README).
    "draft": dict(hidden_size=128, intermediate_size=352, num_hidden_layers=1, num_attention_heads=2),
}
TOKENIZER_DOCS, TOKENIZER_SEED = 40000, 12345  # the tokenizer is trained on these documents
EVAL_SEED = 4242  # held-out evaluation examples come from another seed


# A JSON record's key with its quotes, colon and the value's opening quote, as one token each
# (--key-tokens): the value then follows its key directly, so copying it is a one-token induction
# (find this key token in the prompt, copy what follows). With the byte-level BPE alone a value sits
# three tokens after its key (`city` `":` ` "` `Berlin`), and the 4-layer target never learned to
# copy city and status that way (docs/findings.md).
# Each with and without the space that separates it from the field before (matching takes the
# longest).
_KEYS = [f'"{k}": "' for k in ("order_id", "customer", "city", "status", "sku", "name")] + \
        [f'"{k}": ' for k in ("items", "qty", "price")]
KEY_TOKENS = _KEYS + [" " + k for k in _KEYS]


def train_tokenizer(texts: list[str], vocab_size: int, *, key_tokens: bool = False) -> PreTrainedTokenizerFast:
    from tokenizers import AddedToken

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    if key_tokens:  # matched in the raw text before the byte-level split, so they stay whole
        tok.add_tokens([AddedToken(k, normalized=False, single_word=False) for k in KEY_TOKENS])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token=EOS,
                                   unk_token="<unk>", pad_token="<pad>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


class Rows:
    """An endless stream of batches: one document a row from position 0, loss on the completion."""

    def __init__(self, tok: PreTrainedTokenizerFast, n_docs: int, *, seed: int) -> None:
        self.rows: list[tuple[list[int], int]] = []
        self.domains: list[str] = []
        self.items: list[int] = []  # a JSON record's items (0 for the other domains)
        for e in examples(n_docs, seed=seed, domains=TRAINING_MIX):
            prompt = tok(e.prompt)["input_ids"]
            full = tok(e.prompt + e.completion + EOS)["input_ids"]
            # The byte-level BPE never merges across the prompt's last byte (prompts end before
            # the completion's leading space), so the prompt's ids are a prefix of the document's.
            if full[:len(prompt)] == prompt:
                self.rows.append((full, len(prompt)))
                # JSON edits of an item's qty leave city and status as they were: pure copies.
                self.domains.append("json-qty" if e.domain == "json" and "set qty of" in e.prompt else e.domain)
                self.items.append(e.prompt.count('"sku"'))
        self.rng = random.Random(seed)
        self.pad = tok.pad_token_id
        self.copy_share = 0.4  # batches of qty edits alone (--copy-share)
        self.json_share = 0.3  # batches of JSON edits alone (--json-share)
        self.multi_share = 0.0  # batches of JSON edits of records with two or more items (--multi-share)
        # The value after `"city": "` and `"status": "`: the two fields an instruction may replace,
        # 2 of ~100 tokens of a record, and the two the targets without --key-tokens never copied
        # (docs/findings.md).
        # --edit-weight counts their loss that many times (the shipped pair: 1, plain loss).
        self.marks = [tok(f'"{k}": "')["input_ids"][1:] for k in ("city", "status")]
        self.edit_weight = 1.0  # --edit-weight
        # Rows of like length batch together (a batch pads to its longest row): drawn from a
        # window of the length-sorted rows, wide enough to mix the domains of one length.
        self.by_length = sorted(range(len(self.rows)), key=lambda i: len(self.rows[i][0]))
        # JSON edits are the hardest task: city and status, which the instruction may or may not
        # change, stayed at the marginal (a near-uniform guess, 0 of 48 records exact at step 3000)
        # while every other field was copied. Batches of qty edits alone, where city and status are
        # always copies, teach the copy; the full mix then teaches the exception.
        self.json_by_length = [i for i in self.by_length if self.domains[i] in ("json", "json-qty")]
        self.copy_by_length = [i for i in self.by_length if self.domains[i] == "json-qty"]
        # The pair shipped at step 7,500 copied every one-item record but missed the second item's
        # qty or price (each item has the same `"qty": ` key token, so the key alone cannot tell
        # the items apart): batches of multi-item records alone teach which item is being copied.
        self.multi_by_length = [i for i in self.json_by_length if self.items[i] >= 2]

    def batch(self, size: int, window: int = 512) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        u = self.rng.random()
        order = self.copy_by_length if u < self.copy_share else \
            self.json_by_length if u < self.copy_share + self.json_share else \
            self.multi_by_length if u < self.copy_share + self.json_share + self.multi_share else self.by_length
        start = self.rng.randrange(max(1, len(order) - window))
        picked = [self.rows[order[start + self.rng.randrange(min(window, len(order)))]] for _ in range(size)]
        width = max(len(ids) for ids, _ in picked) - 1
        x = torch.full((size, width), self.pad, dtype=torch.long)
        y = torch.full((size, width), -100, dtype=torch.long)
        w = torch.zeros((size, width))
        for i, (ids, n_prompt) in enumerate(picked):
            t = torch.tensor(ids)
            x[i, :len(ids) - 1] = t[:-1]
            y[i, n_prompt - 1:len(ids) - 1] = t[n_prompt:]  # predict the completion and EOS only
            w[i, n_prompt - 1:len(ids) - 1] = 1.0
            for j in range(n_prompt, len(ids)):
                if any(ids[j - len(m):j] == m for m in self.marks):
                    w[i, j - 1] = self.edit_weight
        return x, y, w


@torch.no_grad()
def evaluate(model: LlamaForCausalLM, tok: PreTrainedTokenizerFast, n: int, *, max_new: int = 200) -> dict:
    """Greedy outputs on held-out corpus examples, judged by `autotune.demo.quality`."""
    model.eval()
    held = examples(n, seed=EVAL_SEED, domains=("json", "config", "json", "config", "logs", "support"))
    results = []
    tok.padding_side = "left"
    for i in range(0, len(held), 16):
        chunk = held[i:i + 16]
        enc = tok([e.prompt for e in chunk], return_tensors="pt", padding=True)
        out = model.generate(**enc, max_new_tokens=max_new, do_sample=False, eos_token_id=tok.eos_token_id,
                             pad_token_id=tok.pad_token_id)
        for e, ids in zip(chunk, out[:, enc["input_ids"].shape[1]:]):
            results.append(check(e.prompt, tok.decode(ids, skip_special_tokens=False)))
    model.train()
    return {k: round(v, 3) for k, v in rates(results).items()}


def make_model(name: str, tok: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), max_position_embeddings=1024, tie_word_embeddings=True,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id, rms_norm_eps=1e-5, **SIZES[name])
    return LlamaForCausalLM(cfg)


def train(name: str, tok: PreTrainedTokenizerFast, rows: Rows, args: argparse.Namespace,
          steps: int, work: Path) -> tuple[LlamaForCausalLM, dict]:
    """Train until the held-out exact-edit rate reaches ``--stop-at`` twice in a row, or ``steps``."""
    model = make_model(name, tok)
    if args.init_from and name == "target":  # the draft is cheap: it always starts fresh
        model = LlamaForCausalLM.from_pretrained(args.init_from / name, dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.95))
    warm = 100
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))))
    ckpt, log_path = work / f"{name}.ckpt", work / "training_log.jsonl"
    step, elapsed, hits = 0, 0.0, 0
    if args.resume and ckpt.exists():
        state = torch.load(ckpt, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        sched.load_state_dict(state["sched"])
        step, elapsed, hits = state["step"], state["elapsed"], state["hits"]
        rows.rng.setstate(state["rng"])
        print(f"{name}: resumed at step {step}", flush=True)
    t0 = time.time() - elapsed
    last: dict = {}
    while step < steps:
        x, y, w = rows.batch(args.batch)
        logits = model(input_ids=x).logits
        each = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), reduction="none")
        loss_t = (each * w.reshape(-1)).sum() / w.sum()
        opt.zero_grad()
        loss_t.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        step += 1
        if step % 25 == 0:
            print(f"{name} step {step}/{steps} loss {loss_t.item():.4f} {time.time() - t0:.0f}s", flush=True)
        if step % args.eval_every == 0 or step == steps:
            last = {"model": name, "step": step, "loss": round(loss_t.item(), 4),
                    "seconds": round(time.time() - t0, 1), **evaluate(model, tok, args.eval_n)}
            with log_path.open("a") as f:
                f.write(json.dumps(last) + "\n")
            print(json.dumps(last), flush=True)
            if args.save_evals:  # every evaluated step as a loadable folder, to judge on the real engine
                save(model, tok, work / f"{name}-step{step}")
            hits = hits + 1 if last.get("edit", 0.0) >= args.stop_at else 0
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
                        "step": step, "elapsed": time.time() - t0, "hits": hits, "rng": rows.rng.getstate()}, ckpt)
            if name == "target" and hits >= 2:
                break
    return model, {**last, "train_seconds": round(time.time() - t0, 1)}


def save(model: LlamaForCausalLM, tok: PreTrainedTokenizerFast, path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    model.config.dtype = "float32"
    model.config.save_pretrained(path)
    model.generation_config.save_pretrained(path)
    state = {k: v.detach().to(torch.float16).contiguous() for k, v in model.state_dict().items()
             if k != "lm_head.weight"}  # tied to the embedding
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    tok.padding_side = "right"
    tok._tokenizer.no_padding()  # the evaluation's left padding is not part of the model
    tok.save_pretrained(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a few steps only, to test the script")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--work", type=Path, default=Path("build/train"), help="checkpoints and the training log")
    ap.add_argument("--resume", action="store_true", help="go on from the checkpoints in --work")
    ap.add_argument("--target-steps", type=int, default=6000, help="at most this many steps")
    ap.add_argument("--draft-steps", type=int, default=1500)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--eval-n", type=int, default=48, help="held-out examples per evaluation")
    ap.add_argument("--stop-at", type=float, default=0.97, help="exact-edit rate that ends the target's training")
    ap.add_argument("--only", choices=["target", "draft"], help="train one model of the pair")
    ap.add_argument("--copy-share", type=float, default=0.4, help="share of batches of qty edits alone")
    ap.add_argument("--json-share", type=float, default=0.3, help="share of batches of JSON edits alone")
    ap.add_argument("--multi-share", type=float, default=0.0,
                    help="share of batches of JSON edits of records with two or more items")
    ap.add_argument("--save-evals", action="store_true",
                    help="save each evaluated step's model under --work (to judge checkpoints on vLLM)")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    ap.add_argument("--edit-weight", type=float, default=1.0, help="loss weight of a JSON record's city and status")
    ap.add_argument("--key-tokens", action="store_true", help="one token per JSON key with its quotes and colon "
                                                              "(a value then follows its key directly)")
    ap.add_argument("--init-from", type=Path, help="a trained pair's folder: keep its tokenizer and go on "
                                                   "training its target (the draft trains from scratch)")
    ap.add_argument("--tokenizer-from", type=Path, help="a trained pair's folder: keep its tokenizer, train from "
                                                        "scratch (an under-trained target for its draft and EAGLE-3 "
                                                        "head: benchmarks/near_ties.py)")
    ap.add_argument("--docs", type=int, default=TRAINING_DOCS, help="corpus documents to train on")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    n_docs, vocab = (2000, 512) if args.quick else (TOKENIZER_DOCS, 1024)
    if args.init_from or args.tokenizer_from:
        tok = PreTrainedTokenizerFast.from_pretrained((args.init_from or args.tokenizer_from) / "target")
    else:
        tok = train_tokenizer(documents(n_docs, seed=TOKENIZER_SEED), vocab, key_tokens=args.key_tokens)
    rows = Rows(tok, 4000 if args.quick else args.docs, seed=TRAINING_SEED)
    rows.copy_share, rows.json_share, rows.multi_share = args.copy_share, args.json_share, args.multi_share
    rows.edit_weight = args.edit_weight
    print(f"corpus: {len(rows.rows)} documents, vocab {len(tok)}", flush=True)
    if args.quick:
        args.target_steps, args.draft_steps, args.eval_every, args.eval_n = 3, 3, 3, 6
    args.work.mkdir(parents=True, exist_ok=True)
    report_path = args.out / "training.json"
    report = json.loads(report_path.read_text()) if args.only and report_path.exists() else {}
    report.update({"documents": len(rows.rows), "vocab": len(tok), "batch": args.batch, "lr": args.lr,
                   "key_tokens": bool(args.key_tokens), "copy_share": args.copy_share, "json_share": args.json_share,
                   "multi_share": args.multi_share, "edit_weight": args.edit_weight})
    if args.init_from:
        import subprocess  # the commit that holds the pair it goes on from, for whoever retraces it

        commit = subprocess.run(["git", "log", "-1", "--format=%h", "--", str(args.init_from / "target")],
                                capture_output=True, text=True).stdout.strip() or None
        before = json.loads((args.init_from / "training.json").read_text())
        report["init_from"] = {"folder": str(args.init_from), "commit": commit, "before": before.get("target")}
        report["key_tokens"] = before.get("key_tokens", False)  # the tokenizer is the one it goes on from
    for name, steps in (("target", args.target_steps), ("draft", args.draft_steps)):
        if args.only and name != args.only:
            continue
        model, result = train(name, tok, rows, args, steps, args.work)
        save(model, tok, args.out / name)
        report[name] = {"params": sum(p.numel() for p in model.parameters()), **result,
                        "bytes": (args.out / name / "model.safetensors").stat().st_size, **SIZES[name]}
    report_path.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
