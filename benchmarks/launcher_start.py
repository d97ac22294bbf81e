"""Benchmark: a served trial started by the launcher against one started fresh (not a test).

The launcher (autotune.run.launcher) imports vLLM once and forks each trial's worker and its
`vllm serve` (engine core and CPU worker forked too); without it each trial starts a fresh worker
and a fresh `vllm serve`, three processes each importing vLLM. This measures, in one run, on the
demo pair and workload, each trial as a study's served trial (run_trial, scoring as a study does):
the start (``engine_init_s``: the worker's start of its server to a healthy ``/health``), the
trial's wall, and what the trial reads (output tok/s, acceptance, greedy outputs against the
baseline's), fresh and launched alternating round by round (ABBA) for the baseline and the demo's
usual pick (ngram k=5), so that each launched trial has a fresh twin of the same config beside it
in time. The launcher runs (idle) through both arms; its own start is timed once.

    .venv/bin/python benchmarks/launcher_start.py [--rounds 3] [--out benchmarks/data/launcher_start.json]

With ``--instrument inprocess`` the trials are the worker's own AsyncLLM instead of a server (a
launched worker forks its engine core and CPU worker as a launched server does):

    .venv/bin/python benchmarks/launcher_start.py --instrument inprocess --out benchmarks/data/launcher_start_inprocess.json

With ``--forked-starts N``, only N launched baseline trials of a short workload, back to back: the
median start (``engine_init_s``) of forked servers, to compare one version of the launcher with
another on the same machine (issue 42: run it from each version's tree, under the engine lock):

    flock /tmp/autotune-engine.lock .venv/bin/python benchmarks/launcher_start.py --forked-starts 8 \
        --workload examples/smoke.jsonl --out benchmarks/data/launcher_start_after.json
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import harness
from autotune import demo
from autotune.core.candidate import Candidate, Settings
from autotune.core.workload import load_workload
from autotune.measure.config import StudyConfig
from autotune.run import launcher
from autotune.run.evaluate import run_and_evaluate

CONFIGS = {"baseline": {"method": "none", "enforce_eager": True},
           "ngram k=5": {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4,
                         "prompt_lookup_min": 2, "enforce_eager": True}}


def main() -> None:
    ap = harness.parser(__doc__, out="launcher_start.json")
    ap.add_argument("--workload", default="examples/json_edit.jsonl")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--instrument", choices=["served", "inprocess"], default="served")
    ap.add_argument("--forked-starts", type=int, default=0, help="only this many launched baseline trials")
    args = ap.parse_args()
    if args.forked_starts:
        return forked_starts(args)
    wl = load_workload(args.workload)
    root = Path(tempfile.mkdtemp(prefix="launcher-"))
    cfg = StudyConfig(name="launcher", results_dir=root, instrument=args.instrument,
                      settings=Settings(model=str(demo.TARGET), dtype=demo.DTYPE, max_model_len=demo.MAX_MODEL_LEN,
                                        kv_cache_memory_bytes=demo.KV_CACHE_BYTES))
    t0 = time.monotonic()
    with launcher.active() as sock:
        launcher_start_s = time.monotonic() - t0
        assert sock, "the launcher did not start"
        print(f"launcher ready in {launcher_start_s:.1f} s", flush=True)
        rows, reference = [], None
        order = [(name, arm) for i in range(args.rounds) for name in CONFIGS
                 for arm in (("fresh", "launched") if i % 2 == 0 else ("launched", "fresh"))]
        for n, (name, arm) in enumerate(order):
            if arm == "fresh":
                os.environ.pop(launcher.ENV_KEY)
            try:
                out, ev = run_and_evaluate(Candidate(CONFIGS[name]), wl, cfg, root / f"{n:02d}-{arm}",
                                           reference=reference)
            finally:
                os.environ[launcher.ENV_KEY] = sock
            assert ev is not None, out.failure
            if reference is None and name == "baseline":
                reference = ev.reference  # every later trial's outputs are judged against this
            m = ev.measurement
            rows.append({"round": n // (2 * len(CONFIGS)), "config": name, "arm": arm,
                         "engine_init_s": round(m["engine_init_s"], 2), "wall_s": round(out.wall_s, 2),
                         "output_tok_s": round(m["output_tok_s"], 1),
                         "mean_accepted_length": m.get("mean_accepted_length"),
                         "greedy_identical": f"{ev.verdict.greedy_identical}/{ev.verdict.greedy_requests}",
                         "passed": ev.verdict.passed})
            print(f"{n:2d} {name:10s} {arm:8s} init {m['engine_init_s']:5.1f} s  wall {out.wall_s:6.1f} s  "
                  f"{m['output_tok_s']:6.1f} tok/s  accepted length {m.get('mean_accepted_length')}  "
                  f"greedy identical {rows[-1]['greedy_identical']}, passed {ev.verdict.passed}", flush=True)
    pairs = []  # each launched trial over its fresh twin of the same round and config
    for r in range(args.rounds):
        for name in CONFIGS:
            got = {x["arm"]: x for x in rows if x["round"] == r and x["config"] == name}
            pairs.append({"round": r, "config": name,
                          "tok_s_ratio": round(got["launched"]["output_tok_s"] / got["fresh"]["output_tok_s"], 3),
                          "init_ratio": round(got["launched"]["engine_init_s"] / got["fresh"]["engine_init_s"], 3)})
    by = {arm: [x for x in rows if x["arm"] == arm] for arm in ("fresh", "launched")}
    fresh_same = {name: [x["output_tok_s"] for x in by["fresh"] if x["config"] == name] for name in CONFIGS}
    summary = {
        "launcher_start_s": round(launcher_start_s, 1),
        "engine_init_s_median": {a: statistics.median(x["engine_init_s"] for x in v) for a, v in by.items()},
        "engine_init_s_range": {a: [min(x["engine_init_s"] for x in v), max(x["engine_init_s"] for x in v)]
                                for a, v in by.items()},
        "wall_s_median": {a: statistics.median(x["wall_s"] for x in v) for a, v in by.items()},
        "init_ratio_median": statistics.median(p["init_ratio"] for p in pairs),
        "tok_s_ratio_median": statistics.median(p["tok_s_ratio"] for p in pairs),
        "tok_s_ratio_range": [min(p["tok_s_ratio"] for p in pairs), max(p["tok_s_ratio"] for p in pairs)],
        # the same config's fresh instances against each other: the noise the ratios sit in
        "fresh_spread": {n: round(max(v) / min(v), 3) for n, v in fresh_same.items()},
        "all_passed": all(x["passed"] for x in rows),
    }
    print(json.dumps(summary, indent=1))
    harness.save(args.out, {"workload": args.workload, "instrument": args.instrument, "configs": CONFIGS,
                            "order": order, "rows": rows, "pairs": pairs, "summary": summary})


def forked_starts(args: Any) -> None:
    """``--forked-starts``: the launched baseline's start, N times, and the machine's load beside it."""
    wl = load_workload(args.workload)
    root = Path(tempfile.mkdtemp(prefix="launcher-"))
    cfg = StudyConfig(name="launcher", results_dir=root, instrument=args.instrument,
                      settings=Settings(model=str(demo.TARGET), dtype=demo.DTYPE, max_model_len=demo.MAX_MODEL_LEN,
                                        kv_cache_memory_bytes=demo.KV_CACHE_BYTES))
    rows = []
    with launcher.active() as sock:
        assert sock, "the launcher did not start"
        for n in range(args.forked_starts):
            load = os.getloadavg()[0]
            out, ev = run_and_evaluate(Candidate(CONFIGS["baseline"]), wl, cfg, root / f"{n:02d}")
            assert ev is not None, out.failure
            rows.append({"engine_init_s": round(ev.measurement["engine_init_s"], 2), "wall_s": round(out.wall_s, 2),
                         "load_avg_1m_before": round(load, 2)})
            print(rows[-1], flush=True)
    inits = [r["engine_init_s"] for r in rows]
    summary = {"engine_init_s_median": statistics.median(inits), "engine_init_s_range": [min(inits), max(inits)],
               "load_avg_1m_median": statistics.median(r["load_avg_1m_before"] for r in rows)}
    print(json.dumps(summary, indent=1))
    harness.save(args.out, {"cores_allowed": len(os.sched_getaffinity(0)), "workload": args.workload,
                            "instrument": args.instrument, "rows": rows, "summary": summary})


if __name__ == "__main__":
    main()
