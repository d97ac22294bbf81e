"""The served instrument: a trial measured through the exported ``vllm serve`` command, over HTTP.

Why (issue 24, benchmarks/served_gap.py): an in-process AsyncLLM skips what serving costs each
request (HTTP, the OpenAI layer, a client in another process). On 2 cores that was ~25-40 ms of
TTFT a request, paid alike by every config, so it shrinks the faster config's speedup: the
in-process claim sat 13-30% above what `vllm serve` + `vllm bench serve` measured. Served, a trial
measures what users run.

The worker starts the candidate's exact ``vllm serve`` arguments (autotune.serve.export.serve_argv)
in its own process group, so ending the worker ends the server too; requests go to
``/v1/completions`` streamed with ``return_token_ids``, like ``vllm bench serve`` (aiohttp);
vLLM's counters come from ``/metrics`` (Prometheus text, parsed by prometheus_client); the prefix
cache is reset through vLLM's dev endpoint (``VLLM_SERVER_DEV_MODE=1``). What vLLM resolved the
config to (token budget, speculation) is read with vLLM's own parser and config, as `vllm serve`
builds it. No vLLM import at module level.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.run.launcher import SERVE, Launched, launch
from autotune.serve.export import serve_argv
from autotune.serve.servers import HOST, end_pgid, free_port, healthy, tail

SERVER_LOG = "server.log"  # the served instrument's `vllm serve` output, in the trial's folder
SERVER_PGID = "server.pgid"  # beside the server's log: its process group, for the parent to end
READY_TIMEOUT_S = 600.0
SPEC_COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens")
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
# vLLM's engine-side time of each request's prefill and decode (histogram sums, seconds): the
# prefill share of a window without the client's view, which merges chunks when the API process
# falls behind (then TTFT reads as the whole request).
TIME_SUMS = ("vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds")
# Requests the scheduler preempted (KV cache ran short: their blocks freed, recomputed later), and the
# metric whose labels carry the cache config as the engine resolved it (num_gpu_blocks: KV blocks).
PREEMPTIONS = "vllm:num_preemptions"
CACHE_INFO = "vllm:cache_config_info"
# The model runner vLLM ran (autotune.core.runner), as its log says: a V2 worker logs the first line
# once (vllm/v1/worker/gpu_worker.py, cpu_worker.py); vLLM logs the second where it falls back to V1
# (vllm/config/vllm.py ``use_v2_model_runner``: no Triton, or a feature V2 lacks).
V2_LOG, V1_LOG = "Using V2 Model Runner", "using the V1 model runner instead"


@dataclass
class Delta:
    """One streamed chunk of one request, whichever instrument produced it."""

    token_ids: list[int]
    text: str
    finished: bool
    finish_reason: str | None = None
    prompt_token_ids: list[int] | None = None
    spec_decode: dict[str, Any] | None = None
    index: int = 0  # which of a request's n completions (the first is the one judged)


def parse_counters(text: str) -> dict[str, Any]:
    """vLLM's speculative-decoding counters from a ``/metrics`` page (summed over label sets;
    the per-position vector ordered by its ``position`` label)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, Any] = {name: 0 for name in (*SPEC_COUNTERS, PREEMPTIONS)}
    sums: dict[str, float] = {name: 0.0 for name in TIME_SUMS}
    per_pos: dict[int, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.endswith("_sum") and s.name[: -len("_sum")] in sums:
                sums[s.name[: -len("_sum")]] += s.value
            if not s.name.endswith("_total"):
                continue
            name = s.name[: -len("_total")]
            if name in out:
                out[name] += s.value
            elif name == PER_POS:
                pos = int(s.labels.get("position", 0))
                per_pos[pos] = per_pos.get(pos, 0) + s.value
    out = {k: int(v) for k, v in out.items()}
    out[PER_POS] = [int(per_pos[p]) for p in sorted(per_pos)]
    out.update(sums)
    return out


def kv_cache_blocks(text: str) -> int | None:
    """The engine's KV cache in blocks, from a ``/metrics`` page's cache config (None where absent)."""
    from prometheus_client.parser import text_string_to_metric_families

    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == CACHE_INFO and str(s.labels.get("num_gpu_blocks", "")).isdigit():
                return int(s.labels["num_gpu_blocks"])
    return None


def resolved_cudagraphs(vllm_config: Any) -> dict[str, Any] | None:
    """The CUDA-graph mode and capture sizes of the engine's compilation config (autotune.measure.cudagraphs),
    as the front end resolved them; None where there is none."""
    comp = getattr(vllm_config, "compilation_config", None)
    if comp is None:
        return None
    mode = getattr(comp, "cudagraph_mode", None)
    return {"mode": getattr(mode, "name", None) or str(mode),
            "capture_sizes": [int(s) for s in (getattr(comp, "cudagraph_capture_sizes", None) or [])],
            "max_capture_size": getattr(comp, "max_cudagraph_capture_size", None)}


def model_runner(vllm_config: Any, log: str | None = None) -> dict[str, str] | None:
    """The model runner the engine ran, ``{"runner": "v1" or "v2", "from": where it was read}``: from the
    server's log where it says (``V2_LOG``, ``V1_LOG``), else from the engine's config as vLLM resolved
    it (``VllmConfig.use_v2_model_runner``, which reads the engine's environment: a user's
    VLLM_USE_V2_MODEL_RUNNER=0 logs nothing). None where neither says."""
    if log is not None and V2_LOG in log:
        return {"runner": "v2", "from": f"server log ({V2_LOG!r})"}
    if log is not None and V1_LOG in log:
        return {"runner": "v1", "from": f"server log ({V1_LOG!r})"}
    try:
        v2 = bool(vllm_config.use_v2_model_runner)
    except Exception:  # noqa: BLE001 - no config (a stand-in), or one this vLLM cannot say it of
        return None
    return {"runner": "v2" if v2 else "v1", "from": "the engine's config (VllmConfig.use_v2_model_runner)"}


def decoded_logprobs(choice: dict[str, Any]) -> dict[str, Any]:
    """A /v1/completions choice asked with ``logprobs`` and ``return_tokens_as_token_ids`` (tokens
    written "token_id:123") as {token_ids, logprobs, top}, as a teacher-forced score has them."""
    lp = choice["logprobs"]
    ids = [int(t.split(":", 1)[1]) for t in lp["tokens"]]
    return {"token_ids": ids, "logprobs": [round(float(x), 5) for x in lp["token_logprobs"]],
            "top": [[[int(t.split(":", 1)[1]), round(float(v), 5)] for t, v in (d or {}).items()]
                    for d in lp["top_logprobs"]]}


def token_budget(vllm_config: Any) -> int | None:
    """The scheduler's tokens per step (``max_num_batched_tokens``), None where it cannot be read."""
    try:
        return int(vllm_config.scheduler_config.max_num_batched_tokens)
    except (AttributeError, TypeError, ValueError):
        return None


def resolved_speculation(vllm_config: Any) -> dict[str, Any] | None:
    """What vLLM resolved the speculation to (its own config, after defaults): the evidence that a
    knob reached the engine, kept with the trial."""
    spec = getattr(vllm_config, "speculative_config", None)
    if spec is None:
        return None
    from autotune.core.candidate import SPEC_KEYS

    return {k: getattr(spec, k) for k in ("method", *SPEC_KEYS)
            if isinstance(getattr(spec, k, None), (str, int, float, list))}


def _delta(ch: dict[str, Any], data: dict[str, Any]) -> Delta:
    """One streamed choice of /v1/completions (``text``) or /v1/chat/completions (``delta``: its content
    and any tool call's arguments). A chat server's tool parser ends a call with ``tool_calls``: the
    generation stopped as at any stop, so it is recorded as ``stop``."""
    text = ch.get("text")
    if text is None:
        delta = ch.get("delta") or {}
        text = (delta.get("content") or "") + "".join(
            ((tc.get("function") or {}).get("arguments") or "") for tc in delta.get("tool_calls") or ())
    reason = ch.get("finish_reason")
    return Delta(token_ids=list(ch.get("token_ids") or []), text=text or "", finished=reason is not None,
                 finish_reason="stop" if reason == "tool_calls" else reason, index=int(ch.get("index") or 0),
                 prompt_token_ids=ch.get("prompt_token_ids") or data.get("prompt_token_ids"))


@dataclass
class ServedEngine:
    """A `vllm serve` of one candidate, driven over HTTP (see the module docstring)."""

    engine_kwargs: dict[str, Any]
    log_path: Path
    ready_timeout_s: float = READY_TIMEOUT_S
    python: str = sys.executable
    port: int = 0
    proc: subprocess.Popen | Launched | None = None
    vllm_config: Any = None  # as `vllm serve` builds it from the same arguments
    _tok: Any = None
    _session: Any = None

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def model(self) -> str:
        return str(self.engine_kwargs["model"])

    @property
    def served_name(self) -> str:
        """The name requests ask for: the first --served-model-name of the user's flags, else the model."""
        return str((self.engine_kwargs.get("served_model_name") or [self.model])[0])

    def argv(self) -> list[str]:
        """The server's command line: the exported arguments, plus where to listen."""
        from autotune.run.vllm_ext import QUALNAME, needs_reset

        extra = ["--worker-extension-cls", QUALNAME] if needs_reset(self.engine_kwargs) else []
        return [self.python, "-m", SERVE, "serve", *serve_argv(self.engine_kwargs),
                "--host", HOST, "--port", str(self.port), *extra]

    async def start(self) -> float:
        """Start the server, resolve its config meanwhile, wait until healthy; the seconds it took."""
        self.port = self.port or free_port()
        t0 = time.perf_counter()
        self.log_path.write_text("")
        env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}
        # A session of its own, as `vllm serve` runs for users and in `autotune confirm`: Linux
        # schedules sessions as groups (autogroup), and on few cores the server's own group
        # changes how its API process keeps up with the engine (benchmarks/served_gap.py). Its
        # process group is written beside the log, so the parent ends it with the worker's. Forked
        # by the study's launcher when one runs (autotune.run.launcher: no vLLM import), else Popen.
        self.proc = launch(self.argv(), env=env, log_path=self.log_path)
        self.log_path.with_name(SERVER_PGID).write_text(str(self.proc.pid))
        self.vllm_config = await asyncio.to_thread(self._resolve)
        while not healthy(f"{self.base_url}/health"):
            code = self.proc.poll()
            if code is not None:
                raise RuntimeError(f"vllm serve exited before it was ready (exit code {code}): {tail(self.log_path, 6)}")
            if time.perf_counter() - t0 > self.ready_timeout_s:
                raise RuntimeError(f"vllm serve not ready after {self.ready_timeout_s:g} s: {tail(self.log_path, 6)}")
            await asyncio.sleep(0.25)
        # The client shares a core with the API server and the engine core: its collections must not
        # walk what it imported (vLLM, torch), fresh or forked by the launcher (which froze it).
        gc.collect()
        gc.freeze()
        self.attach()
        return time.perf_counter() - t0

    def attach(self) -> None:
        """Open the client's session to the server on ``port``, started here or elsewhere (a
        benchmark's own server: benchmarks/client_gap.py); ``shutdown`` then closes it, and ends
        only a server this engine started. Call it inside the event loop that will use it."""
        import aiohttp

        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600),
                                              connector=aiohttp.TCPConnector(limit=0))

    def _resolve(self) -> Any:
        from vllm.usage.usage_lib import UsageContext

        from autotune.vllm_cli import engine_args_from_serve

        return engine_args_from_serve(serve_argv(self.engine_kwargs)).create_engine_config(
            UsageContext.OPENAI_API_SERVER)

    def get_tokenizer(self) -> Any:
        if self._tok is None:
            from autotune.core.context import load_tokenizer

            self._tok = load_tokenizer(self.engine_kwargs.get("tokenizer") or self.model,
                                       trust_remote_code=bool(self.engine_kwargs.get("trust_remote_code")))
        return self._tok

    def token_budget(self) -> int | None:
        return token_budget(self.vllm_config)

    async def reset_prefix_cache(self) -> None:
        async with self._session.post(f"{self.base_url}/reset_prefix_cache") as r:
            if r.status != 200:
                raise RuntimeError(f"POST /reset_prefix_cache: HTTP {r.status}")

    async def reset_drafter(self) -> None:
        """Empty a proposer's cross-request state (suffix decoding's cache) through vLLM's dev
        ``/collective_rpc`` and the worker extension the server was started with (autotune.run.vllm_ext)."""
        from autotune.run.vllm_ext import RESET, needs_reset

        if not needs_reset(self.engine_kwargs):
            return
        async with self._session.post(f"{self.base_url}/collective_rpc", json={"method": RESET}) as r:
            if r.status != 200:
                raise RuntimeError(f"POST /collective_rpc {RESET}: HTTP {r.status}: {(await r.text())[:200]}")

    async def counters(self) -> dict[str, Any]:
        async with self._session.get(f"{self.base_url}/metrics") as r:
            return parse_counters(await r.text())

    async def kv_cache_blocks(self) -> int | None:
        async with self._session.get(f"{self.base_url}/metrics") as r:
            return kv_cache_blocks(await r.text())

    serves_chat = True  # a chat workload's requests go to its /v1/chat/completions (autotune.run.replay.prompt_text)

    async def stream(self, prompt: str | list[int] | dict[str, Any], sampling: dict[str, Any],
                     rid: str) -> AsyncIterator[Delta]:
        """One request streamed from /v1/completions, or from /v1/chat/completions where ``prompt``
        is a chat body (its messages, tools and structured outputs as logged: the sampling's merged
        ``structured_outputs`` is not sent beside them): a Delta per chunk and completion."""
        if isinstance(prompt, dict):
            path = "/v1/chat/completions"
            body = {"model": self.served_name, **{k: v for k, v in sampling.items() if k != "structured_outputs"},
                    **prompt, "stream": True, "return_token_ids": True}
        else:
            path = "/v1/completions"
            body = {"model": self.served_name, "prompt": prompt, "stream": True, "return_token_ids": True, **sampling}
        async with self._session.post(f"{self.base_url}{path}", json=body, headers={"X-Request-Id": rid}) as resp:
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}: {(await resp.text())[:300]}")
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                data = json.loads(line[6:])
                for ch in data.get("choices") or ():
                    yield _delta(ch, data)

    async def prompt_logprobs(self, ids: list[int], k: int, rid: str) -> list[dict[int, tuple[float, int | None]]]:
        """Each prompt position's {token id: (log-prob, rank)}: the scored token and the top ``k``."""
        body = {"model": self.served_name, "prompt": ids, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": k}
        async with self._session.post(f"{self.base_url}/v1/completions", json=body,
                                      headers={"X-Request-Id": rid}) as resp:
            data = await resp.json()
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}: {str(data)[:300]}")
        by_pos = data["choices"][0].get("prompt_logprobs") or []
        return [{int(t): (float(v["logprob"]), v.get("rank")) for t, v in (d or {}).items()} for d in by_pos]

    async def decode_logprobs(self, ids: list[int], sampling: dict[str, Any], k: int, rid: str) -> dict[str, Any]:
        """Decode ``ids`` with each output token's log-prob and the top ``k``, token ids as vLLM's
        ``return_tokens_as_token_ids`` writes them (autotune.run.replay.decode_drift)."""
        body = {"model": self.served_name, "prompt": ids, **sampling, "logprobs": k,
                "return_tokens_as_token_ids": True, "return_token_ids": True}
        async with self._session.post(f"{self.base_url}/v1/completions", json=body,
                                      headers={"X-Request-Id": rid}) as resp:
            data = await resp.json()
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}: {str(data)[:300]}")
        return decoded_logprobs(data["choices"][0])

    def speculation(self) -> dict[str, Any] | None:
        return resolved_speculation(self.vllm_config)

    def model_runner(self) -> dict[str, str] | None:
        try:
            log = self.log_path.read_text(errors="replace")
        except OSError:
            log = None
        return model_runner(self.vllm_config, log)

    async def shutdown(self) -> None:
        """End the server's process group: SIGTERM (vLLM stops its engine core), SIGKILL after 30 s."""
        if self._session is not None:
            await self._session.close()
        if self.proc is not None:
            await asyncio.to_thread(end_pgid, self.proc.pid, proc=self.proc)
            # ended: the parent must not signal that group id again (it could be reused)
            self.log_path.with_name(SERVER_PGID).unlink(missing_ok=True)

