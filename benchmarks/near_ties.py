"""Benchmark: real near-tie flips on this machine (issue 43), an under-trained target in bfloat16.

The bundled target is too sure of its tokens to flip. An under-trained one (a few hundred steps of
the demo's own training, keeping the pair's tokenizer so that its draft and EAGLE-3 head still fit):

    .venv/bin/python scripts/train_demo_models.py --tokenizer-from autotune/demo/models --only target \
        --target-steps 300 --docs 6000 --eval-every 300 --eval-n 8 --out build/undertrained \
        --work build/undertrained/work

Then each run below is a worker as in a study (warm-up, one measured window), in ``--dtype``
(bfloat16); only the reference scores (its own greedy tokens, teacher-forced, top 5: the margins
every other run's flips are judged by, autotune.measure.nearties):

    reference   baseline, concurrency 1        second   the baseline in a second engine, concurrency 1
    conc4       baseline, concurrency 4        ngram, suffix, draft, eagle3: k=4, concurrency 1
    ngram4, suffix4, draft4: the same at concurrency 4

For each run against the reference: outputs that differ, near-ties, faults and unscored flips at the
bfloat16 threshold, every flip's margin, token agreement and the agreement rule's verdict (>= 0.98).
Saved to ``--out`` (benchmarks/data/near_ties.json). Engines: run it under the engine lock.

    flock /tmp/autotune-engine.lock .venv/bin/python benchmarks/near_ties.py [--runs a,b,...]
"""

from __future__ import annotations

import harness  # first: this checkout's autotune on the path

import json
import tempfile
import time
from pathlib import Path
from typing import Any

from autotune import demo
from autotune.core.candidate import Candidate, Settings
from autotune.core.load import LoadPattern
from autotune.core.workload import load_workload
from autotune.measure.config import StudyConfig
from autotune.measure.nearties import dtype_threshold
from autotune.measure.validate import Tolerances, verdict
from autotune.run.engine import UNTIMED_ENV
from autotune.run.evaluate import trial_job
from autotune.run.worker import run_trial

NONE = {"method": "none"}
RUNS: dict[str, tuple[dict[str, Any], int]] = {  # name -> (candidate params, concurrency)
    "reference": (NONE, 1), "second": (NONE, 1), "conc4": (NONE, 4),
    "ngram": ({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}, 1),
    "suffix": ({"method": "suffix", "num_speculative_tokens": 4}, 1),
    "draft": ({"method": "draft_model", "num_speculative_tokens": 4}, 1),
    "eagle3": ({"method": "eagle3", "num_speculative_tokens": 3}, 1),
}
for _name in ("ngram", "suffix", "draft"):
    RUNS[_name + "4"] = (RUNS[_name][0], 4)


