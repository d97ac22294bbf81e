"""Benchmark: does the best speculative depth fall as more requests share a step? (not a test)

A depth schedule (``num_speculative_tokens_per_batch_size``) pays only where it does. For each depth
(0: no speculation) one engine, a worker as in a study, replays a json_edit-like set of edits (the
demo corpus, seeded, never trained on) closed loop at each concurrency level, ``--repeats`` windows
a level. Printed: output tok/s per depth and level (the median of the windows, and their spread),
each depth's ratio to the level's best with the 95% bootstrap interval over windows, and the best
depth per level.

All depths ran on engines of their own, so their ratios also carry the 8-13% by which one config's
throughput moves between engine instances on this machine (README, "Noise"): a best depth that
differs from another level's by less than that is no reason for a schedule.

    .venv/bin/python benchmarks/depth_by_load.py [--method ngram|draft_model] [--depths 0,2,5,10,16]
        [--levels 1,8,32,128,256] [--requests 256] [--repeats 2]
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

import harness
from autotune import demo
from autotune.core.candidate import Candidate, Settings
from autotune.measure.config import StudyConfig
from autotune.demo.corpus import examples
from autotune.run.evaluate import trial_job
from autotune.core.load import LoadPattern, parse_levels
from autotune.measure.metrics import measure_run
from autotune.run.worker import run_trial
from autotune.core.workload import load_workload

NGRAM_LOOKUP = {"prompt_lookup_min": 2, "prompt_lookup_max": 4}


def workload(path: Path, n: int, seed: int) -> Path:
    """``n`` edits of JSON records and configs, as examples/json_edit.jsonl is made."""
    rows = [{"id": f"edit-{i:03d}", "prompt": e.prompt, "max_tokens": 192, "temperature": 0.0}
            for i, e in enumerate(examples(n, seed=seed, domains=("json", "config")))]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def candidate(method: str, k: int) -> Candidate:
    if k == 0:
        return Candidate({"method": "none", "enforce_eager": True})
    extra = NGRAM_LOOKUP if method == "ngram" else {}
    return Candidate({"method": method, "num_speculative_tokens": k, **extra, "enforce_eager": True})


def main() -> None:
    ap = harness.parser(__doc__)
    ap.add_argument("--method", default="ngram", choices=("ngram", "draft_model"))
    ap.add_argument("--depths", default="0,2,5,10,16")
    ap.add_argument("--levels", default="1,8,32,128,256")
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--seed", type=int, default=9128)
    args = ap.parse_args()
    depths = [int(x) for x in args.depths.split(",")]
    levels = parse_levels(args.levels)
    root = Path(tempfile.mkdtemp(prefix="depth_by_load-"))
    wl = load_workload(workload(root / "edits.jsonl", args.requests, args.seed))
    loads = [LoadPattern("concurrency", concurrency=n) for n in levels]
    settings = Settings(model=str(demo.TARGET), draft_model=str(demo.DRAFT), dtype=demo.DTYPE,
                        max_model_len=demo.MAX_MODEL_LEN, gpu_memory_utilization=0.3)
    got: dict[int, dict[str, dict[str, Any]]] = {}  # depth -> level label -> that level's measurement
    t_all = time.monotonic()
    for k in depths:
        cand = candidate(args.method, k)
        cfg = StudyConfig(name="depth", results_dir=root, settings=settings, load=loads[0],
                          extra_loads=tuple(loads[1:]), repeats=args.repeats, max_repeats=args.repeats,
                          warmup=1, samples=0)
        t0 = time.monotonic()
        out = run_trial(trial_job(cand, wl, cfg), root / f"k{k}", timeout_s=1800)
        if out.raw is None:
            raise SystemExit(f"depth {k}: {out.failure}")
        runs = {loads[0].label: out.raw["windows"], **out.raw["levels"]}
        got[k] = {label: measure_run({"windows": w}) for label, w in runs.items()}
        print(f"ran {cand.label} in {time.monotonic() - t0:.0f} s", flush=True)
    print(f"\n{args.method} on {args.requests} json_edit-like requests (seed {args.seed}), {args.repeats} windows "
          f"a level, one engine a depth; all runs {time.monotonic() - t_all:.0f} s")
    print(f"{'level':<16}" + "".join(f"{'k=' + str(k):>22}" for k in depths) + f"{'best':>7}")
    for load in loads:
        at = {k: got[k][load.label] for k in depths}
        med = {k: at[k]["output_tok_s"] for k in depths}
        best = max(med, key=lambda k: med[k])
        cells = []
        for k in depths:
            lo, hi = harness.ratio_interval(at[k]["output_tok_s_windows"], at[best]["output_tok_s_windows"])
            cells.append(f"{med[k]:7.0f} {med[k] / med[best]:.2f} [{lo:.2f}-{hi:.2f}]")
        print(f"{load.label:<16}" + "".join(f"{c:>22}" for c in cells) + f"{best:>7}")


if __name__ == "__main__":
    main()
