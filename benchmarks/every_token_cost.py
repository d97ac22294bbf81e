"""Benchmark: what judging every token costs on the real engine (issue 50), the demo pair.

Two workers as in a study (warm-up, one measured window, the demo's concurrency 1), on the first
``--requests`` edits of examples/json_edit.jsonl in ``--dtype``:

    baseline   its scoring pass (every greedy output teacher-forced, as before) and the new drift
               pass (its greedy requests decoded again with their top log-probs,
               autotune.run.replay.decode_drift), against its measured window
    candidate  ngram k=3, made to score every greedy output of its own (as if each differed from the
               baseline's: autotune.run.replay.score_own) and decode it again with log-probs (the
               target's own ranks, phase decode_own), against its measured window, and the
               baseline's outputs too (the same paths, the pass a lossy config runs), in the same engine

Each phase's seconds come from the worker's own events (autotune.run.worker). Per output: the
extra prefill against the output's decode in the measured window. The baseline's numerics (the
threshold and the drift it measured, autotune.measure.numerics) are kept too: ``--dtype bfloat16
--out benchmarks/data/every_token_cost_bf16.json`` for the demo in bfloat16. Saved to ``--out``
(benchmarks/data/every_token_cost.json). Engines: run it under the engine lock.

    flock /tmp/autotune-engine.lock .venv/bin/python benchmarks/every_token_cost.py
"""

from __future__ import annotations

import harness  # first: this checkout's autotune on the path

import tempfile
from pathlib import Path
from typing import Any

from autotune import demo
from autotune.core.candidate import Candidate, Settings
from autotune.core.workload import load_workload
from autotune.measure.config import StudyConfig
from autotune.measure.numerics import measure_numerics
from autotune.run.evaluate import trial_job
from autotune.run.worker import run_trial

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2}


def phases(events: list[dict[str, Any]]) -> dict[str, float]:
    """Seconds per phase: from each phase event to the next (progress events belong to their phase)."""
    marks = [(e["phase"], e["t"]) for e in events if e.get("phase") != "progress" and "t" in e]
    out: dict[str, float] = {}
    for (name, t), (_, t_next) in zip(marks, marks[1:]):
        out[name] = round(out.get(name, 0.0) + t_next - t, 3)
    return out


def run(name: str, params: dict[str, Any], cfg: StudyConfig, wl: Any, root: Path,
        paths: dict[str, list[int]] | None = None) -> dict[str, Any]:
    job = trial_job(Candidate(params), wl, cfg)
    if paths is not None:  # score every greedy output of its own, as if each differed, and the baseline's
        job["reference"] = paths
        job["judge"] = {r["id"]: None for r in job["requests"]}
        job.pop("drift", None)
    events: list[dict[str, Any]] = []
    out = run_trial(job, root / name, timeout_s=1200, on_event=events.append)
    if out.raw is None:
        raise SystemExit(f"{name}: {out.failure}")
    recs = out.raw["windows"][0]["requests"]
    numerics = measure_numerics(out.raw.get("dtype"), out.raw.get("scores"), out.raw.get("decode_logprobs"))
    return {"paths": {r["id"]: r["token_ids"] for r in recs}, "numerics": numerics.to_dict(), "phases": phases(events),
            "window_s": round(out.raw["windows"][0]["window_s"], 3),
            "requests": len(recs), "output_tokens": sum(len(r["token_ids"]) for r in recs),
            "scored": len(out.raw.get("scores") or {}), "own_scored": len(out.raw.get("own_scores") or {}),
            "own_decoded": sum("logprobs" in (s.get("decoded") or {}) for s in (out.raw.get("own_scores") or {}).values()),
            "drift_requests": len(out.raw.get("decode_logprobs") or {})}


def main() -> None:
    ap = harness.parser(__doc__, out="every_token_cost.json")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--dtype", default=demo.DTYPE)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="every_token_cost-"))
    rows = Path("examples/json_edit.jsonl").read_text().splitlines(keepends=True)[:args.requests]
    (root / "edits.jsonl").write_text("".join(rows))
    wl = load_workload(str(root / "edits.jsonl"))
    cfg = StudyConfig(name="every_token_cost", results_dir=root, repeats=1, warmup=1, samples=0,
                      settings=Settings(model=str(demo.TARGET), draft_model=str(demo.DRAFT), dtype=args.dtype,
                                        max_model_len=demo.MAX_MODEL_LEN, kv_cache_memory_bytes=demo.KV_CACHE_BYTES))
    base = run("baseline", {"method": "none"}, cfg, wl, root)
    cand = run("candidate", NGRAM, cfg, wl, root, paths=base.pop("paths"))
    cand.pop("paths")
    cand.pop("numerics")  # the candidate's scores of its own outputs are no baseline's: not its numerics
    per_out = cand["phases"].get("score_own", 0.0) / max(1, cand["own_scored"])
    rank_per_out = cand["phases"].get("decode_own", 0.0) / max(1, cand["own_decoded"])
    decode_per_out = cand["window_s"] / cand["requests"]  # concurrency 1: one output at a time
    result = {"dtype": args.dtype, "workload": f"examples/json_edit.jsonl, first {args.requests}",
              "baseline": base, "candidate": cand,
              "baseline_drift_over_window": round(base["phases"].get("drift", 0.0) / base["window_s"], 3),
              "baseline_score_over_window": round(base["phases"].get("score", 0.0) / base["window_s"], 3),
              "prefill_per_output_s": round(per_out, 4), "candidate_decode_per_output_s": round(decode_per_out, 4),
              "prefill_over_decode": round(per_out / decode_per_out, 4),
              "own_decode_per_output_s": round(rank_per_out, 4),
              "own_decode_over_decode": round(rank_per_out / decode_per_out, 4),
              "candidate_score_baseline_paths_per_output_s": round(cand["phases"].get("score", 0.0) / max(1, cand["scored"]), 4),
              "machine_shared": "2 cores shared with other engineers' work; engines under the engine lock"}
    harness.save(args.out, result)
    print(f"baseline: window {base['window_s']:.1f}s, score {base['phases'].get('score', 0):.1f}s, drift "
          f"{base['phases'].get('drift', 0):.1f}s ({base['drift_requests']} requests); candidate: window "
          f"{cand['window_s']:.1f}s, {cand['own_scored']} outputs scored in {cand['phases'].get('score_own', 0):.1f}s: "
          f"{per_out:.3f}s each against {decode_per_out:.3f}s to decode one ({per_out / decode_per_out:.1%}); "
          f"{cand['own_decoded']} decoded again with log-probs (their ranks): {rank_per_out:.3f}s each")


if __name__ == "__main__":
    main()
