"""OpenAI request bodies, as gateways and proxies log them, into the native form (issue 52).

One chat or completions request body a line (``{"model": ..., "messages": [...], "stream": true}``),
or the ``body`` of an OpenAI Batch line. Every field falls in one of three groups:

- replayed: the prompt (``messages`` or ``prompt``), ``max_tokens`` / ``max_completion_tokens``,
  sampling (``temperature``, ``top_p``, ``top_k``, ``min_p``, ``seed``, ``stop``, ``n``,
  ``ignore_eos``, penalties, ``min_tokens``), structured outputs (``response_format``,
  ``structured_outputs``, the removed ``guided_*``: autotune.core.structured), ``tools``,
  ``tool_choice``, ``chat_template_kwargs``; and autotune's own ``id``, ``category``,
  ``arrival_s``, ``expect``;
- ignored, counted in one line: fields that change no generated token (``model``, ``stream``,
  ``logprobs``, ``user``, ...);
- anything else changes generation in a way a replay cannot reproduce (``logit_bias``,
  ``use_beam_search``, ``reasoning_effort``, ...) or is unknown: one line naming it, exit 2. A
  field whose value is null, empty or false is taken as absent.

A request without ``temperature`` samples at 1.0 (the OpenAI default vLLM applies where the model's
generation_config.json sets none); one without a token limit gets the native default (or
``--output-len``): both counted in a note, as the server's own defaults may differ.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from autotune.core.errors import BadInput
from autotune.core.structured import GUIDED, GUIDED_IGNORED, from_guided

REPLAYED = ("messages", "prompt", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "n",
            "ignore_eos", "presence_penalty", "frequency_penalty", "repetition_penalty", "min_tokens",
            "response_format", "structured_outputs", "tools", "tool_choice", "chat_template_kwargs",
            "id", "category", "arrival_s", "expect")
IGNORED = frozenset({"model", "stream", "stream_options", "user", "metadata", "store", "service_tier", "logprobs",
                     "top_logprobs", "echo", "parallel_tool_calls", "return_token_ids", "return_tokens_as_token_ids",
                     "request_id", "skip_special_tokens", "spaces_between_special_tokens",
                     "include_stop_str_in_output", "priority", "prompt_cache_key", "safety_identifier", "prediction",
                     "cache_salt", "stream_interval", GUIDED_IGNORED})
# Request fields of OpenAI's or vLLM's that change what is generated in ways a replay does not carry.
REFUSED = frozenset({"logit_bias", "use_beam_search", "best_of", "suffix", "length_penalty", "stop_token_ids",
                     "bad_words", "allowed_token_ids", "truncate_prompt_tokens", "add_special_tokens", "chat_template",
                     "continue_final_message", "add_generation_prompt", "documents", "reasoning_effort", "functions",
                     "function_call", "audio", "modalities", "mm_processor_kwargs", "vllm_xargs", "prompt_embeds",
                     "thinking_token_budget", "repetition_detection", "web_search_options", "logprob_token_ids"})
# Keys that mark a line as a request body as logged (autotune.core.formats.detect).
OPENAI_ONLY = IGNORED | REFUSED | set(GUIDED) | {"max_completion_tokens"}
OPENAI_TEMPERATURE = 1.0
DEFAULTED_TEMPERATURE = "without temperature: sampled at 1.0, the OpenAI default"
DEFAULTED_MAX_TOKENS = "without max_tokens: the native default or --output-len"


def _absent(value: Any) -> bool:
    return value is None or value is False or value == {} or value == [] or value == ""


def from_openai_body(body: dict[str, Any], where: str, tally: Counter[str] | None = None) -> dict[str, Any]:
    """The native-form object for one request body; ``tally`` counts the fields ignored and the
    defaults taken (for the workload's notes)."""
    tally = tally if tally is not None else Counter()
    out: dict[str, Any] = {}
    for key, value in body.items():
        if key in REPLAYED or key in GUIDED or key in ("max_completion_tokens", "metadata"):  # metadata: the category
            continue
        if _absent(value):
            continue
        if key in IGNORED:
            tally[key] += 1
        else:
            what = ("changes what is generated and cannot be replayed" if key in REFUSED
                    else "is no OpenAI or vLLM request field autotune knows")
            raise BadInput(f"{where}: field {key!r} {what}; remove it from the log to tune without it")
    out.update({k: body[k] for k in REPLAYED if body.get(k) is not None})
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    if limit is not None:
        out["max_tokens"] = limit
    else:
        tally[DEFAULTED_MAX_TOKENS] += 1
    if body.get("temperature") is None:
        out["temperature"] = OPENAI_TEMPERATURE
        tally[DEFAULTED_TEMPERATURE] += 1
    guided = from_guided(where, body)
    if guided is not None:
        out["structured_outputs"] = guided
        tally["guided_* (removed in vLLM 0.32: a server answers them unconstrained): replayed as structured_outputs"] += 1
    return out


def notes(tally: Counter[str]) -> list[str]:
    """One line for the fields ignored, and one a default taken: what the replay differs from the log by."""
    out = []
    ignored = [(k, n) for k, n in tally.items() if k in IGNORED]
    if ignored:
        out.append("ignored (no effect on generation): " + ", ".join(f"{k} on {n}" for k, n in sorted(ignored)))
    out += [f"{n} request(s) {k}" for k, n in tally.items() if k not in IGNORED]
    return out
