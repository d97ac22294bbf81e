"""The in-process engine adapter: vLLM's async engine started in the worker process with a
candidate's engine arguments (with autotune.run.served_engine, the only place that imports vLLM).

It gives the replay (autotune.run.replay) streamed outputs, prompt log-probs and vLLM's own
speculative-decoding counters; ``run_job`` returns plain data (a RawRun dict), so the parent
never touches vLLM objects.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from pathlib import Path
from typing import Any

from autotune.core.records import Job, RawRun
from autotune.run.hardware import vllm_version
from autotune.run.replay import (Phase, decode_drift, measure_windows, prompt_text,
                                  replay_requests, sampled_draws, score_greedy, score_own)

from autotune.run.served_engine import (PER_POS, PREEMPTIONS, SERVER_LOG, SPEC_COUNTERS, TIME_SUMS, model_runner,  # noqa: F401
                                    resolved_cudagraphs, resolved_speculation,
                                    token_budget)


# For engines that time nothing (a draft's teacher-forced trace): vLLM's CPU worker inside its engine
# core (the uniproc executor) instead of a process of its own, re-importing vLLM (AsyncLLM still starts
# the engine core). Start 14.8 s against 27.1 s on a 2-core machine, the same argmax token for token
# (benchmarks/data/engine_start.json). Never for a measured engine: vLLM's CPU platform wants the
# multiprocess executor to set up OpenMP, and without it the worker's threads are unbound (two such
# engines at once thrash: tests/test_engine_correctness.py binds each to a core of its own).
UNTIMED_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def spec_counters() -> dict[str, Any]:
    """Current values of vLLM's speculative-decoding counters (summed over label sets)."""
    from vllm.v1.metrics.reader import Counter, Histogram, Vector, get_metrics_snapshot

    out: dict[str, Any] = {name: 0 for name in (*SPEC_COUNTERS, PREEMPTIONS)}
    out.update({name: 0.0 for name in TIME_SUMS})
    per_pos: list[int] = []
    for m in get_metrics_snapshot():
        if isinstance(m, Counter) and m.name in out:
            out[m.name] += m.value
        elif isinstance(m, Histogram) and m.name in TIME_SUMS:
            out[m.name] += m.sum
        elif isinstance(m, Vector) and m.name == PER_POS:
            per_pos = [a + b for a, b in zip(per_pos, m.values)] + list(m.values[len(per_pos):])
    out[PER_POS] = per_pos
    return out


def _engine_args(cls: Any, kwargs: dict[str, Any]) -> Any:
    """The candidate's engine arguments plus what measuring needs (not part of the exported config):
    vLLM's stats (the acceptance counters) and, with speculation where this vLLM has them, per-request
    acceptance metrics (autotune.measure.categories: acceptance by request category)."""
    from autotune.run.vllm_ext import QUALNAME, needs_reset

    extra: dict[str, Any] = {"disable_log_stats": False}
    if needs_reset(kwargs):  # each window starts with an empty suffix cache (autotune.run.vllm_ext)
        extra["worker_extension_cls"] = QUALNAME
    fields = {f.name for f in dataclasses.fields(cls)}
    if kwargs.get("speculative_config") and "per_request_spec_decode_metrics" in fields:
        extra["per_request_spec_decode_metrics"] = "summary"
    # The user's API-server flags (--chat-template, ...) are no engine arguments: no server here to take them.
    return cls(**{k: v for k, v in kwargs.items() if k in fields}, **extra)


