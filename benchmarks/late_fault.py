"""Benchmark: faults that start after the first 3 tokens (issue 16), on the Markov-chain model.

Each test: ``--prompts`` requests, n draws per side per request of ``--length`` tokens; the
baseline samples the target chain P directly, the candidate runs speculative sampling (draft Q,
k=2), exact or with a fault from the 4th token on (tests/markov.py, LATE_FAULTS): temperature
0.7 or 1.4, top-p 0.8, or the broken residual rule (resample from p after a rejection). Prints,
over ``--seeds`` seeds per cell, how often each test flags (false alarms for "exact", power for
the faults), for

    old   autotune.measure.stats.sampler_test on the first 3 tokens only (the test before issue 16)
    new   autotune.measure.stats.sampler_test on the whole draw (first token, first 3 jointly, and the
          later tokens and (previous, next) token pairs pooled over positions, Hotelling's T^2;
          Bonferroni over the 3)
    pos   comparison only: first token, first 3 jointly, and a chi-square on each later
          position's marginal, Bonferroni over all 2 + (length - 3)
    pit   comparison only, needs the known P: every candidate token's randomized probability
          integral transform under P (states in decreasing probability), pooled over all
          positions and requests, Kolmogorov-Smirnov against uniform; the baseline's draws are
          not used. Exact under the null (the transforms are i.i.d. uniform).

    band  the verdict's test since issue 43's sampled part (autotune.measure.sampled_band): "new" with
          the first-token and first-3 tables allowed to move within bfloat16's numerics band at
          temperature 1 (0.25 nats per token); the later tokens stay on the exact test

and then the new test's power against draw length at one n. Run:

    .venv/bin/python benchmarks/late_fault.py [--seeds 200] [--alpha 0.01] [--ns 100 200 400]
        [--conditions exact residual] [--variants new band] [--sweep-n 0]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from scipy.stats import kstest

import harness
from autotune.measure.nearties import dtype_threshold
from autotune.measure.sampled_band import judge_samples
from autotune.measure.stats import HEAD_TOKENS, sampler_test, two_sample_test
from tests.markov import LATE_FAULTS, P, START, late_fault, target_batch

CONDITIONS = ["exact", *LATE_FAULTS]
VARIANTS = ("old", "new", "pos", "pit", "band")
BF16 = dtype_threshold("bfloat16")

# Randomized PIT under P: states of each row in decreasing probability; a token's transform is the
# mass of the states before it plus a uniform share of its own.
_ORDER = np.argsort(-P, axis=1, kind="stable")
_RANK = np.argsort(_ORDER, axis=1)
_BELOW = np.take_along_axis(np.cumsum(np.take_along_axis(P, _ORDER, axis=1), axis=1) -
                            np.take_along_axis(P, _ORDER, axis=1), _RANK, axis=1)


def pit_test(cand: dict[int, list[tuple[int, ...]]], rng: np.random.Generator) -> float:
    x = np.array([d for draws in cand.values() for d in draws])
    prev = np.concatenate([np.full((len(x), 1), START), x[:, :-1]], axis=1)
    u = _BELOW[prev, x] + rng.random(x.shape) * P[prev, x]
    return float(kstest(u.ravel(), "uniform").pvalue)


def positions_test(base: dict, cand: dict, alpha: float, head: int = HEAD_TOKENS) -> bool:
    keys = list(cand)
    length = max(len(d) for k in keys for d in cand[k])
    feats = [lambda d: d[:1], lambda d: d[:head]] + [lambda d, t=t: d[t:t + 1] for t in range(head, length)]
    ps = [two_sample_test([([f(d) for d in base[k]], [f(d) for d in cand[k]]) for k in keys]).p_value
          for f in feats]
    return len(ps) * min(ps) < alpha


def one(n: int, cond: str, seed: int, args: argparse.Namespace, length: int,
        variants: tuple[str, ...]) -> dict[str, bool]:
    rng = np.random.default_rng([n, length, CONDITIONS.index(cond), seed])
    base = {i: target_batch(rng, n, length) for i in range(args.prompts)}
    cand = {i: late_fault(rng, n, cond, length) for i in range(args.prompts)}
    out = {}
    if "old" in variants:
        cut = lambda s: {k: [d[:HEAD_TOKENS] for d in v] for k, v in s.items()}  # noqa: E731
        out["old"] = sampler_test(cut(base), cut(cand), alpha=args.alpha)[0]
    if "new" in variants:
        out["new"] = sampler_test(base, cand, alpha=args.alpha)[0]
    if "pos" in variants:
        out["pos"] = positions_test(base, cand, args.alpha)
    if "band" in variants:
        out["band"] = judge_samples(base, cand, {}, BF16, alpha=args.alpha).flagged  # {}: temperature 1
    if "pit" in variants:
        out["pit"] = pit_test(cand, rng) < args.alpha
    return out


def main() -> None:
    ap = harness.parser(__doc__)
    ap.add_argument("--seeds", type=int, default=200)
    ap.add_argument("--alpha", type=float, default=0.01)
    ap.add_argument("--prompts", type=int, default=2, help="independent requests combined in one test")
    ap.add_argument("--length", type=int, default=12, help="tokens per draw")
    ap.add_argument("--ns", type=int, nargs="+", default=[100, 200, 400], help="draws per side per request")
    ap.add_argument("--sweep-n", type=int, default=200, help="n for the power-against-length table (0: skip)")
    ap.add_argument("--sweep-lengths", type=int, nargs="+", default=[4, 6, 8, 16])
    ap.add_argument("--conditions", nargs="+", choices=CONDITIONS, default=CONDITIONS)
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=["old", "new", "pos", "pit"])
    args = ap.parse_args()
    t0 = time.perf_counter()
    variants = tuple(args.variants)
    print(f"alpha {args.alpha}, {args.prompts} prompts per test, {args.length} tokens per draw, "
          f"fault from token {HEAD_TOKENS + 1} on, {args.seeds} seeds per cell; flagged/seeds")
    print(f"{'n':>5} {'sampler':<16}" + "".join(f"{v:>7}" for v in variants))
    for n in args.ns:
        for cond in args.conditions:
            hits = dict.fromkeys(variants, 0)
            for seed in range(args.seeds):
                for v, f in one(n, cond, seed, args, args.length, variants).items():
                    hits[v] += f
            print(f"{n:5d} {cond:<16}" + "".join(f"{100 * hits[v] / args.seeds:6.1f}%" for v in variants),
                  flush=True)
    if args.sweep_n:
        lengths = sorted({*args.sweep_lengths, args.length})
        print(f"\nnew test, n={args.sweep_n}: flagged/seeds against tokens per draw")
        print(f"{'sampler':<16}" + "".join(f"{'L=' + str(L):>7}" for L in lengths))
        for cond in args.conditions:
            row = []
            for L in lengths:
                row.append(sum(one(args.sweep_n, cond, seed, args, L, ("new",))["new"]
                               for seed in range(args.seeds)))
            print(f"{cond:<16}" + "".join(f"{100 * h / args.seeds:6.1f}%" for h in row), flush=True)
    print(f"\n{time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
