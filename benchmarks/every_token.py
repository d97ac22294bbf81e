"""Benchmark: planted greedy faults against the every-token rule (issue 50), no engine.

A synthetic target over a 64-token vocabulary: the logits after a context (request, position, the two
tokens before) are a row of a fixed table, exact in float64, each row's top logit in [8, 24) nats and
its lead over the runner-up drawn so that 1.5% of positions lead by under 0.25 nats (between the
demo target's 0.8% and the under-trained one's 6.3%, benchmarks/data/near_ties.json). Each of the
three shapes a run computes in, decode (one token), prefill (teacher-forced scoring) and verify
(k+1 tokens), rounds the logits to bfloat16's grid after moving every logit of a row by a relative
N(0, 2^-9) at ``--moved`` of the rows (5%): numerics of bfloat16's size, where a near-tie flips
between shapes. A draft (the target plus N(0, 1) on every logit) proposes 3 tokens a step.

Per seed, ``--requests`` greedy requests of ``--tokens`` tokens (new contexts each seed): the
baseline decodes them, scores them teacher-forced and decodes a sample again with log-probs (its
numerics, autotune.measure.numerics); a candidate runs, and every output of it that differs is
scored teacher-forced; autotune.measure.validate.verdict (the study's own function) judges it.
Cells (the positions each fault may act at are a random window of every request, per seed):

    numerics        exact speculative decoding (verify shape): lossless up to numerics
    junk            one request flips to its runner-up at a near-tie (lead under 0.25 nats, one of
                    those in the window at random) and emits random tokens after it
    accept_m        acceptance accepts a draft whose log-prob is within m nats of the top token
                    (m = 0.05, 0.1, 0.25, 0.5, 1)
    every_N         a correct decode that emits its runner-up at one token in N (random phase)

Every differing output of the speculative cells (numerics, accept_m) is also decoded again with
speculation and log-probs, as autotune.run.replay.score_own does where the engine can: vLLM takes a
speculative step's log-probs from the verifying target's raw logits, apart from the acceptance, so the
target's own rank of each emitted token shows a draft accepted under the top at any margin
(autotune.measure.every_token.own_rank_fault). The junk and every-N cells stand for wrong logits,
whose own log-probs would rank the wrong tokens first: they are judged on the teacher-forced scores.

For each cell: the seeds where the fault changed an output (an acceptance fault: it passed a draft
strictly under the top in an output that differs from the baseline's; below bfloat16's step a "near
tie" is an exact tie, and a tied token is a top token; and where the passed draft is the token the
baseline's own decode chose, no output changed), and among those the share the verdict
rejected (for numerics: the share rejected of all seeds), and the share the teacher-forced scores
alone rejected (the rule without the own decode). Saved to ``--out``:

    .venv/bin/python benchmarks/every_token.py --out benchmarks/data/every_token.json
"""

from __future__ import annotations

import harness  # first: this checkout's autotune on the path

import math
import time
from typing import Any

import numpy as np

from autotune.measure.numerics import measure_numerics
from autotune.measure.validate import Tolerances, verdict

V, ROWS, K, TOP = 64, 1 << 15, 3, 5
SHAPES = ("decode", "prefill", "verify")
CELLS: dict[str, tuple[str, float]] = {"numerics": ("spec", 0.0), "junk": ("junk", 0.0),
                                       **{f"accept_{m:g}": ("spec", m) for m in (0.05, 0.1, 0.25, 0.5, 1.0)},
                                       **{f"every_{n}": ("every", float(n)) for n in (16, 64)}}


def bf16(x: np.ndarray) -> np.ndarray:
    """Round to bfloat16's grid (8 significand bits), as a float64 array."""
    m, e = np.frexp(x)
    return np.ldexp(np.round(m * 256.0) / 256.0, e)