class InProcess:
    """vLLM's AsyncLLM in this process, behind the same methods as the served instrument
    (autotune.run.served_engine.ServedEngine), so one replay drives either."""

    def __init__(self, job: Job) -> None:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        from autotune.run.vllm_ext import needs_reset

        self.engine = AsyncLLM.from_engine_args(_engine_args(AsyncEngineArgs, job["engine_kwargs"]))
        self.stateful = needs_reset(job["engine_kwargs"])

    def get_tokenizer(self) -> Any:
        return self.engine.get_tokenizer()

    def token_budget(self) -> int | None:
        return token_budget(getattr(self.engine, "vllm_config", None))

    async def reset_prefix_cache(self) -> None:
        await self.engine.reset_prefix_cache()

    async def reset_drafter(self) -> None:
        """Empty a proposer's cross-request state (suffix decoding's cache): autotune.run.vllm_ext."""
        if self.stateful:
            from autotune.run.vllm_ext import RESET

            await self.engine.collective_rpc(RESET)

    async def counters(self) -> dict[str, Any]:
        return spec_counters()

    async def kv_cache_blocks(self) -> int | None:
        """The KV cache in blocks as the engine core sized it (its handshake sets the front end's config)."""
        blocks = getattr(getattr(getattr(self.engine, "vllm_config", None), "cache_config", None), "num_gpu_blocks", None)
        return int(blocks) if blocks else None

    async def stream(self, prompt: Any, sampling: dict[str, Any], rid: str) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        from autotune.run.served_engine import Delta

        if sampling.get("structured_outputs") is not None:  # plain data in the job (autotune.core.structured)
            from vllm.sampling_params import StructuredOutputsParams

            sampling = {**sampling, "structured_outputs": StructuredOutputsParams(**sampling["structured_outputs"])}
        params = SamplingParams(output_kind=RequestOutputKind.DELTA, **sampling)
        async for out in self.engine.generate(prompt, params, rid):
            for comp in out.outputs:  # n > 1: the completions that moved, each with its index
                done = out.finished or comp.finish_reason is not None
                spec = getattr(comp, "spec_decode_metrics", None) if done else None
                yield Delta(token_ids=list(comp.token_ids), text=comp.text, finished=done,
                            finish_reason=comp.finish_reason if done else None, index=comp.index,
                            prompt_token_ids=None if out.prompt_token_ids is None else list(out.prompt_token_ids),
                            spec_decode=None if spec is None else spec.to_dict())

    async def prompt_logprobs(self, ids: list[int], k: int, rid: str) -> list[dict[int, tuple[float, int | None]]]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=k, detokenize=False,
                                output_kind=RequestOutputKind.FINAL_ONLY)
        final = None
        async for final in self.engine.generate(TokensPrompt(prompt_token_ids=ids), params, rid):
            pass
        return [{t: (lp.logprob, lp.rank) for t, lp in (d or {}).items()} for d in final.prompt_logprobs]

    async def decode_logprobs(self, ids: list[int], sampling: dict[str, Any], k: int, rid: str) -> dict[str, Any]:
        """Decode ``ids`` as ``sampling`` asks, with each output token's log-prob and the top ``k``
        (autotune.run.replay.decode_drift): {token_ids, logprobs, top}, as a teacher-forced score has them."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(**{**sampling, "logprobs": k}, output_kind=RequestOutputKind.FINAL_ONLY)
        final = None
        async for final in self.engine.generate(TokensPrompt(prompt_token_ids=ids), params, rid):
            pass
        comp = final.outputs[0]
        toks = list(comp.token_ids)
        return {"token_ids": toks, "logprobs": [round(d[t].logprob, 5) for d, t in zip(comp.logprobs, toks)],
                "top": [[[int(t), round(lp.logprob, 5)] for t, lp in d.items()] for d in comp.logprobs]}

    def speculation(self) -> dict[str, Any] | None:
        return resolved_speculation(getattr(self.engine, "vllm_config", None))

    def model_runner(self) -> dict[str, str] | None:
        """The model runner this engine runs, from its config as vLLM resolved it."""
        return model_runner(getattr(self.engine, "vllm_config", None))

    def dtype(self) -> str | None:
        """The dtype vLLM resolved ("auto" included): the near-tie threshold's (autotune.measure.nearties)."""
        config = getattr(getattr(self.engine, "vllm_config", None), "model_config", None)
        return None if config is None else str(config.dtype).removeprefix("torch.")

    async def shutdown(self) -> None:
        self.engine.shutdown()


async def _start(job: Job) -> Any:
    """The job's instrument: the exported ``vllm serve`` over HTTP, or AsyncLLM in this process."""
    if job["replay"].get("instrument", "inprocess") == "served":
        from autotune.run.served_engine import ServedEngine

        log = Path(job.get("workdir") or ".") / SERVER_LOG  # beside worker.log
        engine: Any = ServedEngine(engine_kwargs=job["engine_kwargs"], log_path=log)
        try:
            await engine.start()
        except BaseException:
            await engine.shutdown()
            raise
        return engine
    return InProcess(job)


