"""Benchmark: false-alarm rate and power of the two-sample test on the Markov-chain model.

Uses the test the tool uses (autotune.measure.stats.sampler_test) on 3-token draws, where it is the first
token and the first three tokens jointly, Bonferroni (longer draws add a third feature for the
later tokens; faults that start after the 3rd token: benchmarks/late_fault.py). Prints, for
several sample sizes, how often exact speculative sampling is flagged (false alarms, should be
about alpha) and how often the broken variant that resamples from p after a rejection is caught
(power), over many seeds:

    .venv/bin/python benchmarks/false_alarm.py [--seeds 200] [--alpha 0.01]
"""

from __future__ import annotations

import numpy as np

import harness
from autotune.measure.stats import sampler_test
from tests.markov import speculative, target


def main() -> None:
    ap = harness.parser(__doc__)
    ap.add_argument("--seeds", type=int, default=200)
    ap.add_argument("--alpha", type=float, default=0.01)
    ap.add_argument("--prompts", type=int, default=2, help="independent tables combined in one test")
    args = ap.parse_args()
    print(f"alpha {args.alpha}, {args.prompts} prompts per test, {args.seeds} seeds per cell")
    for n in (100, 200, 400, 800, 1600):
        fa = power = 0
        for seed in range(args.seeds):
            rng = np.random.default_rng(seed)
            base = {i: target(rng, n) for i in range(args.prompts)}
            fa += sampler_test(base, {i: speculative(rng, n) for i in range(args.prompts)}, alpha=args.alpha)[0]
            rng = np.random.default_rng(10**6 + seed)
            base = {i: target(rng, n) for i in range(args.prompts)}
            power += sampler_test(base, {i: speculative(rng, n, broken=True) for i in range(args.prompts)},
                                  alpha=args.alpha)[0]
        print(f"n={n:5d} samples/side/prompt: false alarms {fa}/{args.seeds} ({fa / args.seeds:.1%}), "
              f"broken sampler caught {power}/{args.seeds} ({power / args.seeds:.1%})", flush=True)


if __name__ == "__main__":
    main()
