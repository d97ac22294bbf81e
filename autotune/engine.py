"""The engine adapter: the only module that imports vLLM (lazily, inside the worker process).

Starts vLLM's async engine in-process with a candidate's engine arguments, warms it up,
replays the workload at the chosen concurrency with streamed (delta) outputs, timestamps
every chunk, and diffs vLLM's own speculative-decoding counters around the measured window.
Returns plain data (a RawRun dict) so the parent never touches vLLM objects.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

SPEC_COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens")
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"

Phase = Callable[[str, dict[str, Any]], None]


def vllm_version() -> str:
    import vllm

    return str(vllm.__version__)


def spec_counters() -> dict[str, Any]:
    """Current values of vLLM's speculative-decoding counters (summed over label sets)."""
    from vllm.v1.metrics.reader import Counter, Vector, get_metrics_snapshot

    out: dict[str, Any] = {name: 0 for name in SPEC_COUNTERS}
    per_pos: list[int] = []
    for m in get_metrics_snapshot():
        if isinstance(m, Counter) and m.name in out:
            out[m.name] += m.value
        elif isinstance(m, Vector) and m.name == PER_POS:
            per_pos = [a + b for a, b in zip(per_pos, m.values)] + list(m.values[len(per_pos):])
    out[PER_POS] = per_pos
    return out


def diff_counters(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    d = {k: after[k] - before[k] for k in SPEC_COUNTERS}
    b = before[PER_POS] + [0] * (len(after[PER_POS]) - len(before[PER_POS]))
    d[PER_POS] = [x - y for x, y in zip(after[PER_POS], b)]
    return d


def _prompt_text(engine: Any, req: dict[str, Any]) -> str:
    if "prompt" in req:
        return req["prompt"]
    tok = engine.get_tokenizer()
    return tok.apply_chat_template(req["messages"], tokenize=False, add_generation_prompt=True)


async def _one(engine: Any, req: dict[str, Any], prompt: str) -> dict[str, Any]:
    """Run one request, streaming deltas; keep raw timestamps (derived numbers come later)."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    params = SamplingParams(output_kind=RequestOutputKind.DELTA, **req["sampling"])
    rec: dict[str, Any] = {"id": req["id"], "start": time.perf_counter(), "chunks": [], "token_ids": [],
                           "text": "", "finish_reason": None, "error": None, "prompt_tokens": None}
    try:
        async for out in engine.generate(prompt, params, f"{req['id']}-{uuid.uuid4().hex[:8]}"):
            now = time.perf_counter()
            comp = out.outputs[0]
            if comp.token_ids:
                rec["chunks"].append([now, len(comp.token_ids)])
                rec["token_ids"].extend(comp.token_ids)
            rec["text"] += comp.text
            if rec["prompt_tokens"] is None and out.prompt_token_ids is not None:
                rec["prompt_tokens"] = len(out.prompt_token_ids)
            if out.finished:
                rec["finish_reason"] = comp.finish_reason
    except Exception as e:  # a request error is recorded; the run is then incomplete
        rec["error"] = f"{type(e).__name__}: {e}"
    rec["end"] = time.perf_counter()
    return rec


async def _replay(engine: Any, reqs: list[dict[str, Any]], prompts: list[str], concurrency: int,
                  on_done: Callable[[int], None]) -> list[dict[str, Any]]:
    """Closed loop: at most ``concurrency`` requests in flight, the next one sent when one finishes."""
    sem = asyncio.Semaphore(concurrency)
    done = 0

    async def run(i: int) -> dict[str, Any]:
        nonlocal done
        async with sem:
            rec = await _one(engine, reqs[i], prompts[i])
        done += 1
        on_done(done)
        return rec

    return list(await asyncio.gather(*(run(i) for i in range(len(reqs)))))


async def _run(job: dict[str, Any], phase: Phase) -> dict[str, Any]:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    reqs, replay = job["requests"], job["replay"]
    phase("engine", {})
    t0 = time.perf_counter()
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**job["engine_kwargs"], disable_log_stats=False))
    try:
        init_s = time.perf_counter() - t0
        prompts = [_prompt_text(engine, r) for r in reqs]
        n_warm = min(len(reqs), replay["warmup"])
        phase("warmup", {"total": n_warm})
        t1 = time.perf_counter()
        # Unmeasured: first use JIT-compiles kernels (the ngram proposer among them).
        await _replay(engine, reqs[:n_warm], prompts[:n_warm], replay["concurrency"], lambda n: None)
        warm_s = time.perf_counter() - t1
        phase("measure", {"total": len(reqs)})
        before = spec_counters()
        t2 = time.perf_counter()
        records = await _replay(engine, reqs, prompts, replay["concurrency"],
                                lambda n: phase("progress", {"done": n, "total": len(reqs)}))
        t3 = time.perf_counter()
        counters = diff_counters(before, spec_counters())
    finally:
        engine.shutdown()
    for r in records:  # times relative to the window start, easier to read and to check
        r["start"] -= t2
        r["end"] -= t2
        for c in r["chunks"]:
            c[0] -= t2
    return {"engine_init_s": init_s, "warmup_s": warm_s, "window_s": t3 - t2, "requests": records,
            "spec_counters": counters, "vllm_version": vllm_version(), "concurrency": replay["concurrency"]}


def run_job(job: dict[str, Any], phase: Phase) -> dict[str, Any]:
    """Start the engine for ``job['engine_kwargs']``, warm up, replay, return a RawRun dict."""
    return asyncio.run(_run(job, phase))