async def _run(job: Job, phase: Phase) -> RawRun:
    reqs, replay = job["requests"], job["replay"]
    load = replay["load"]
    phase("engine", {})
    t0 = time.perf_counter()
    engine = await _start(job)
    try:
        init_s = time.perf_counter() - t0
        prompts = [prompt_text(engine, r) for r in reqs]
        n_warm = min(len(reqs), replay["warmup"])
        phase("warmup", {"total": n_warm})
        t1 = time.perf_counter()
        # Unmeasured: first use JIT-compiles kernels (the ngram proposer among them).
        await replay_requests(engine, reqs[:n_warm], prompts[:n_warm],
                      {"kind": "concurrency", "concurrency": load.get("concurrency", 1)}, lambda n: None)
        warm_s = time.perf_counter() - t1
        windows = await measure_windows(engine, reqs, prompts, load, replay, phase, main=True)
        levels = {lvl["label"]: await measure_windows(engine, reqs, prompts, lvl, replay, phase)
                  for lvl in replay.get("extra_loads", [])}
        samples = await sampled_draws(engine, reqs, prompts, replay, phase,
                                 {x["id"]: x.get("prompt_tokens") for x in windows[0]["requests"]})
        scores = await score_greedy(engine, reqs, windows[0]["requests"], job.get("reference"), phase)
        own = await score_own(engine, windows[0]["requests"], job.get("judge"), phase,
                              {r["id"]: r["sampling"] for r in reqs})
        decode = await decode_drift(engine, reqs, windows[0]["requests"], load, phase) if job.get("drift") else {}
        ran = engine.speculation()
        dtype = engine.dtype() if hasattr(engine, "dtype") else None  # the served instrument does not say
        kv_blocks = await engine.kv_cache_blocks()
        graphs = _cudagraphs(engine)
        runner = engine.model_runner()  # read from the engine, never predicted (autotune.core.runner)
    finally:
        phase("shutdown", {})  # the last phase before it ends where the engine's time goes (benchmarks)
        await engine.shutdown()
    from autotune.run import launcher

    # how this trial's processes came to exist: forked by the study's launcher, or started fresh
    started = {"worker": "forked" if launcher.FORKED else "fresh",
               "server": "forked" if isinstance(getattr(engine, "proc", None), launcher.Launched)
               else ("fresh" if hasattr(engine, "proc") else "none (in the worker)")}
    return {"engine_init_s": init_s, "started": started, "warmup_s": warm_s, "windows": windows, "levels": levels,
            "samples": samples, "scores": scores, "vllm_version": vllm_version(), "load": load,
            **({"own_scores": own} if own else {}), **({"decode_logprobs": decode} if decode else {}),
            "speculative_config": ran, "instrument": replay.get("instrument", "inprocess"), "kv_cache_blocks": kv_blocks,
            **({"dtype": dtype} if dtype else {}), **({"cudagraphs": graphs} if graphs else {}),
            **({"model_runner": runner["runner"], "model_runner_from": runner["from"]} if runner else {})}


def _cudagraphs(engine: Any) -> dict[str, Any] | None:
    """On CUDA, the graph mode and capture sizes the engine resolved (autotune.measure.cudagraphs);
    the CPU platform has no graphs (its mode is always NONE), so nothing is recorded there."""
    from autotune.run import hardware

    if hardware.detect() != "cuda":
        return None
    return resolved_cudagraphs(getattr(engine, "vllm_config", None) or getattr(engine.engine, "vllm_config", None))


async def _trace(job: Job, phase: Phase) -> dict[str, Any]:
    """A draft model's greedy choice at every position of the baseline's outputs, teacher-forced.

    ``job['trace']``: request id -> {"prompt": prompt token ids, "output": the baseline's tokens}.
    The engine is the draft model alone. One prefill of prompt + output with ``prompt_logprobs=1``
    gives the draft's argmax for each output token after the first (the rank-1 entry), and the one
    generated token its choice after the whole output: ``argmax[i]`` predicts output[i + 1], as
    autotune.forecast.predict.DraftTrace wants.
    """
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.async_llm import AsyncLLM

    phase("engine", {})
    fields = {f.name for f in dataclasses.fields(AsyncEngineArgs)}  # the user's API-server flags are not
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**{k: v for k, v in job["engine_kwargs"].items() if k in fields}))
    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=1, detokenize=False,
                            output_kind=RequestOutputKind.FINAL_ONLY)
    out: dict[str, Any] = {}
    rank_off = 0
    try:
        phase("score", {"total": len(job["trace"])})
        for rid, t in job["trace"].items():
            final = None
            async for final in engine.generate(TokensPrompt(prompt_token_ids=t["prompt"] + t["output"]), params,
                                               f"{rid}-trace-{uuid.uuid4().hex[:8]}"):
                pass
            by_pos = final.prompt_logprobs[len(t["prompt"]):]
            best = [_argmax(d) for d in by_pos[1:]]
            rank_off += sum(1 for d in by_pos[1:] if len(d) > 1 and next(iter(d.values())).rank == 1)
            out[rid] = best + list(final.outputs[0].token_ids[:1])
    finally:
        engine.shutdown()
    return {"traces": out, "rank_mismatches": rank_off, "vllm_version": vllm_version()}


def _argmax(d: dict[int, Any]) -> int:
    """The top-1 token of one ``prompt_logprobs=1`` position. vLLM builds the dict as the prompt
    token first (with its computed rank), then the top-k (ranked by construction, 1..k), so the
    top-1 is the last key whether or not it is the prompt token: no reliance on the computed rank.
    A prompt token that claims rank 1 beside a different top-1 is counted (``rank_mismatches``),
    so the trace would say if that rank were ever wrong (0 in every run so far)."""
    return list(d)[-1]


def run_job(job: Job, phase: Phase) -> RawRun:
    """Start the engine for ``job['engine_kwargs']``, warm up, replay, return a RawRun dict (or, for a
    trace job, a draft's teacher-forced argmax over the baseline's outputs: ``_trace``)."""
    if "trace" in job:
        return asyncio.run(_trace(job, phase))  # type: ignore[return-value]
    return asyncio.run(_run(job, phase))
