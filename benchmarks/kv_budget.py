"""Benchmark: what the KV cache's size costs an engine's start on CPU, and what it does to speed.

vLLM's CPU worker takes ``--gpu-memory-utilization`` as a share of the host's RAM (autotune's CPU
default was 0.3) and zero-fills that much KV cache at every start. ``autotune search`` now sets
``--kv-cache-memory-bytes`` to what the study can hold in flight (autotune.core.kv_budget). This
starts the demo target's baseline config as a study's trial does (a fresh worker, ``vllm serve``
by default), alternating the two settings round by round (ABBA), and reports for each the
median ``engine_init_s`` (start to healthy) and output tok/s over the same requests, so the
saving is measured beside a check that the measured speed did not move beyond the noise.

    .venv/bin/python benchmarks/kv_budget.py [--rounds 3] [--out benchmarks/data/kv_budget.json]
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import harness
from autotune import demo
from autotune.core.candidate import Candidate, Settings
from autotune.core.kv_budget import kv_cache_bytes, most_in_flight
from autotune.core.load import LoadPattern
from autotune.core.workload import Workload, load_workload
from autotune.measure.config import StudyConfig
from autotune.measure.metrics import measure_run
from autotune.run.evaluate import trial_job
from autotune.run.worker import run_trial

BASE = {"method": "none", "enforce_eager": True}


def main() -> None:
    ap = harness.parser(__doc__, out="kv_budget.json")
    ap.add_argument("--workload", default="examples/json_edit.jsonl")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--instrument", default="served", choices=("served", "inprocess"))
    args = ap.parse_args()
    wl = load_workload(args.workload)
    wl = Workload(wl.path, wl.requests[:args.requests])
    load = LoadPattern(concurrency=1)
    sized = kv_cache_bytes([str(demo.TARGET), str(demo.DRAFT), str(demo.EAGLE3)], demo.MAX_MODEL_LEN,
                           most_in_flight([load], len(wl.requests), samples=64))
    base = Settings(model=str(demo.TARGET), max_model_len=demo.MAX_MODEL_LEN, dtype=demo.DTYPE)
    sides = {"share_0.3": replace(base, gpu_memory_utilization=0.3),  # the CPU default before
             "sized": replace(base, kv_cache_memory_bytes=sized)}  # autotune search's CPU default now
    tmp = Path(tempfile.mkdtemp(prefix="kv_budget-"))
    init: dict[str, list[float]] = {s: [] for s in sides}
    tok: dict[str, list[float]] = {s: [] for s in sides}
    t0 = time.time()
    for i in range(args.rounds):
        for side in (list(sides) if i % 2 == 0 else list(sides)[::-1]):
            cfg = StudyConfig(name="kv", results_dir=tmp, settings=sides[side], load=load, repeats=1, samples=0,
                              instrument=args.instrument, warmup=2)
            out = run_trial(trial_job(Candidate(BASE), wl, cfg), tmp / f"{i}-{side}", timeout_s=900)
            if out.raw is None:
                raise SystemExit(f"{side} round {i}: {out.failure}")
            init[side].append(out.raw["engine_init_s"])
            tok[side].append(measure_run(out.raw)["output_tok_s"])
            print(f"round {i + 1} {side}: start {init[side][-1]:.1f} s, {tok[side][-1]:.1f} tok/s", flush=True)
    med = {s: {"engine_init_s": statistics.median(init[s]), "output_tok_s": statistics.median(tok[s])} for s in sides}
    result = {
        "instrument": args.instrument, "rounds": args.rounds,
        "requests": len(wl.requests), "sized_bytes": sized, "engine_init_s": init, "output_tok_s": tok,
        "median": med,
        "start_ratio_sized_over_share": med["sized"]["engine_init_s"] / med["share_0.3"]["engine_init_s"],
        "start_saved_s": med["share_0.3"]["engine_init_s"] - med["sized"]["engine_init_s"],
        "tok_s_ratio_sized_over_share": med["sized"]["output_tok_s"] / med["share_0.3"]["output_tok_s"],
        "tok_s_spread_within": {s: harness.spread(tok[s]) for s in sides},
        "wall_s": round(time.time() - t0, 1),
    }
    harness.save(args.out, result, indent=2)
    print(json.dumps({k: result[k] for k in ("median", "start_ratio_sized_over_share", "start_saved_s",
                                             "tok_s_ratio_sized_over_share", "tok_s_spread_within")}, indent=2))


if __name__ == "__main__":
    main()
