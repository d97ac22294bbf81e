"""Benchmark: the noise floor of the greedy correctness checks (not a test).

What sets ``--lossless-tolerance`` and ``--max-logprob-drift``: how far outputs move for reasons
that are not faults. Each run below is a worker as in a study (warm-up, one measured window,
then the teacher-forced scoring pass of autotune.run.replay.score_greedy); every candidate scores the
reference's greedy tokens, so log-prob drifts compare the same token paths.

    reference    baseline (no speculation), the study's dtype, concurrency 1
    second       the same baseline in a second engine            (run to run)
    conc4        the same baseline at concurrency 4               (batching changes numerics)
    ngram        ngram k=3, lookup 2..4                            (speculation: lossless)
    draft_model  draft_model k=3                                   (speculation: lossless)
    bf16         baseline with dtype bfloat16                      (a lossy dtype)
    int8         int8 weight-only with dtype bfloat16              (lossy), against bf16 and reference
    bf16_conc4   bf16 at concurrency 4, against bf16               (batching, in bfloat16)
    bf16_ngram   ngram k=3 in bf16, against bf16                   (speculation, in bfloat16)

    .venv/bin/python benchmarks/noise_floor.py [examples/json_edit.jsonl] [--dtype float32] [--runs a,b,...]
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import harness
from autotune import demo
from autotune.core.candidate import Candidate, Settings
from autotune.core.load import LoadPattern
from autotune.measure.config import StudyConfig
from autotune.run.evaluate import trial_job
from autotune.measure.validate import Tolerances, verdict
from autotune.run.worker import run_trial
from autotune.core.workload import load_workload

EAGER = {"enforce_eager": True}
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
RUNS: dict[str, tuple[dict[str, Any], int]] = {  # name -> (candidate params, concurrency)
    "reference": ({"method": "none"}, 1),
    "second": ({"method": "none"}, 1),
    "conc4": ({"method": "none"}, 4),
    "ngram": (NGRAM, 1),
    "draft_model": ({"method": "draft_model", "num_speculative_tokens": 3}, 1),
    "bf16": ({"method": "none", "dtype": "bfloat16"}, 1),
    "int8": ({"method": "none", "dtype": "bfloat16", "quantization": "int8_per_channel_weight_only"}, 1),
    "bf16_conc4": ({"method": "none", "dtype": "bfloat16"}, 4),
    "bf16_ngram": ({**NGRAM, "dtype": "bfloat16"}, 1),
}
# (candidate, against): what each printed row compares.
ROWS = [("second", "reference"), ("conc4", "reference"), ("ngram", "reference"), ("draft_model", "reference"),
        ("bf16", "reference"), ("int8", "bf16"), ("int8", "reference"), ("bf16_conc4", "bf16"),
        ("bf16_ngram", "bf16")]


def main() -> None:
    ap = harness.parser(__doc__)
    ap.add_argument("workload", nargs="?", default="examples/json_edit.jsonl")
    ap.add_argument("--dtype", default=demo.DTYPE, help="the reference's dtype (the demo pair: float32)")
    ap.add_argument("--runs", default=",".join(RUNS), help="which runs (the reference always runs first)")
    args = ap.parse_args()
    chosen = ["reference"] + [n for n in args.runs.split(",") if n in RUNS and n != "reference"]
    wl = load_workload(args.workload)
    root = Path(tempfile.mkdtemp(prefix="noise_floor-"))
    settings = Settings(model=str(demo.TARGET), draft_model=str(demo.DRAFT), dtype=args.dtype,
                        max_model_len=demo.MAX_MODEL_LEN, gpu_memory_utilization=0.3)
    runs: dict[str, dict[str, Any]] = {}  # name -> {"records", "scores", "lossy"}
    reference: dict[str, list[int]] | None = None
    t_all = time.monotonic()
    for name in chosen:
        params, concurrency = RUNS[name]
        cand = Candidate({**params, **EAGER})
        cfg = StudyConfig(name="noise", results_dir=root, settings=settings, load=LoadPattern(concurrency=concurrency),
                          repeats=1, samples=0)
        job = trial_job(cand, wl, cfg)
        if reference is not None:
            job["reference"] = reference  # every run scores the reference's greedy tokens
        t0 = time.monotonic()
        out = run_trial(job, root / name, timeout_s=900)
        if out.raw is None:
            raise SystemExit(f"{name}: {out.failure}")
        recs, reqs = out.raw["windows"][0]["requests"], job["requests"]
        errors = [s["error"] for s in out.raw["scores"].values() if "error" in s]
        print(f"ran {name:<12} ({cand.label}, concurrency {concurrency}) in {time.monotonic() - t0:.0f} s"
              + (f"; scoring errors: {errors[0]}" if errors else ""), flush=True)
        runs[name] = {"records": recs, "scores": out.raw["scores"], "lossy": cand.lossy}
        if reference is None:
            reference = {r["id"]: r["token_ids"] for r, q in zip(recs, job["requests"])
                         if q["sampling"]["temperature"] == 0}
    print(f"\nworkload {wl.path}: {len(reqs)} requests, reference dtype {args.dtype}; "
          f"all runs {time.monotonic() - t_all:.0f} s")
    print(f"{'candidate':<12} {'against':<10} {'identical':>9} {'agreement':>9} {'first div':>9} "
          f"{'drift mean':>10} {'drift max':>9} {'top-k KL':>9} {'tokens':>6}")
    for cand_name, base_name in [r for r in ROWS if r[0] in runs and r[1] in runs]:
        c, b = runs[cand_name], runs[base_name]
        v = verdict(reqs, c["records"], b["records"], lossy=c["lossy"], tol=Tolerances(),
                    scores=c["scores"], base_scores=b["scores"])
        drift = "-" if v.logprob_drift is None else f"{v.logprob_drift:.2e}"
        dmax = "-" if v.logprob_drift_max is None else f"{v.logprob_drift_max:.2e}"
        kl = "-" if v.logprob_kl is None else f"{v.logprob_kl:.2e}"
        print(f"{cand_name:<12} {base_name:<10} {v.greedy_identical:>4}/{v.greedy_requests:<4} "
              f"{v.token_agreement:>9.4f} {str(v.first_divergence):>9} {drift:>10} {dmax:>9} {kl:>9} "
              f"{v.logprob_tokens:>6}")


if __name__ == "__main__":
    main()
