"""The records that cross between layers, typed: job -> raw run -> measurement (-> verdict).

They stay plain JSON-able dicts (a job and a raw run cross a process boundary as JSON files, a
measurement is stored in Optuna's user attributes), typed as TypedDicts so that a reader and a
writer agree on the keys. The verdict is a dataclass: ``autotune.measure.validate.Verdict``.
"""

from __future__ import annotations

from typing import Any, TypedDict

try:  # Python 3.11+
    from typing import NotRequired
except ImportError:  # pragma: no cover
    from typing_extensions import NotRequired


class JobRequest(TypedDict):
    """One workload request as a worker replays it."""

    id: str
    sampling: dict[str, Any]  # vLLM SamplingParams keyword arguments
    expect: dict[str, Any] | None
    prompt: NotRequired[str]
    messages: NotRequired[list[dict[str, str]]]
    turns: NotRequired[list[str]]  # a conversation, each turn sent after the model's own answer
    category: NotRequired[str]
    arrival_s: NotRequired[float]
    render: NotRequired[dict[str, Any]]  # the chat template's kwargs besides the messages (tools, ...)
    chat: NotRequired[dict[str, Any]]  # the chat body, where the workload goes to /v1/chat/completions


class Replay(TypedDict):
    """How a worker replays the workload."""

    load: dict[str, Any]  # autotune.core.load.LoadPattern.to_dict()
    extra_loads: list[dict[str, Any]]
    repeats: int
    max_repeats: int
    warmup: int
    samples: int
    sample_tokens: int
    instrument: NotRequired[str]  # "served" or "inprocess" (autotune.cli.app.Instrument)


class Job(TypedDict):
    """What a worker runs: one candidate's engine, the requests, the replay settings."""

    engine_kwargs: dict[str, Any]
    requests: list[JobRequest]
    replay: Replay
    engine_module: str  # autotune.run.engine, or a FAKE engine in orchestration tests
    reference: NotRequired[dict[str, list[int]]]  # request id -> the baseline's greedy tokens, to score
    # Greedy request id -> the reference's tokens: each greedy output that differs from them is scored
    # teacher-forced (None: scored whatever they are). autotune.run.replay.score_own.
    judge: NotRequired[dict[str, list[int] | None]]
    drift: NotRequired[bool]  # the baseline: decode its greedy requests again with log-probs (autotune.run.replay.decode_drift)
    # A lossy config with speculation: the same config without it, run in a process of its own as
    # the reference of its speculation (autotune.run.evaluate.unspeculated_job, autotune.run.worker.run_trial).
    unspeculated: NotRequired[Job]
    # A job that runs no vLLM engine (the EAGLE-3 trace) says what it asks of the GPU:
    # {"utilization": the study's gpu_memory_utilization or None, "devices": devices per engine}.
    gpu_memory: NotRequired[dict[str, Any]]


class RequestRecord(TypedDict):
    """One request as the engine saw it: raw timestamps (seconds from the window start) and tokens."""

    id: str
    start: float
    end: float
    # [arrival time, tokens in this streamed chunk], plus the completion's index where it is not 0 (n > 1)
    chunks: list[list[float]]
    token_ids: list[int]
    text: str
    finish_reason: str | None
    error: str | None
    prompt_tokens: int | None
    prompt_token_ids: NotRequired[list[int]]


class Window(TypedDict):
    """One measured replay of the whole workload, on a cold prefix cache."""

    window_s: float
    requests: list[RequestRecord]
    spec_counters: dict[str, Any]  # vLLM's speculative-decoding counters, diffed around the window


class RawRun(TypedDict):
    """What a worker returns: every window, at every load level, plus the correctness evidence."""

    engine_init_s: float
    warmup_s: float
    windows: list[Window]
    levels: dict[str, list[Window]]  # extra load level label -> its windows
    samples: dict[str, list[list[int]]]  # sampled request id -> draws (token ids)
    scores: NotRequired[dict[str, dict[str, Any]]]  # request id -> teacher-forced log-probs of a path
    own_scores: NotRequired[dict[str, dict[str, Any]]]  # the same, of the run's own differing greedy outputs
    decode_logprobs: NotRequired[dict[str, dict[str, Any]]]  # the baseline's greedy decodes with their top log-probs
    # The job's unspeculated reference run: {"outputs": request records, "samples": draws}, or {"error": why}.
    unspeculated: NotRequired[dict[str, Any]]
    vllm_version: str
    load: dict[str, Any]
    dtype: NotRequired[str]  # the dtype the engine computed in, as vLLM resolved it (in-process runs)
    # how the worker and its server came to exist: "forked" (the study's launcher) or "fresh"
    started: NotRequired[dict[str, str]]
    kv_cache_blocks: NotRequired[int | None]  # the engine's KV cache in blocks, as vLLM sized it
    model_runner: NotRequired[str]  # "v1" or "v2": the model runner the engine ran (autotune.core.runner)
    model_runner_from: NotRequired[str]  # where that was read: the server's log, or the engine's config


# A measurement (autotune.measure.metrics.measure_run) is a flat dict: metric name -> value, with
# ``metric@level`` keys for the extra load levels, ``metric_mad`` and ``metric_windows`` spreads,
# acceptance (``acceptance_rate``, ``mean_accepted_length``, ``acceptance_by_pos``) and counts
# (``windows``, ``completed``, ``incomplete``, ``requests``). TPOT and ITL are NaN where every window's
# stream delivered tokens in bursts (``windows_coalesced`` of ``windows``, ``unstepped_share``, and the
# reason in ``latency_not_measured``: autotune.measure.coalescing). Its keys are open-ended (one per
# level), so it is a mapping, not a TypedDict.
Measurement = dict[str, Any]
