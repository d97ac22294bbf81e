"""Benchmark: false-alarm rate and power of the two-sample test on the Markov-chain model.

Uses the test the tool uses (autotune.measure.stats.sampler_test) on 3-token draws, where it is the first
token and the first three tokens jointly, Bonferroni (longer draws add a third feature for the
later tokens; faults that start after the 3rd token: benchmarks/late_fault.py). Prints, for
several sample sizes, how often exact speculative sampling is flagged (false alarms, should be
about alpha) and how often the broken variant that resamples from p after a rejection is caught
(power), over many seeds. Each line gives the exact test and, after "band", the verdict's test
since issue 43's sampled part (autotune.measure.sampled_band: the same features with the first
token and the first three allowed to move within bfloat16's numerics band at temperature 1, 0.25
nats per token; in float32 the two are the same test):

    .venv/bin/python benchmarks/false_alarm.py [--seeds 200] [--alpha 0.01] [--ns 100 200 400 800 1600]
"""

from __future__ import annotations

import numpy as np

import harness
from autotune.measure.nearties import dtype_threshold
from autotune.measure.sampled_band import judge_samples
from tests.markov import speculative, target


def main() -> None:
    ap = harness.parser(__doc__)
    ap.add_argument("--seeds", type=int, default=200)
    ap.add_argument("--alpha", type=float, default=0.01)
    ap.add_argument("--prompts", type=int, default=2, help="independent tables combined in one test")
    ap.add_argument("--ns", type=int, nargs="+", default=[100, 200, 400, 800, 1600])
    args = ap.parse_args()
    bf16 = dtype_threshold("bfloat16")

    def flags(base: dict, cand: dict) -> tuple[bool, bool]:  # (exact, within bfloat16's band at T=1)
        v = judge_samples(base, cand, {}, bf16, alpha=args.alpha)  # its p is sampler_test's
        return v.p < args.alpha, v.flagged
    print(f"alpha {args.alpha}, {args.prompts} prompts per test, {args.seeds} seeds per cell")
    for n in args.ns:
        fa, power = np.zeros(2, int), np.zeros(2, int)
        for seed in range(args.seeds):
            rng = np.random.default_rng(seed)
            base = {i: target(rng, n) for i in range(args.prompts)}
            fa += flags(base, {i: speculative(rng, n) for i in range(args.prompts)})
            rng = np.random.default_rng(10**6 + seed)
            base = {i: target(rng, n) for i in range(args.prompts)}
            power += flags(base, {i: speculative(rng, n, broken=True) for i in range(args.prompts)})
        print(f"n={n:5d} samples/side/prompt: false alarms {fa[0]}/{args.seeds} ({fa[0] / args.seeds:.1%}), "
              f"broken sampler caught {power[0]}/{args.seeds} ({power[0] / args.seeds:.1%}); band: false alarms "
              f"{fa[1]}/{args.seeds} ({fa[1] / args.seeds:.1%}), caught {power[1]}/{args.seeds} "
              f"({power[1] / args.seeds:.1%})", flush=True)


if __name__ == "__main__":
    main()
