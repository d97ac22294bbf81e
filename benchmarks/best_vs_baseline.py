"""Benchmark: the best found config against the baseline, and the same candidate measured twice.

Reads a study's best.json (default results/demo), then in one run, each in its own worker:
baseline, best, best again. Prints (a) best's output tok/s as a ratio to the baseline's and
(b) the spread between the two measurements of best (and each run's window-to-window MAD):

    .venv/bin/python benchmarks/best_vs_baseline.py [results/demo] [--workload examples/json_edit.jsonl]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from autotune.core.candidate import Candidate, Settings
from autotune.core.load import LoadPattern
from autotune.measure.metrics import measure_run
from autotune.core.study_report import load_report
from autotune.measure.config import StudyConfig
from autotune.run.evaluate import trial_job
from autotune.run.worker import run_trial
from autotune.core.workload import load_workload


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="?", default="results/demo")
    ap.add_argument("--workload", default=None, help="default: the study's own workload")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    report = load_report(args.results)
    kw = dict(report["best"]["engine_kwargs"])
    settings = Settings(model=kw.pop("model"), dtype=kw.pop("dtype", None), max_model_len=kw.pop("max_model_len", None),
                        gpu_memory_utilization=kw.pop("gpu_memory_utilization", None),
                        kv_cache_memory_bytes=kw.pop("kv_cache_memory_bytes", None), seed=kw.pop("seed", 0),
                        draft_model=(kw.get("speculative_config") or {}).get("model"))
    wl = load_workload(args.workload or report["workload"])
    conc = report.get("concurrency") or 1
    cfg = StudyConfig(name="bench", results_dir=Path(tempfile.mkdtemp()), settings=settings,
                      load=LoadPattern(concurrency=conc), repeats=args.repeats, samples=0)
    base = Candidate(report["baseline"]["candidate"])
    best = Candidate(report["best"]["candidate"])
    runs = {}
    for name, cand in (("baseline", base), ("best #1", best), ("best #2", best)):
        out = run_trial(trial_job(cand, wl, cfg), cfg.results_dir / name.replace(" #", ""), timeout_s=1800)
        if out.raw is None:
            raise SystemExit(f"{name} failed: {out.failure}")
        m = measure_run(out.raw)
        runs[name] = m
        print(f"{name:<9} {cand.label:<36} {m['output_tok_s']:7.1f} tok/s  window MAD {m['output_tok_s_mad']:.2f} "
              f"({m['output_tok_s_mad'] / m['output_tok_s']:.1%})  acceptance {m['acceptance_rate']:.3f}", flush=True)
    b1, b2, b0 = runs["best #1"]["output_tok_s"], runs["best #2"]["output_tok_s"], runs["baseline"]["output_tok_s"]
    print(f"(a) best / baseline output tok/s at concurrency {conc} on {wl.path}: {b1 / b0:.2f}x "
          f"(second measurement {b2 / b0:.2f}x)")
    print(f"(b) same candidate measured twice: {b1:.1f} vs {b2:.1f} tok/s, differ by {abs(b1 - b2) / min(b1, b2):.1%}")


if __name__ == "__main__":
    main()
