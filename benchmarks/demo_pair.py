"""Benchmark: the demo pair on a workload, measured in one run (not a test).

Runs the baseline, ngram and draft_model candidates through the same worker path a study uses
(warm-up, then a measured window at concurrency 1) and prints output tok/s, the ratio to the
baseline, greedy agreement with the baseline, and vLLM's draft acceptance:

    .venv/bin/python benchmarks/demo_pair.py [examples/json_edit.jsonl] [--k 3]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from autotune import demo
from autotune.core.candidate import Candidate, Settings
from autotune.core.load import LoadPattern
from autotune.measure.config import StudyConfig
from autotune.run.evaluate import run_and_evaluate
from autotune.core.workload import load_workload


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("workload", nargs="?", default="examples/json_edit.jsonl")
    ap.add_argument("--k", type=int, default=3, help="num_speculative_tokens")
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=2, help="measured windows per candidate")
    ap.add_argument("--dtype", default=None, help="vLLM dtype (default: vLLM's auto)")
    args = ap.parse_args()
    wl = load_workload(args.workload)
    settings = Settings(model=str(demo.TARGET), draft_model=str(demo.DRAFT), max_model_len=demo.MAX_MODEL_LEN,
                        gpu_memory_utilization=0.3, dtype=args.dtype)
    cfg = StudyConfig(name="bench", results_dir=Path(tempfile.mkdtemp()), settings=settings,
                      load=LoadPattern(concurrency=args.concurrency), repeats=args.repeats,
                      trial_timeout_s=900)
    cands = [Candidate({"method": "none", "enforce_eager": True}),
             Candidate({"method": "ngram", "num_speculative_tokens": args.k, "prompt_lookup_max": 4,
                        "prompt_lookup_min": 2, "enforce_eager": True}),
             Candidate({"method": "draft_model", "num_speculative_tokens": args.k, "enforce_eager": True})]
    reference, base_tps = None, None
    print(f"workload {wl.path}: {len(wl.requests)} requests, concurrency {args.concurrency}")
    for c in cands:
        t0 = time.monotonic()
        out, ev = run_and_evaluate(c, wl, cfg, cfg.results_dir / c.method, reference=reference)
        if ev is None:
            print(f"{c.label:<32} FAILED: {out.failure}")
            continue
        m, v = ev.measurement, ev.verdict
        if reference is None:
            reference, base_tps = ev.reference, m["output_tok_s"]
        windows = " ".join(f"{x:.1f}" for x in m["output_tok_s_windows"])
        print(f"{c.label:<32} {m['output_tok_s']:7.1f} tok/s (windows {windows})  {m['output_tok_s'] / base_tps:5.2f}x  "
              f"e2e p50 {m['e2e_ms_p50']:6.0f} ms  engine init {m['engine_init_s']:5.1f} s  "
              f"acceptance {m['acceptance_rate']:.3f}  mean accepted length {m['mean_accepted_length']:.2f}  "
              f"greedy identical {v.greedy_identical}/{v.greedy_requests}  (trial wall {time.monotonic() - t0:.0f} s)")


if __name__ == "__main__":
    main()
