"""Benchmark: may `confirm` start its next server while the current one is measured? (issue 28)

`autotune confirm` alternates fresh servers (baseline, pick, ...) one after another, so each
round pays a server's start (three processes importing vLLM) before its `vllm bench serve` run.
Starting the next server during the current run would hide that start, if the start leaves the
measured server's speed alone. This measures it on one server instance of the baseline (the
side with the longest run), alternating (ABAB) a `vllm bench serve` run alone and one with the
pick's server starting beside it from the run's first second (ended after the run), with the
prefix cache reset before each run. A finished study folder gives the scripts and the dataset
(confirm's own).

    .venv/bin/python benchmarks/confirm_overlap.py RESULTS [--rounds 3] [--out benchmarks/data/confirm_overlap.json]
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import harness
from autotune.core.study_report import load_report
from autotune.core.workload import load_workload
from autotune.gate import confirm
from autotune.serve.bench_client import read_bench
from autotune.serve.servers import HOST, free_port, healthy, run_client, serving


def main() -> None:
    ap = harness.parser(__doc__, out="confirm_overlap.json")
    ap.add_argument("results")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    results = Path(args.results)
    report = load_report(results)
    st = confirm.setup(results, report, load_workload(report["workload"]), python=sys.executable)
    env = {**st.env, "VLLM_SERVER_DEV_MODE": "1"}
    rows: list[dict[str, Any]] = []
    port = free_port()
    with serving(["bash", str(st.scripts["baseline"]), "--host", HOST, "--port", str(port)], port=port,
                 log_path=st.out / "overlap-measured.log", env=env,
                 what="the measured server") as server:
        for i in range(args.rounds):
            for beside in ((False, True) if i % 2 == 0 else (True, False)):
                harness.reset_prefix_cache(server.base_url)
                other, t0 = None, time.time()
                if beside:  # the next server starting, as an overlapped confirm would start it
                    p2 = free_port()
                    with open(st.out / f"overlap-starting-{i}.log", "w") as log:  # the child keeps its own handle
                        other = subprocess.Popen(["bash", str(st.scripts["pick"]), "--host", HOST, "--port", str(p2)],
                                                 stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                                 env={**os.environ, **env})
                tag = f"overlap-{i}-{'beside' if beside else 'alone'}"
                run_client([*st.client, "--base-url", server.base_url, "--save-result", "--result-dir", str(st.out),
                            "--result-filename", f"{tag}.json"], log_path=st.out / f"{tag}.bench.log")
                run_s = time.time() - t0
                ready = False
                if other is not None:
                    ready = healthy(f"http://{HOST}:{p2}/health")
                    os.killpg(other.pid, signal.SIGTERM)
                    try:
                        other.wait(30)
                    except subprocess.TimeoutExpired:
                        os.killpg(other.pid, signal.SIGKILL)
                    time.sleep(3)  # its processes gone before the next run
                d = read_bench(st.out / f"{tag}.json", expected=len(st.plan.rows))
                rows.append({"round": i, "beside": beside, "output_tok_s": float(d["output_throughput"]),
                             "run_s": round(run_s, 1), "other_ready_by_end": ready})
                print(f"round {i + 1} {'with a server starting' if beside else 'alone':<22}: "
                      f"{rows[-1]['output_tok_s']:7.1f} tok/s, run {run_s:5.1f} s", flush=True)
    alone = [r["output_tok_s"] for r in rows if not r["beside"]]
    beside = [r["output_tok_s"] for r in rows if r["beside"]]
    pairs = harness.paired(beside, alone)
    summary = {"alone_median": statistics.median(alone), "beside_median": statistics.median(beside),
               "beside_over_alone_by_round": [round(x, 3) for x in pairs]}
    print(json.dumps(summary))
    harness.save(args.out, {"results": str(results), "rows": rows, "summary": summary})


if __name__ == "__main__":
    main()
