"""Benchmark: the greedy-path verdict on planted flips (issue 43), no engine.

A synthetic workload of ``--requests`` greedy requests of ``--tokens`` tokens. The baseline's
teacher-forced scores (as autotune.run.replay.score_greedy keeps them: its own token's log-prob and
the top 5 at every position) put the runner-up a margin below the baseline's token, the margin
drawn from an exponential of mean 3 nats. A lossless candidate repeats the baseline's tokens except
where a flip is planted: from the flip on its tokens are its own (the two texts part ways). Planted:

    confident   a wrong token where the baseline's margin is large (1-8 nats, in its top 5), late in
                a request (70-95% of the way), on 1, 2 or 4 requests
    outside     a token outside the baseline's top 5, late, on 1 request
    near-tie    a flip where the baseline's margin is small (0-0.2 nats: below bfloat16's rounding
                at the assumed logit scale, autotune.measure.nearties), anywhere in the request,
                on 1, 3 or 8 requests
    mixed       3 near-tie flips and 1 confident one (must be caught)
    identical   no flip

Each cell runs ``--seeds`` seeds through autotune.measure.validate.verdict (the study's own
function) with the model's dtype bfloat16, and counts how often the candidate is rejected. Saved
as JSON (``--out``); run on the rule before issue 43 (``greedy_flips_before.json``) and after
(``greedy_flips_after.json``):

    .venv/bin/python benchmarks/greedy_flips.py --out benchmarks/data/greedy_flips_after.json
"""

from __future__ import annotations

import harness  # first: this checkout's autotune on the path

import inspect
import json
import random
import subprocess
import time
from pathlib import Path
from typing import Any

from autotune.measure.validate import Tolerances, verdict

VOCAB = 1000
CELLS = {  # name -> (confident flips, near-tie flips, outside-top-5 flips)
    "identical": (0, 0, 0),
    "confident x1": (1, 0, 0), "confident x2": (2, 0, 0), "confident x4": (4, 0, 0),
    "outside x1": (0, 0, 1),
    "near-tie x1": (0, 1, 0), "near-tie x3": (0, 3, 0), "near-tie x8": (0, 8, 0),
    "mixed 3 near + 1 confident": (1, 3, 0),
}


def _baseline(rng: random.Random, n_req: int, n_tok: int) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    outputs, scores = [], {}
    for i in range(n_req):
        toks = [rng.randrange(VOCAB) for _ in range(n_tok)]
        lps, tops = [], []
        for t in toks:
            own = -rng.expovariate(5.0)  # the baseline's own token: mostly near 0 nats
            others = [x for x in rng.sample(range(VOCAB), 5) if x != t][:4]
            gaps = sorted(rng.expovariate(1 / 3.0) for _ in others)  # runner-up a margin below
            top = [[t, own]] + [[x, own - g - 0.5 * j] for j, (x, g) in enumerate(zip(others, gaps))]
            lps.append(round(own, 5))
            tops.append([[x, round(lp, 5)] for x, lp in top])
        rid = f"r{i}"
        outputs.append({"id": rid, "token_ids": toks, "text": " ".join(map(str, toks)), "finish_reason": "length",
                        "error": None, "chunks": n_tok})
        scores[rid] = {"token_ids": toks, "logprobs": lps, "top": tops}
    return outputs, scores


def _flip(rng: random.Random, out: dict[str, Any], score: dict[str, Any], kind: str) -> dict[str, Any]:
    """The candidate's record for one request, with a flip of ``kind`` planted (the baseline's
    scores at the flip are set so that its margin is what the kind says)."""
    toks, n = list(out["token_ids"]), len(out["token_ids"])
    pos = rng.randrange(int(0.7 * n), int(0.95 * n)) if kind != "near" else rng.randrange(n)
    own = score["logprobs"][pos]
    top = score["top"][pos]
    if kind == "outside":
        inside = {x for x, _ in top}
        new = next(x for x in (rng.randrange(VOCAB) for _ in iter(int, 1)) if x not in inside)
    else:
        margin = rng.uniform(1.0, 8.0) if kind == "confident" else rng.uniform(0.0, 0.2)
        new = top[1][0]
        top[1][1] = round(own - margin, 5)
    cont = [rng.randrange(VOCAB) for _ in range(n - pos - 1)]
    cand = toks[:pos] + [new] + cont
    return {**out, "token_ids": cand, "text": " ".join(map(str, cand))}


def one(cell: tuple[int, int, int], seed: int, n_req: int, n_tok: int) -> tuple[bool, str]:
    rng = random.Random(seed)
    base, scores = _baseline(rng, n_req, n_tok)
    conf, near, outside = cell
    kinds = ["confident"] * conf + ["near"] * near + ["outside"] * outside
    chosen = rng.sample(range(n_req), len(kinds))
    cand = [dict(o) for o in base]
    for i, kind in zip(chosen, kinds):
        cand[i] = _flip(rng, base[i], scores[base[i]["id"]], kind)
    reqs = [{"id": o["id"], "sampling": {"temperature": 0.0, "max_tokens": n_tok}, "expect": {}} for o in base]
    extra = {"dtype": "bfloat16"} if "dtype" in inspect.signature(verdict).parameters else {}
    v = verdict(reqs, cand, base, lossy=False, tol=Tolerances(), base_scores=scores, **extra)
    return not v.passed, v.reason


def main() -> None:
    ap = harness.parser(__doc__, out="greedy_flips_after.json")
    ap.add_argument("--seeds", type=int, default=200)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    t0 = time.perf_counter()
    rows = {}
    for name, cell in CELLS.items():
        results = [one(cell, 1000 * i + 7, args.requests, args.tokens) for i in range(args.seeds)]
        rejected = sum(r for r, _ in results)
        rows[name] = {"confident": cell[0], "near_tie": cell[1], "outside_top5": cell[2],
                      "rejected": rejected, "seeds": args.seeds, "rejected_rate": rejected / args.seeds,
                      "example_reason": next((why for r, why in results if r), results[0][1])}
        print(f"{name:<28} rejected {rejected:4d}/{args.seeds} ({rejected / args.seeds:6.1%})", flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip()
    harness.save(args.out, {"requests": args.requests, "tokens": args.tokens, "seeds": args.seeds,
                            "commit": commit, "seconds": round(time.perf_counter() - t0, 1), "cells": rows})


if __name__ == "__main__":
    main()
