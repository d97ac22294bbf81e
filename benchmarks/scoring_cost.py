"""Benchmark: what the log-prob scoring pass costs a lossless candidate's trial (not a test).

A trial used to score the baseline's greedy tokens teacher-forced after its measured windows,
whatever the candidate; only a lossy config's verdict reads those log-probs, so a lossless one now
skips the pass (autotune.measure.config.StudyConfig.score_lossless). This runs the demo's
baseline once (its outputs are the reference), then the demo's usual pick (ngram k=5) as a study's
trial does (fresh worker, ``vllm serve`` by default), alternating scoring on and off round by round
(ABBA), and reports each trial's wall and the scoring phase's own seconds from the trial's
events.jsonl (each event stamped with the worker's clock).

    .venv/bin/python benchmarks/scoring_cost.py [--rounds 2] [--out benchmarks/data/scoring_cost.json]
"""

from __future__ import annotations

import json
import statistics
import tempfile
from dataclasses import replace
from pathlib import Path

import harness
from autotune import demo
from autotune.core.candidate import Candidate, Settings
from autotune.core.workload import load_workload
from autotune.measure.config import StudyConfig
from autotune.run.evaluate import run_and_evaluate

BASE = {"method": "none", "enforce_eager": True}
PICK = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4, "prompt_lookup_min": 2,
        "enforce_eager": True}


def phases(events: Path) -> dict[str, float]:
    """Seconds per phase: from each phase's first event to the next phase's (the last to the last event)."""
    rows = [json.loads(x) for x in events.read_text().splitlines() if x.strip()]
    starts = [(r["phase"], r["t"]) for r in rows if r["phase"] not in ("progress", "window_done")]
    out: dict[str, float] = {}
    for (name, t), nxt in zip(starts, [*starts[1:], ("end", rows[-1]["t"])]):
        out[name] = round(out.get(name, 0.0) + nxt[1] - t, 2)
    return out


def main() -> None:
    ap = harness.parser(__doc__, out="scoring_cost.json")
    ap.add_argument("--workload", default="examples/json_edit.jsonl")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--instrument", default="served", choices=("served", "inprocess"))
    args = ap.parse_args()
    wl = load_workload(args.workload)
    root = Path(tempfile.mkdtemp(prefix="scoring-"))
    cfg = StudyConfig(name="scoring", results_dir=root, instrument=args.instrument, samples=0,
                      settings=Settings(model=str(demo.TARGET), dtype=demo.DTYPE, max_model_len=demo.MAX_MODEL_LEN,
                                        kv_cache_memory_bytes=demo.KV_CACHE_BYTES))
    _, base = run_and_evaluate(Candidate(BASE), wl, cfg, root / "baseline")
    assert base is not None, "the baseline failed"
    rows = []
    order = [s for i in range(args.rounds) for s in ((True, False) if i % 2 == 0 else (False, True))]
    for n, scored in enumerate(order):
        run_cfg = replace(cfg, score_lossless=scored)
        out, ev = run_and_evaluate(Candidate(PICK), wl, run_cfg, root / f"pick-{n}", reference=base.reference)
        assert ev is not None, out.failure
        ph = phases(root / f"pick-{n}" / "events.jsonl")
        rows.append({"scored": scored, "wall_s": round(out.wall_s, 2), "phases_s": ph,
                     "scored_requests": len(out.raw.get("scores") or {}),
                     "output_tok_s": round(ev.measurement["output_tok_s"], 1)})
        print(f"{n}: scoring {'on ' if scored else 'off'} wall {out.wall_s:6.1f} s, score phase "
              f"{ph.get('score', 0.0):5.2f} s, {rows[-1]['scored_requests']} requests scored, "
              f"{rows[-1]['output_tok_s']} tok/s", flush=True)
    on = [r for r in rows if r["scored"]]
    off = [r for r in rows if not r["scored"]]
    summary = {"score_phase_s_median": statistics.median(r["phases_s"].get("score", 0.0) for r in on),
               "wall_s_median_on": statistics.median(r["wall_s"] for r in on),
               "wall_s_median_off": statistics.median(r["wall_s"] for r in off)}
    print(json.dumps(summary))
    harness.save(args.out, {"workload": args.workload, "instrument": args.instrument, "candidate": PICK,
                            "order": order, "rows": rows, "summary": summary})


if __name__ == "__main__":
    main()
