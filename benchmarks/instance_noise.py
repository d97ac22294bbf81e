"""Benchmark: how much fresh engine instances of one config differ (issue 24, item 2).

N fresh instances each of the baseline and of the demo's usual pick (ngram k=5 lookup 2..3),
interleaved (baseline, pick, pick, baseline, ...), each measured by the study's own harness
(a worker, warm-up, ``--windows`` windows of examples/json_edit.jsonl at concurrency 1) with the
chosen instrument. Prints each instance's median tok/s and, per config, the spread
(max - min) / median and the paired speedups; saves them to ``--out``:

    .venv/bin/python benchmarks/instance_noise.py [--instances 5] [--instrument served|inprocess]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autotune import demo, hardware  # noqa: E402
from autotune.candidate import Candidate, Settings  # noqa: E402
from autotune.config import StudyConfig  # noqa: E402
from autotune.evaluate import trial_job  # noqa: E402
from autotune.load import LoadPattern  # noqa: E402
from autotune.metrics import measure_run  # noqa: E402
from autotune.worker import run_trial  # noqa: E402
from autotune.workload import load_workload  # noqa: E402

PICK = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 2, "prompt_lookup_max": 3,
        "enforce_eager": True}
BASE = {"method": "none", "enforce_eager": True}


def spread(xs: list[float]) -> float:
    return (max(xs) - min(xs)) / statistics.median(xs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="examples/json_edit.jsonl")
    ap.add_argument("--instances", type=int, default=5)
    ap.add_argument("--windows", type=int, default=2)
    ap.add_argument("--instrument", default="served", choices=("served", "inprocess"))
    ap.add_argument("--out", default="benchmarks/data/instance_noise.json")
    args = ap.parse_args()
    wl = load_workload(args.workload)
    settings = Settings(model=str(demo.TARGET), max_model_len=demo.MAX_MODEL_LEN, dtype="float32",
                        gpu_memory_utilization=0.3)
    tmp = Path(tempfile.mkdtemp(prefix="instance_noise-"))
    cfg = StudyConfig(name="noise", results_dir=tmp, settings=settings, load=LoadPattern(concurrency=1),
                      repeats=args.windows, samples=0, instrument=args.instrument)
    sides = {"baseline": Candidate(BASE), "pick": Candidate(PICK)}
    tok: dict[str, list[float]] = {s: [] for s in sides}
    windows: dict[str, list[list[float]]] = {s: [] for s in sides}
    t0 = time.time()
    for i in range(args.instances):
        for side in (("baseline", "pick") if i % 2 == 0 else ("pick", "baseline")):  # ABBA
            out = run_trial(trial_job(sides[side], wl, cfg), tmp / f"{i}-{side}", timeout_s=1800)
            if out.raw is None:
                raise SystemExit(f"{side} instance {i} failed: {out.failure}")
            m = measure_run(out.raw)
            tok[side].append(m["output_tok_s"])
            windows[side].append(m["output_tok_s_windows"])
            print(f"instance {i} {side:<8} {m['output_tok_s']:7.1f} tok/s (windows "
                  f"{', '.join(f'{x:.1f}' for x in m['output_tok_s_windows'])}) at {time.time() - t0:.0f} s", flush=True)
    paired = [p / b for p, b in zip(tok["pick"], tok["baseline"])]
    summary = {s: {"median": statistics.median(v), "spread": spread(v)} for s, v in tok.items()}
    summary["speedup"] = {"paired": paired, "median": statistics.median(paired), "spread": spread(paired)}
    for s in sides:
        print(f"{s:<8} median {summary[s]['median']:.1f} tok/s, spread (max-min)/median {summary[s]['spread']:.1%} "
              f"over {args.instances} fresh instances")
    print(f"paired speedups {', '.join(f'{x:.2f}' for x in paired)}: median {summary['speedup']['median']:.2f}x, "
          f"spread {summary['speedup']['spread']:.1%}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"machine": hardware.describe(), "cpu_features": sorted(hardware.cpu_features()),
                                          "instrument": args.instrument, "instances": args.instances,
                                          "windows": args.windows, "tok_s": tok, "windows_tok_s": windows,
                                          "summary": summary}, indent=2) + "\n")
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