class Model:
    """The synthetic target, its shapes' numerics and its draft: a table of logit rows, indexed by context."""

    def __init__(self, moved: float, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        top = rng.uniform(8.0, 24.0, ROWS)
        lead = np.where(rng.random(ROWS) < 0.03, rng.uniform(0.0, 0.5, ROWS), 1.0 + rng.exponential(4.0, ROWS))
        rest = top[:, None] - lead[:, None] - 0.5 - rng.exponential(3.0, (ROWS, V - 2))
        exact = np.concatenate([top[:, None], (top - lead)[:, None], rest], axis=1)
        for row in exact:  # token ids at random
            rng.shuffle(row)
        self.exact = exact
        self.shaped = {}
        for s in SHAPES:
            eps = rng.normal(0.0, 2.0 ** -9, (ROWS, V)) * (rng.random(ROWS) < moved)[:, None]
            self.shaped[s] = bf16(exact * (1.0 + eps))
        self.draft = exact + rng.normal(0.0, 1.0, (ROWS, V))

    @staticmethod
    def row(req: int, pos: int, path: list[int]) -> int:
        return hash((req, pos, path[-1] if path else -1, path[-2] if len(path) > 1 else -1)) % ROWS

    def logprobs(self, shape: str, req: int, pos: int, path: list[int]) -> np.ndarray:
        z = self.shaped[shape][self.row(req, pos, path)]
        return z - (z.max() + math.log(np.exp(z - z.max()).sum()))


def _record(rid: str, toks: list[int]) -> dict[str, Any]:
    return {"id": rid, "token_ids": toks, "text": "", "finish_reason": "length", "chunks": 1, "error": None}


def _scored(lps: list[np.ndarray], path: list[int]) -> dict[str, Any]:
    """Scores as autotune.run.replay keeps them: each path token's log-prob and the top 5."""
    tops = [np.argsort(-lp, kind="stable")[:TOP] for lp in lps]
    return {"token_ids": path, "logprobs": [round(float(lp[t]), 5) for lp, t in zip(lps, path)],
            "top": [[[int(t), round(float(lp[t]), 5)] for t in top] for lp, top in zip(lps, tops)]}


def score(model: Model, shape: str, req: int, path: list[int]) -> dict[str, Any]:
    return _scored([model.logprobs(shape, req, i, path[:i]) for i in range(len(path))], path)


def greedy(model: Model, req: int, n: int, wrong: set[int] = frozenset()) -> list[int]:
    """Greedy decode, the runner-up at positions ``wrong``."""
    path: list[int] = []
    for i in range(n):
        order = np.argsort(-model.logprobs("decode", req, i, path), kind="stable")
        path.append(int(order[1] if i in wrong else order[0]))
    return path


def speculate(model: Model, req: int, n: int, accept: float, window: tuple[int, int],
              lps: list[np.ndarray] | None = None, acted: list[float] | None = None) -> list[int]:
    """Speculative greedy decoding in the verify shape: K drafts a step, each accepted where it is the
    target's top token, or (the fault, inside ``window``) within ``accept`` nats of it. ``lps``: filled
    with the verify pass's log-probs at each emitted token, as vLLM returns a speculative decode's
    log-probs (from the target's raw logits, apart from the acceptance); ``acted``: filled with the
    margin of each draft the fault accepted strictly under the top (an exact tie is a top token too)."""
    path: list[int] = []
    while len(path) < n:
        drafts: list[int] = []
        for j in range(K):
            ctx = path + drafts
            drafts.append(int(np.argmax(model.draft[model.row(req, len(ctx), ctx)])))
        for j in range(K + 1):
            ctx = path[:]
            lp = model.logprobs("verify", req, len(ctx), ctx)
            best = int(np.argmax(lp))
            d = drafts[j] if j < K else None
            faulty = d is not None and window[0] <= len(ctx) < window[1] and lp[best] - lp[d] < accept
            path.append(d if d is not None and (d == best or faulty) else best)
            if acted is not None and d is not None and d != best and faulty and lp[best] > lp[d]:
                acted.append(float(lp[best] - lp[d]))
            if lps is not None:
                lps.append(lp)
            if len(path) >= n or d is None or path[-1] != d:
                break
    return path[:n]


def one(model: Model, cell: tuple[str, float], seed: int, n_req: int, n_tok: int) -> tuple[bool, bool, str, bool]:
    """(the fault changed an output, the verdict rejected the candidate, its reason, the verdict on the
    teacher-forced scores alone rejected it) for one seed."""
    rng = np.random.default_rng(seed)
    kind, x = cell
    reqs_k = [int(k) for k in rng.integers(0, 1 << 40, n_req)]  # the prompts: new contexts each seed
    lo = int(rng.integers(0, n_tok // 2))
    window = (lo, lo + int(rng.integers(n_tok // 4, n_tok)))  # where the fault may act
    base = [greedy(model, k, n_tok) for k in reqs_k]
    scores = {f"r{i}": score(model, "prefill", k, p) for i, (k, p) in enumerate(zip(reqs_k, base))}
    decode = {f"r{i}": score(model, "decode", k, p) for i, (k, p) in enumerate(zip(reqs_k[:64], base))}
    numerics = measure_numerics("bfloat16", scores, decode)
    acted: list[list[float]] = [[] for _ in reqs_k]  # per request: the drafts the fault passed under the top
    if kind == "spec":
        cand = [speculate(model, k, n_tok, x, window, acted=a) for k, a in zip(reqs_k, acted)]
    elif kind == "every":
        phase = int(rng.integers(0, int(x)))
        cand = [greedy(model, k, n_tok, {i for i in range(*window) if i % int(x) == phase}) for k in reqs_k]
    else:  # junk: a flip at a near-tie in the window, random tokens after it
        near = [(i, p) for i, s in enumerate(scores.values()) for p in range(*window)
                if p < n_tok and (lps := sorted((lp for _, lp in s["top"][p]), reverse=True))[0] - lps[1] < 0.25]
        cand = [list(p) for p in base]
        if near:
            i, p = near[int(rng.integers(0, len(near)))]
            runner = next(t for t, _ in scores[f"r{i}"]["top"][p] if t != base[i][p])
            cand[i] = base[i][:p] + [int(runner)] + [int(t) for t in rng.integers(0, V, n_tok - p - 1)]
    own = {f"r{i}": score(model, "prefill", k, c) for i, (k, c, b) in enumerate(zip(reqs_k, cand, base)) if c != b}
    reqs = [{"id": f"r{i}", "sampling": {"temperature": 0.0, "max_tokens": n_tok}, "expect": {}} for i in range(n_req)]

    def judged(own_scores: dict[str, Any]) -> Any:
        return verdict(reqs, [_record(f"r{i}", c) for i, c in enumerate(cand)],
                       [_record(f"r{i}", b) for i, b in enumerate(base)], lossy=False, tol=Tolerances(),
                       base_scores=scores, own_scores=own_scores, numerics=numerics, threshold=numerics.threshold)
    alone = judged(own)
    if kind == "spec":  # each differing output decoded again, speculation on, log-probs asked (autotune.run.replay.score_own)
        for rid in own:
            lps: list[np.ndarray] = []
            path = speculate(model, reqs_k[int(rid[1:])], n_tok, x, window, lps)
            own[rid] = {**own[rid], "decoded": _scored(lps, path)}
        v = judged(own)
    else:  # the junk and every-N faults stand for wrong logits, whose own log-probs rank the wrong token first
        v = alone
    if kind == "spec" and x > 0:  # the fault changed an output: it passed a draft under the top in an output
        # that differs from the baseline's (where its token is the baseline's own, nothing changed for a user)
        changed = any(a and c != b for a, c, b in zip(acted, cand, base))
    else:
        changed = cand != base
    return changed, not v.passed, v.reason, not alone.passed


def main() -> None:
    ap = harness.parser(__doc__, out="every_token.json")
    ap.add_argument("--seeds", type=int, default=200)
    ap.add_argument("--numerics-seeds", type=int, default=500, help="seeds of the numerics cell (its false alarms)")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--moved", type=float, default=0.05, help="share of logit rows a shape moves")
    ap.add_argument("--cells", default=",".join(CELLS))
    args = ap.parse_args()
    t0 = time.perf_counter()
    model = Model(args.moved)
    rows: dict[str, Any] = {}
    for name in args.cells.split(","):
        seeds = args.numerics_seeds if name == "numerics" else args.seeds
        res = [one(model, CELLS[name], 7919 * s + 13, args.requests, args.tokens) for s in range(seeds)]
        changed = [r for r in res if r[0]]
        caught = sum(r[1] for r in changed)
        scores_only = sum(r[3] for r in changed)
        rows[name] = {"seeds": seeds, "changed": len(changed), "changed_share": len(changed) / seeds,
                      "caught": caught, "caught_share": caught / len(changed) if changed else None,
                      "caught_scores_only": scores_only,
                      "caught_scores_only_share": scores_only / len(changed) if changed else None,
                      "rejected": sum(r[1] for r in res), "rejected_share": sum(r[1] for r in res) / seeds,
                      "example_reason": next((r[2] for r in res if r[1]), res[0][2])[:600]}
        share = f"{rows[name]['caught_share']:.1%}" if changed else "-"
        print(f"{name:<12} changed {len(changed):4d}/{seeds}  caught {caught:4d} ({share}; "
              f"scores alone {scores_only})  rejected {rows[name]['rejected']}/{seeds}", flush=True)
        harness.save(args.out, {"seeds": args.seeds, "numerics_seeds": args.numerics_seeds, "requests": args.requests, "tokens": args.tokens,
                                "moved": args.moved, "seconds": round(time.perf_counter() - t0, 1),
                                "numerics": _numerics_example(model, args), "cells": rows})


def _numerics_example(model: Model, args: Any) -> dict[str, Any]:
    """The threshold and drift one seed's baseline measures (the model's numerics, for the record)."""
    rng = np.random.default_rng(1)
    keys = [int(k) for k in rng.integers(0, 1 << 40, args.requests)]
    base = [greedy(model, k, args.tokens) for k in keys]
    scores = {f"r{i}": score(model, "prefill", k, p) for i, (k, p) in enumerate(zip(keys, base))}
    decode = {f"r{i}": score(model, "decode", k, p) for i, (k, p) in enumerate(zip(keys, base))}
    n = measure_numerics("bfloat16", scores, decode)
    leads = [s["top"][i][0][1] - s["top"][i][1][1] for s in scores.values() for i in range(len(s["token_ids"]))]
    return {"threshold": n.threshold.value, "source": n.threshold.source, "scale": n.scale,
            "drift_max": n.drift.max if n.drift else None, "drift_p99": n.drift.p99 if n.drift else None,
            "leads_below_0.25": sum(x < 0.25 for x in leads) / len(leads)}


if __name__ == "__main__":
    main()
