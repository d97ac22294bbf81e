"""Benchmark: where the in-process claim and the served figure part ways (issue 24).

For the baseline and one speculative config (default: the demo's usual pick, ngram k=5 lookup
2..3), fresh instances measured by each instrument, in interleaved order (ABBA over sides and
instruments, so a drift of the machine's speed lands on both):

- ``inproc``: the study's own harness (a worker process, AsyncLLM in it, streamed deltas);
- ``trial_served``: the study's harness with its served instrument (``--instrument served``: the
  exported command served, our own streaming client over HTTP);
- ``served``: the exported ``vllm serve`` command measured by ``vllm bench serve`` (as confirm does);
- ``served_own``: the exported command served, measured by a minimal aiohttp client;
- further in-process variants named with ``--variants`` (see VARIANTS): each changes one factor.

Per instance it keeps output tok/s, TPOT p50, TTFT p50 and the idle share of the window (time
between requests at concurrency 1), so a gap splits into per-token cost (TPOT) and the rest.
Prints one line per instance and a table per instrument: median tok/s per side, the speedup, and
the instrument's claim over the served one. Saves everything to ``--out`` (JSON):

    .venv/bin/python benchmarks/served_gap.py [--rounds 2] [--variants inproc,served]
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import harness
from autotune import demo
from autotune.run import hardware
from autotune.serve.bench_client import client_plan, read_bench
from autotune.core.candidate import Candidate, Settings
from autotune.measure.config import StudyConfig
from autotune.run.evaluate import trial_job
from autotune.serve.export import serve_script
from autotune.core.load import LoadPattern
from autotune.measure.metrics import measure_run
from autotune.serve.servers import HOST, free_port, run_client, serving
from autotune.run.worker import run_trial
from autotune.core.workload import load_workload

PICK = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 2, "prompt_lookup_max": 3,
        "enforce_eager": True}
BASE = {"method": "none", "enforce_eager": True}
# In-process variants: extra worker environment, each one factor changed from ``inproc``.
VARIANTS: dict[str, dict[str, str]] = {
    "inproc": {},
}


def _inproc(cand: Candidate, wl: Any, cfg: StudyConfig, workdir: Path, env: dict[str, str]) -> dict[str, Any]:
    out = run_trial(trial_job(cand, wl, cfg), workdir, timeout_s=1800, env=env)
    if out.raw is None:
        raise SystemExit(f"in-process run failed: {out.failure}")
    m = measure_run(out.raw)
    idle = []
    for w in out.raw["windows"]:
        busy = sum(r["end"] - r["start"] for r in w["requests"])
        idle.append(max(0.0, 1 - busy / w["window_s"]))
    return {"output_tok_s": m["output_tok_s"], "tok_s_windows": m["output_tok_s_windows"],
            "tpot_ms_p50": m["tpot_ms_p50"], "ttft_ms_p50": m["ttft_ms_p50"], "idle_share": statistics.median(idle),
            "engine_init_s": out.raw["engine_init_s"], "output_tokens": sum(len(r["token_ids"])
                                                                             for r in out.raw["windows"][0]["requests"])}


def _exported(cand: Candidate, settings: Settings, wl: Any, workdir: Path) -> tuple[dict[str, Any], Path, Any]:
    """The candidate's engine kwargs, its exported serve.sh, and the client's plan at concurrency 1."""
    workdir.mkdir(parents=True, exist_ok=True)
    kw = cand.engine_kwargs(settings)
    script = workdir / "serve.sh"
    script.write_text(serve_script(kw, platform=hardware.detect(), python=sys.executable))
    return kw, script, client_plan(list(wl.requests), load="concurrency=1", render=None, warmups=2)


def _served(cand: Candidate, settings: Settings, wl: Any, workdir: Path, windows: int) -> dict[str, Any]:
    """The exported command served, measured by ``vllm bench serve`` ``windows`` times on one server."""
    kw, script, plan = _exported(cand, settings, wl, workdir)
    dataset = workdir / "workload.jsonl"
    dataset.write_text("".join(json.dumps(r) + "\n" for r in plan.rows))
    client = [sys.executable, "-m", "autotune.vllm_cli", "bench", "serve", "--model", kw["model"],
              "--dataset-path", str(dataset), *plan.flags]
    port = free_port()
    runs = []
    with serving(["bash", str(script), "--host", HOST, "--port", str(port)], port=port,
                 log_path=workdir / "server.log", what="server") as server:
        for w in range(windows):
            run_client([*client, "--base-url", server.base_url, "--save-result", "--result-dir", str(workdir),
                        "--result-filename", f"bench-{w}.json"], log_path=workdir / f"bench-{w}.log")
            runs.append(read_bench(workdir / f"bench-{w}.json", expected=len(plan.rows)))
    busy = [d["mean_e2el_ms"] * d["completed"] / 1000 / d["duration"] for d in runs]
    return {"output_tok_s": statistics.median(d["output_throughput"] for d in runs),
            "tok_s_windows": [d["output_throughput"] for d in runs],
            "tpot_ms_p50": statistics.median(d["median_tpot_ms"] for d in runs),
            "ttft_ms_p50": statistics.median(d["median_ttft_ms"] for d in runs),
            "idle_share": statistics.median(max(0.0, 1 - b) for b in busy), "engine_init_s": server.ready_s,
            "output_tokens": runs[0]["total_output_tokens"]}


async def _own_window(base_url: str, model: str, rows: list[dict[str, Any]], temperature: float) -> dict[str, Any]:
    """One window over HTTP with a minimal streaming client (aiohttp, as vllm bench serve uses),
    one request at a time: is the gap the server's or vllm bench serve's own?"""
    import aiohttp

    recs = []
    t0 = time.perf_counter()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as s:
        for row in rows:
            body = {"model": model, "prompt": row["prompt"], "max_tokens": row["output_tokens"],
                    "temperature": temperature, "stream": True, "return_token_ids": True}
            start, first, n = time.perf_counter(), None, 0
            async with s.post(f"{base_url}/v1/completions", json=body) as resp:
                async for line in resp.content:
                    line = line.strip()
                    if not line.startswith(b"data: ") or line == b"data: [DONE]":
                        continue
                    ids = json.loads(line[6:])["choices"][0].get("token_ids") or []
                    if ids and first is None:
                        first = time.perf_counter()
                    n += len(ids)
            recs.append((start, first, time.perf_counter(), n))
    window = time.perf_counter() - t0
    tokens = sum(r[3] for r in recs)
    return {"output_tok_s": tokens / window, "ttft_ms": statistics.median((r[1] - r[0]) * 1000 for r in recs),
            "tpot_ms": statistics.median((r[2] - r[1]) * 1000 / max(1, r[3] - 1) for r in recs), "tokens": tokens,
            "busy": sum(r[2] - r[0] for r in recs) / window}


def _served_own(cand: Candidate, settings: Settings, wl: Any, workdir: Path, windows: int) -> dict[str, Any]:
    import asyncio

    kw, script, plan = _exported(cand, settings, wl, workdir)
    port = free_port()
    with serving(["bash", str(script), "--host", HOST, "--port", str(port)], port=port,
                 log_path=workdir / "server.log", what="server") as server:
        asyncio.run(_own_window(server.base_url, kw["model"], plan.rows[:2], 0.0))  # warm-up
        runs = [asyncio.run(_own_window(server.base_url, kw["model"], plan.rows, 0.0)) for _ in range(windows)]
    return {"output_tok_s": statistics.median(r["output_tok_s"] for r in runs),
            "tok_s_windows": [r["output_tok_s"] for r in runs],
            "tpot_ms_p50": statistics.median(r["tpot_ms"] for r in runs),
            "ttft_ms_p50": statistics.median(r["ttft_ms"] for r in runs),
            "idle_share": statistics.median(max(0.0, 1 - r["busy"]) for r in runs), "engine_init_s": server.ready_s,
            "output_tokens": runs[0]["tokens"]}


def main() -> None:
    ap = harness.parser(__doc__, out="served_gap.json")
    ap.add_argument("--workload", default="examples/json_edit.jsonl")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--variants", default="inproc,served")
    ap.add_argument("--windows", type=int, default=2, help="measured windows per instance")
    ap.add_argument("--pick", default=json.dumps(PICK))
    args = ap.parse_args()
    wl = load_workload(args.workload)
    settings = Settings(model=str(demo.TARGET), max_model_len=demo.MAX_MODEL_LEN, dtype="float32",
                        kv_cache_memory_bytes=demo.KV_CACHE_BYTES)  # sized, as `autotune search` sets it on CPU
    tmp = Path(tempfile.mkdtemp(prefix="served_gap-"))
    cfg = StudyConfig(name="gap", results_dir=tmp, settings=settings, load=LoadPattern(concurrency=1),
                      repeats=args.windows, samples=0)
    sides = {"baseline": Candidate(BASE), "pick": Candidate(json.loads(args.pick))}
    instruments = args.variants.split(",")
    runs: list[dict[str, Any]] = []
    t_start = time.time()
    for rnd in range(args.rounds):
        order = [(s, i) for s in sides for i in instruments]
        if rnd % 2:
            order.reverse()  # ABBA: a drift in the machine's speed lands on every cell alike
        for side, inst in order:
            workdir = tmp / f"r{rnd}-{side}-{inst}"
            if inst == "served":
                r = _served(sides[side], settings, wl, workdir, args.windows)
            elif inst == "served_own":
                r = _served_own(sides[side], settings, wl, workdir, args.windows)
            elif inst.startswith("trial_served"):  # the study's harness, served instrument
                r = _inproc(sides[side], wl, dataclasses.replace(cfg, instrument="served"), workdir,
                            VARIANTS.get(inst, {}))
            else:
                r = _inproc(sides[side], wl, cfg, workdir, VARIANTS[inst])
            r.update(round=rnd, side=side, instrument=inst, t=round(time.time() - t_start, 1))
            runs.append(r)
            print(f"round {rnd} {side:<8} {inst:<14} {r['output_tok_s']:7.1f} tok/s "
                  f"(windows {', '.join(f'{x:.1f}' for x in r['tok_s_windows'])}) tpot p50 {r['tpot_ms_p50']:.2f} ms "
                  f"ttft p50 {r['ttft_ms_p50']:.1f} ms idle {r['idle_share']:.1%} tokens {r['output_tokens']}",
                  flush=True)
    summary = {}
    for inst in instruments:
        med = {s: statistics.median(r["output_tok_s"] for r in runs if r["side"] == s and r["instrument"] == inst)
               for s in sides}
        tpot = {s: statistics.median(r["tpot_ms_p50"] for r in runs if r["side"] == s and r["instrument"] == inst)
                for s in sides}
        summary[inst] = {"tok_s": med, "tpot_ms_p50": tpot, "speedup": med["pick"] / med["baseline"]}
    print(f"\n{'instrument':<14} {'baseline tok/s':>14} {'pick tok/s':>11} {'speedup':>8} {'vs served':>10} "
          f"{'base tpot ms':>12} {'pick tpot ms':>12}")
    for inst, s in summary.items():
        vs = s["speedup"] / summary["served"]["speedup"] if "served" in summary else float("nan")
        s["claim_over_served"] = vs
        print(f"{inst:<14} {s['tok_s']['baseline']:14.1f} {s['tok_s']['pick']:11.1f} {s['speedup']:7.2f}x {vs:10.3f} "
              f"{s['tpot_ms_p50']['baseline']:12.2f} {s['tpot_ms_p50']['pick']:12.2f}")
    harness.save(args.out, {"workload": args.workload, "rounds": args.rounds, "windows": args.windows,
                            "pick": json.loads(args.pick), "runs": runs, "summary": summary,
                            "env": {k: v for k, v in os.environ.items() if k.startswith("VLLM_")}}, indent=2)


if __name__ == "__main__":
    main()
