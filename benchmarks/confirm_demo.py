"""Benchmark: a study's claimed (in-process) speedup against the served one (`vllm serve` + `vllm bench serve`).

Reads a results folder from `autotune search` (default results/demo), runs `autotune.gate.confirm` on
it (alternating fresh baseline and pick servers, ROUNDS a side) and prints each round, the served
speedup with its interval over rounds, and the claim beside it:

    .venv/bin/python benchmarks/confirm_demo.py [results/demo] [--rounds 3] [--warmups 3]

Make a study first, e.g. `bash scripts/demo.sh` (results/demo), or a shorter one:
`.venv/bin/autotune search examples/json_edit.jsonl --space quick --trials 4 --study demo`.
"""

from __future__ import annotations

import argparse
import time

from autotune.gate.confirm import confirm
from autotune.serve.served import served_line
from autotune.core.study_report import load_report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="?", default="results/demo")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmups", type=int, default=3)
    ap.add_argument("--workload", default=None, help="default: the study's own workload")
    args = ap.parse_args()
    t0 = time.monotonic()
    served = confirm(args.results, rounds=args.rounds, warmups=args.warmups, workload=args.workload,
                     say=lambda line: print(line, flush=True))
    report = load_report(args.results)
    b = report["best"]
    print(f"pick: {b['label']} on {report['workload']} ({report['load']}), {time.monotonic() - t0:.0f} s")
    for i, (base, pick) in enumerate(zip(served["baseline_output_tok_s"], served["pick_output_tok_s"]), start=1):
        print(f"  round {i}: baseline {base:6.1f} tok/s, pick {pick:6.1f} tok/s, ratio {pick / base:.2f}x")
    for side in ("baseline", "pick"):
        s = served[side]
        print(f"  {side:<8} median {s['output_tok_s']:.1f} tok/s, tpot p50 {s['tpot_ms_p50']:.1f} ms, "
              f"ttft p50 {s['ttft_ms_p50']:.1f} ms")
    print(served_line(report))


if __name__ == "__main__":
    main()
