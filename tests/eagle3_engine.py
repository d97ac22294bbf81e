"""A test-only engine module for tests/test_engine_eagle3.py, run as a trial worker's engine (so
the suite's launcher forks it, vLLM already imported): the demo target, with the EAGLE-3 head at
depth ``k`` or without speculation (k = 0), one request at a time, each workload in turn on one
engine, its greedy outputs and vLLM's spec-decode counters (the difference over that workload).

One engine a process: vLLM does not free an engine in-process.
"""

from __future__ import annotations

import json
from typing import Any


def run_job(job: dict[str, Any], phase: Any) -> dict[str, Any]:
    from vllm import LLM, SamplingParams
    from vllm.v1.metrics.reader import Vector

    k = job["k"]
    spec = {"method": "eagle3", "model": job["head"], "num_speculative_tokens": k} if k else None
    phase("engine", {})
    # max_num_seqs=1: one request at a time, the concurrency the forecast replays exactly
    llm = LLM(model=job["target"], dtype="float32", max_model_len=1024, enforce_eager=True, seed=0,
              disable_log_stats=False, speculative_config=spec, max_num_seqs=1,
              kv_cache_memory_bytes=job["kv_cache_memory_bytes"])

    def counters() -> dict[str, Any]:
        got: dict[str, Any] = {}
        for m in llm.get_metrics():
            if m.name.startswith("vllm:spec_decode"):
                got[m.name] = list(m.values) if isinstance(m, Vector) else m.value
        return got

    result = {}
    for kind, workload in job["workloads"].items():  # each workload's counters as the difference
        rows = [json.loads(x) for x in open(workload).read().splitlines() if x.strip()]
        params = [SamplingParams(temperature=0.0, max_tokens=r.get("max_tokens", 128)) for r in rows]
        before = counters()
        outs = llm.generate([r["prompt"] for r in rows], params, use_tqdm=False)
        after = counters()
        diff = {n: ([a - b for a, b in zip(v, before.get(n, [0] * len(v)))] if isinstance(v, list)
                    else v - before.get(n, 0)) for n, v in after.items()}
        result[kind] = {"counters": diff, "outputs": [
            {"id": r.get("id", str(i)), "prompt_token_ids": list(o.prompt_token_ids),
             "token_ids": list(o.outputs[0].token_ids)} for i, (r, o) in enumerate(zip(rows, outs))]}
    return result
