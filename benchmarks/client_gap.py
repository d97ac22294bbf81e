"""Benchmark: do the study's own client and `vllm bench serve` read one server alike? (issue 24)

The study measures a served trial with its own streaming client inside the trial's worker
(autotune.run.served_engine, the windows of autotune.run.replay); `confirm` measures a fresh
server with `vllm bench serve`. In the demo runs the study's baseline read slower than
confirm's (146-149 against 179-221 tok/s in one run) while the pick read alike, which lifts the
claimed speedup over the served one. Fresh instances differ by 25-30% on this machine, so this
compares the two clients on the **same** server instance, alternating (ABAB), with the prefix
cache and a stateful proposer's cache (suffix decoding's, through the measuring worker extension:
autotune.run.vllm_ext) emptied before each window and each bench run: what is left is the client.
(Before round 5 the suffix cache was not emptied before the bench runs, which then drafted the
answers the study's window had just memorised: the pick's bench readings of client_gap.json.)

For each side (the baseline, the pick) of a finished study folder (default: results/demo), one
server is started from the study's own scripts (confirm/baseline.sh, serve.sh), then ``--rounds``
times: one window of the study's client, one `vllm bench serve` run (confirm's own command).
Prints and saves each reading, per side the median of each client and their ratio:

    .venv/bin/python benchmarks/client_gap.py [RESULTS] [--rounds 3] [--out benchmarks/data/client_gap.json]
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import harness
from autotune.core.candidate import Candidate, Settings
from autotune.core.study_report import load_report
from autotune.core.workload import load_workload
from autotune.gate import confirm
from autotune.measure.config import StudyConfig
from autotune.measure.metrics import measure
from autotune.run.evaluate import trial_job
from autotune.run.replay import measure_windows, prompt_text, replay_requests
from autotune.run.served_engine import ServedEngine
from autotune.serve.bench_client import read_bench
from autotune.serve.servers import HOST, free_port, run_client, serving
from autotune.run.vllm_ext import QUALNAME
from autotune.vllm_cli import reset_caches as reset


async def _own_window(engine: ServedEngine, reqs: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """One window as a study's served trial measures it (warm-up requests first, as a trial has)."""
    engine.attach()
    try:
        prompts = [prompt_text(engine, r) for r in reqs]
        await replay_requests(engine, reqs[:warmup], prompts[:warmup], {"kind": "concurrency", "concurrency": 1},
                              lambda n: None)
        windows = await measure_windows(engine, reqs, prompts, {"kind": "concurrency", "concurrency": 1},
                                        {"repeats": 1, "max_repeats": 1}, lambda *a: None)
    finally:
        await engine.shutdown()  # closes the session; the server is the benchmark's
    m = measure(windows[0])
    return {"output_tok_s": m["output_tok_s"], "tpot_ms_p50": m.get("tpot_ms_p50"),
            "tokens": sum(len(r["token_ids"]) for r in windows[0]["requests"])}


def main() -> None:
    ap = harness.parser(__doc__, out="client_gap.json")
    ap.add_argument("results", nargs="?", default="results/demo")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    results = Path(args.results)
    report = load_report(results)
    wl = load_workload(report["workload"])
    st = confirm.setup(results, report, wl, python=sys.executable)
    kwargs = {"baseline": report["baseline"]["engine_kwargs"], "pick": report["best"]["engine_kwargs"]}
    cfg = StudyConfig(name="gap", results_dir=results, samples=0, settings=Settings(model=kwargs["baseline"]["model"]))
    reqs = trial_job(Candidate({"method": "none"}), wl, cfg)["requests"]  # the requests as a trial's job has them
    out: dict[str, Any] = {"results": str(results), "rounds": args.rounds, "sides": {}}
    t0 = time.time()
    for side in ("baseline", "pick"):
        port = free_port()
        own: list[dict[str, Any]] = []
        bench: list[dict[str, Any]] = []
        hooks = ["--worker-extension-cls", QUALNAME] if st.stateful[side] else []
        with serving(["bash", str(st.scripts[side]), *hooks, "--host", HOST, "--port", str(port)], port=port,
                     log_path=st.out / f"gap-{side}.log", env={**st.env, "VLLM_SERVER_DEV_MODE": "1"},
                     what=f"the {side} server") as server:
            engine = ServedEngine(engine_kwargs=kwargs[side], log_path=st.out / f"gap-{side}.log", port=port)
            for i in range(args.rounds):
                for client in (("own", "bench") if i % 2 == 0 else ("bench", "own")):
                    reset(server.base_url, drafter=st.stateful[side])  # prefix cache, and a suffix cache
                    if client == "own":
                        own.append(asyncio.run(_own_window(engine, reqs, warmup=2)))  # the study's --warmup default
                        got = own[-1]
                    else:
                        tag = f"gap-{side}-{i}"
                        run_client([*st.client, "--base-url", server.base_url, "--save-result", "--result-dir",
                                    str(st.out), "--result-filename", f"{tag}.json"],
                                   log_path=st.out / f"{tag}.bench.log")
                        d = read_bench(st.out / f"{tag}.json", expected=len(st.plan.rows))
                        got = {"output_tok_s": float(d["output_throughput"]), "tpot_ms_p50": d.get("median_tpot_ms"),
                               "tokens": int(d.get("total_output_tokens") or 0)}
                        bench.append(got)
                    print(f"{side} round {i + 1} {client:<5}: {got['output_tok_s']:7.1f} tok/s, tpot p50 "
                          f"{got['tpot_ms_p50'] or float('nan'):.2f} ms, {got['tokens']} tokens "
                          f"({time.time() - t0:.0f} s)", flush=True)
        own_med = statistics.median(x["output_tok_s"] for x in own)
        bench_med = statistics.median(x["output_tok_s"] for x in bench)
        pairs = harness.paired([o["output_tok_s"] for o in own], [b["output_tok_s"] for b in bench])
        out["sides"][side] = {"own": own, "bench": bench, "own_median": own_med, "bench_median": bench_med,
                              "own_over_bench": own_med / bench_med, "paired_own_over_bench": pairs}
        print(f"{side}: own {own_med:.1f}, bench {bench_med:.1f} tok/s, own/bench {own_med / bench_med:.3f} "
              f"(paired {', '.join(f'{x:.3f}' for x in pairs)})", flush=True)
    sides = out["sides"]
    out["claim_bias"] = sides["pick"]["own_over_bench"] / sides["baseline"]["own_over_bench"]
    out["wall_s"] = round(time.time() - t0, 1)
    print(f"the study's client over bench: baseline {sides['baseline']['own_over_bench']:.3f}, pick "
          f"{sides['pick']['own_over_bench']:.3f}: a speedup read by the study's client is {out['claim_bias']:.3f} "
          f"of bench's on the same servers")
    harness.save(args.out, out, indent=2)


if __name__ == "__main__":
    main()
