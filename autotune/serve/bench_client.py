"""What `vllm bench serve` sends for a study's workload, and what it reports back.

The client takes one dataset file (`--dataset-name custom`: a prompt and its output length a line,
and where a request has them its chat messages and own body fields, autotune.vllm_cli) and one set
of flags for every request; this builds both from the workload and the study's load, with a note for
whatever of the workload the client cannot carry. Reads the client's result JSON.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.core.errors import BadInput
from autotune.core.workload import first_prompt
from autotune.serve.servers import ServeFailed

DEFAULT_WARMUPS = 3


@dataclass(frozen=True)
class ClientPlan:
    """What ``vllm bench serve`` sends: its dataset rows, its flags (all but the server and result
    file), and what of the workload it cannot carry."""

    rows: list[dict[str, Any]]
    flags: list[str]
    notes: list[str] = field(default_factory=list)
    warmup: dict[str, Any] = field(default_factory=dict)  # autotune.serve.warmup: sent before, never measured


# ---------------------------------------------------------------------------------------------
# What the client sends


def _mode(values: list[Any]) -> tuple[Any, bool]:
    """The most common value, and whether every value is that one."""
    counts = Counter(values)
    value, n = counts.most_common(1)[0]
    return value, n == len(values)


def load_flags(label: str | None, *, requests: list[Any], seed: int = 0) -> tuple[list[str], list[str]]:
    """``vllm bench serve`` flags for the study's load (its label in best.json), and notes.

    ``concurrency=N``: closed loop; ``batch``: everything at once; ``poisson=R/s``: Poisson arrivals
    at R/s (seeded); ``replay``: the client cannot replay offsets from a custom dataset, so Poisson
    arrivals at the workload's mean rate, said in a note.
    """
    from autotune.core.load import parse_load

    text = (label or "concurrency=1").strip()
    if text.startswith("poisson=") and text.endswith("/s"):
        text = text[:-2]
    try:
        load = parse_load(text, seed=seed)
    except BadInput:
        raise BadInput(f"best.json: key 'load': expected concurrency=N, batch, poisson=R/s or replay, "
                       f"got {label!r}") from None
    if load.kind == "concurrency":
        return ["--request-rate", "inf", "--max-concurrency", str(load.concurrency)], []
    if load.kind == "batch":
        return ["--request-rate", "inf"], []
    if load.kind == "poisson":
        return ["--request-rate", f"{load.rate:g}", "--burstiness", "1", "--seed", str(seed)], []
    arrivals = sorted(r.arrival_s for r in requests if r.arrival_s is not None)
    span = arrivals[-1] - arrivals[0] if len(arrivals) > 1 else 0.0
    if span <= 0:
        return ["--request-rate", "inf"], ["replay: the workload's arrivals span no time; sent all at once"]
    rate = (len(arrivals) - 1) / span
    return (["--request-rate", f"{rate:.6g}", "--burstiness", "1", "--seed", str(seed)],
            [f"replay: vllm bench serve cannot replay arrival offsets from a custom dataset; Poisson arrivals "
             f"at the workload's mean rate, {rate:.3g} requests/s"])


def client_plan(requests: list[Any], *, load: str | None, render: Callable[[list[dict[str, str]]], str] | None,
                warmups: int = DEFAULT_WARMUPS, seed: int = 0) -> ClientPlan:
    """The bench dataset and flags for ``requests`` (``autotune.core.workload.Request``) at ``load``.

    Prompts are sent as text to /v1/completions, as the study's engine receives them: a ``prompt``
    as written, chat ``messages`` rendered with the model's chat template (``render``), so the
    client's own template step is skipped (``--skip-chat-template``). A workload that needs the chat
    endpoint (``Workload.endpoint``: tools, a response format on chat) goes to /v1/chat/completions
    instead, as the study's client sends it: each row carries its ``chat_messages``, and its text
    only counts the prompt's tokens. Each request keeps its own ``max_tokens`` (the custom dataset's
    ``output_tokens`` with ``--custom-output-len -1``) and its own ``n``, structured outputs, tools and
    further sampling (the row's ``request_overrides``: autotune.vllm_cli carries both columns into
    vLLM's own per-request fields). The client's flags set the most common sampling, ``ignore_eos``
    and ``stop`` for all; a request that differs, or has a seed, carries its own in its overrides.
    """
    if not requests:
        raise BadInput("workload: no requests to send")
    chat = any(r.needs_chat for r in requests)  # autotune.core.workload.Workload.endpoint
    notes: list[str] = []
    sampling, _ = _mode([(r.temperature, r.top_p, r.top_k) for r in requests])
    ignore_eos, _ = _mode([r.ignore_eos for r in requests])
    stop, _ = _mode([r.stop for r in requests])
    rows = []
    for r in requests:
        if r.prompt is None and render is None:
            raise BadInput(f"request {r.id!r}: chat messages need the model's tokenizer to render them")
        row: dict[str, Any] = {"prompt": first_prompt(r, render), "output_tokens": r.max_tokens}
        over = {**_own_sampling(r, sampling, ignore_eos, stop), **request_overrides(r, chat=chat)}
        if chat:
            row["chat_messages"] = over.pop("messages")
        if over:
            row["request_overrides"] = over
        rows.append(row)
    if any(r.turns and len(r.turns) > 1 for r in requests):
        notes.append("multi-turn requests: the client sends each one's first turn only")
    flags = ["--temperature", f"{sampling[0]:g}", "--top-p", f"{sampling[1]:g}"]
    if sampling[2] > 0:
        flags += ["--top-k", str(sampling[2])]
    if ignore_eos:
        flags.append("--ignore-eos")
    if stop:
        flags += ["--extra-body", json.dumps({"stop": list(stop)})]
    lf, ln = load_flags(load, requests=requests, seed=seed)
    endpoint = ["--backend", "openai-chat", "--endpoint", "/v1/chat/completions"] if chat else \
        ["--backend", "openai", "--endpoint", "/v1/completions"]
    flags += [*endpoint, "--dataset-name", "custom",
              "--custom-output-len", "-1", "--skip-chat-template", "--disable-shuffle", "--no-oversample",
              # vLLM's client warms on (and ready-checks with) the first measured request: never; the
              # warm-up is autotune.serve.warmup's, outside the measured set
              "--num-prompts", str(len(rows)), "--num-warmups", "0", "--ready-check-timeout-sec", "0", *lf,
              "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,95,99",
              # each request's chunk times, so TPOT is judged on whether the stream timed tokens (bench_requests)
              "--save-detailed", "--disable-tqdm"]
    from autotune.serve.warmup import warmup_spec

    return ClientPlan(rows=rows, flags=flags, notes=notes + ln, warmup=warmup_spec(rows, warmups))


def _own_sampling(r: Any, common: tuple[float, float, int], ignore_eos: bool, stop: tuple[str, ...]) -> dict[str, Any]:
    """A request's sampling where it is not the client's common setting, and its seed."""
    out: dict[str, Any] = {}
    if (r.temperature, r.top_p, r.top_k) != common:
        out.update(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k)
    if r.ignore_eos != ignore_eos:
        out["ignore_eos"] = r.ignore_eos
    if r.stop != stop:
        out["stop"] = list(r.stop)
    if r.seed is not None:
        out["seed"] = r.seed
    return out


def request_overrides(r: Any, *, chat: bool) -> dict[str, Any]:
    """What a request's body carries beyond the client's common flags: ``n``, further sampling and
    its structured outputs (merged, for /v1/completions), or on the chat endpoint its messages and
    chat fields as written (tools, response_format, ...)."""
    out: dict[str, Any] = {**({"n": r.n} if r.n != 1 else {}), **r.sampling_extra}
    if chat:
        return {**out, **r.chat_body()}
    structured = r.structured()
    return {**out, **({"structured_outputs": structured} if structured is not None else {})}


# ---------------------------------------------------------------------------------------------
# Reading a bench result


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def read_bench(path: Path, *, expected: int) -> dict[str, Any]:
    """A ``vllm bench serve --save-result`` JSON, checked complete: every request succeeded."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ServeFailed(f"{path}: no readable vllm bench serve result ({e})") from None
    done, failed = data.get("completed"), data.get("failed") or 0
    if done != expected or failed:
        raise ServeFailed(f"{path}: incomplete run: {done} of {expected} requests completed, {failed} failed")
    if not _num(data.get("output_throughput")):
        raise ServeFailed(f"{path}: no output_throughput in the result")
    return data


def _scaled(x: Any, factor: float) -> float | None:
    v = _num(x)
    return None if v is None else v * factor


def bench_requests(data: dict[str, Any]) -> list[dict[str, Any]] | None:
    """A ``vllm bench serve --save-detailed`` result's requests as request records (autotune.core.records),
    for the rule on whether the stream timed tokens (autotune.measure.coalescing.stream_coalesced): each
    chunk's arrival from the request's TTFT and its gaps between chunks, its output tokens spread evenly
    over its chunks (the client keeps no per-chunk count, so only arrival times tell steps apart).
    None where the result has no per-request detail (saved without --save-detailed)."""
    ttfts, itls, lens = data.get("ttfts"), data.get("itls"), data.get("output_lens")
    if not (isinstance(ttfts, list) and isinstance(itls, list) and isinstance(lens, list)) \
            or not len(ttfts) == len(itls) == len(lens):
        return None
    errors = data.get("errors") or [""] * len(ttfts)
    out = []
    for i, (ttft, gaps, n) in enumerate(zip(ttfts, itls, lens)):
        times = [float(ttft or 0.0)]
        for gap in gaps or []:
            times.append(times[-1] + float(gap))
        per, extra = divmod(int(n or 0), len(times))
        chunks = [[t, per + (1 if j < extra else 0)] for j, t in enumerate(times)]
        chunks = [c for c in chunks if c[1] > 0]
        err = errors[i] if i < len(errors) else ""
        out.append({"id": str(i), "start": 0.0, "end": times[-1], "chunks": chunks, "token_ids": [], "text": "",
                    "finish_reason": None if err else "length", "error": err or None, "prompt_tokens": None})
    return out