def logit_scale(model: Path, prompts: list[str], n: int = 8) -> dict[str, float]:
    """The target's logits (transformers, float32) on the first ``n`` prompts: the largest and the
    mean of each position's largest, what autotune.measure.nearties.LOGIT_SCALE stands for."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    lm = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    tops: list[float] = []
    with torch.no_grad():
        for p in prompts[:n]:
            logits = lm(**tok(p, return_tensors="pt")).logits[0]
            tops += logits.max(dim=-1).values.tolist()
    return {"max": round(max(tops), 3), "mean_top": round(sum(tops) / len(tops), 3), "positions": len(tops)}


def margins_below(scores: dict[str, dict[str, Any]], cuts: tuple[float, ...] = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5)
                  ) -> dict[str, Any]:
    """How close the reference came to a flip: at every scored position, its own token's log-prob
    minus the best other one in its top 5; how many positions fall below each cut."""
    margins = [lp - max(o) for s in scores.values() if "logprobs" in s
               for t, lp, top in zip(s["token_ids"], s["logprobs"], s["top"])
               if (o := [x for u, x in top if u != t])]
    return {"positions": len(margins), "min": round(min(margins), 5) if margins else None,
            "below": {str(c): sum(m < c for m in margins) for c in cuts}}


def main() -> None:
    ap = harness.parser(__doc__, out="near_ties.json")
    ap.add_argument("workload", nargs="?", default="examples/json_edit.jsonl")
    ap.add_argument("--model", type=Path, default=Path("build/undertrained/target"))
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--runs", default=",".join(RUNS), help="which runs (the reference always runs first)")
    args = ap.parse_args()
    chosen = ["reference"] + [n for n in args.runs.split(",") if n in RUNS and n != "reference"]
    wl = load_workload(args.workload)
    root = Path(tempfile.mkdtemp(prefix="near_ties-"))
    settings = Settings(model=str(args.model), tokenizer=str(args.model), draft_model=str(demo.DRAFT),
                        eagle3_head=str(demo.EAGLE3), dtype=args.dtype, max_model_len=demo.MAX_MODEL_LEN,
                        kv_cache_memory_bytes=demo.KV_CACHE_BYTES)
    th = dtype_threshold(args.dtype)
    ref: dict[str, Any] = {}
    rows: dict[str, Any] = {}
    t_all = time.monotonic()
    for name in chosen:
        params, concurrency = RUNS[name]
        cand = Candidate(params)
        cfg = StudyConfig(name="near_ties", results_dir=root, settings=settings, repeats=1, samples=0, warmup=2,
                          load=LoadPattern(concurrency=concurrency))
        job = trial_job(cand, wl, cfg)
        if name != "reference":
            job["reference"] = {}  # the reference's scores judge every flip: nothing else scores
        t0 = time.monotonic()
        out = run_trial(job, root / name, timeout_s=900, env=UNTIMED_ENV)
        if out.raw is None:
            rows[name] = {"failure": out.failure}
            print(f"{name}: failed: {out.failure}", flush=True)
            continue
        recs, reqs = out.raw["windows"][0]["requests"], job["requests"]
        if name == "reference":
            ref = {"records": recs, "scores": out.raw["scores"]}
            rows["reference"] = {"margins": margins_below(ref["scores"]), "seconds": round(time.monotonic() - t0)}
            continue
        v = verdict(reqs, recs, ref["records"], lossy=False, tol=Tolerances(), base_scores=ref["scores"],
                    threshold=th)
        rows[name] = {"label": cand.label, "concurrency": concurrency, "seconds": round(time.monotonic() - t0),
                      "greedy": v.greedy_requests, "differ": v.greedy_requests - v.greedy_identical,
                      "near_ties": v.near_ties, "faults": v.flip_faults, "unscored": v.flips_unscored,
                      "margins": [round(m, 4) for m in v.flip_margins], "token_agreement": round(v.token_agreement, 4),
                      "agreement_rule_passes": v.token_agreement >= 0.98, "verdict": v.reason}
        _save(args, th, rows, t_all)  # each run as it comes: a long benchmark cut short keeps what it measured
        print(f"{name:<10} c={concurrency} differ {rows[name]['differ']}/{v.greedy_requests} near {v.near_ties} "
              f"faults {v.flip_faults} unscored {v.flips_unscored} margins {rows[name]['margins']} "
              f"agreement {v.token_agreement:.4f}", flush=True)
    prompts = [r.prompt or "" for r in wl.requests]
    scale = {"undertrained": logit_scale(args.model, prompts), "demo_target": logit_scale(demo.TARGET, prompts)}
    _save(args, th, rows, t_all, logit_scale=scale)
    print(f"saved {args.out}: logit scale {scale}")


def _save(args: Any, th: Any, rows: dict[str, Any], t_all: float, **extra: Any) -> None:
    result = {"workload": args.workload, "model": str(args.model), "dtype": args.dtype, "threshold": th.value,
              "threshold_source": th.source, "seconds": round(time.monotonic() - t_all), **extra, "runs": rows}
    harness.save(args.out, result)


if __name__ == "__main__":
    main()
