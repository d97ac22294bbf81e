"""Train the bundled demo model pair (target + draft) from the generated corpus.

Reproducible: fixed seeds, fixed step counts, two CPU threads. Writes Hugging Face
folders (config.json, model.safetensors, tokenizer files) that vLLM loads directly:

    python scripts/train_demo_models.py            # writes autotune/demo/models/{target,draft}
    python scripts/train_demo_models.py --quick    # a tiny run, to check the script itself

Weights are stored as float16 to keep the repo small; config.json says float32, so
vLLM and transformers compute in float32 on CPU.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from autotune.demo.corpus import EOS, documents

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
    # A target that costs clearly more per decode step than the draft, within ~25 MB together.
    "target": dict(hidden_size=320, intermediate_size=864, num_hidden_layers=8, num_attention_heads=5),
    "draft": dict(hidden_size=128, intermediate_size=352, num_hidden_layers=1, num_attention_heads=2),
}


def train_tokenizer(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token=EOS,
                                   unk_token="<unk>", pad_token="<pad>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def batches(ids: torch.Tensor, seq_len: int, batch: int, gen: torch.Generator):
    n = (len(ids) - 1) // seq_len
    while True:
        starts = torch.randint(0, n, (batch,), generator=gen) * seq_len
        x = torch.stack([ids[s:s + seq_len + 1] for s in starts])
        yield x[:, :-1], x[:, 1:]


def train(name: str, tok: PreTrainedTokenizerFast, ids: torch.Tensor, *, steps: int, lr: float,
          seq_len: int, batch: int) -> tuple[LlamaForCausalLM, float]:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), max_position_embeddings=1024, tie_word_embeddings=True,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id, rms_norm_eps=1e-5, **SIZES[name])
    model = LlamaForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.95))
    warm = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    gen = torch.Generator().manual_seed(1)
    t0, loss = time.time(), float("nan")
    for step, (x, y) in zip(range(steps), batches(ids, seq_len, batch, gen)):
        logits = model(input_ids=x).logits
        loss_t = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        opt.zero_grad()
        loss_t.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        loss = loss_t.item()
        if step % 25 == 0 or step == steps - 1:
            print(f"{name} step {step}/{steps} loss {loss:.3f} {time.time() - t0:.0f}s", flush=True)
    return model, time.time() - t0


def save(model: LlamaForCausalLM, tok: PreTrainedTokenizerFast, path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    model.config.dtype = "float32"
    model.config.save_pretrained(path)
    model.generation_config.save_pretrained(path)
    state = {k: v.detach().to(torch.float16).contiguous() for k, v in model.state_dict().items()
             if k != "lm_head.weight"}  # tied to the embedding
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    tok.save_pretrained(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a few steps only, to test the script")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--target-steps", type=int, default=450)
    ap.add_argument("--draft-steps", type=int, default=600)
    args = ap.parse_args()
    torch.set_num_threads(2)
    n_docs, vocab = (2000, 512) if args.quick else (40000, 1024)
    texts = documents(n_docs, seed=12345)
    tok = train_tokenizer(texts, vocab)
    ids = torch.tensor(tok("".join(texts))["input_ids"], dtype=torch.long)
    print(f"corpus: {len(texts)} documents, {len(ids)} tokens, vocab {len(tok)}", flush=True)
    t_steps, d_steps = (3, 3) if args.quick else (args.target_steps, args.draft_steps)
    report = {"documents": len(texts), "tokens": len(ids), "vocab": len(tok)}
    for name, steps, lr in (("target", t_steps, 3e-3), ("draft", d_steps, 3e-3)):
        model, secs = train(name, tok, ids, steps=steps, lr=lr, seq_len=256, batch=12)
        save(model, tok, args.out / name)
        report[name] = {"params": sum(p.numel() for p in model.parameters()), "steps": steps,
                        "train_seconds": round(secs, 1),
                        "bytes": (args.out / name / "model.safetensors").stat().st_size}
    (args.out / "training.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
