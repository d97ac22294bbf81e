"""The native form's fields and the check of each: bad input is one line naming the file, the
line and the key, and what was expected (autotune.core.workload reads the records through them)."""

from __future__ import annotations

import math
import re
from typing import Any

from autotune.core.errors import BadInput

MAX_TOKENS_LIMIT = 1_000_000
# Sampling fields vLLM takes as they are (SamplingParams and the OpenAI body alike), each with its range.
SAMPLING_EXTRA = {"presence_penalty": (-2.0, 2.0), "frequency_penalty": (-2.0, 2.0), "repetition_penalty": (1e-9, 10.0),
                  "min_p": (0.0, 1.0), "min_tokens": (0, MAX_TOKENS_LIMIT)}
CHAT_FIELDS = ("tools", "tool_choice", "response_format", "structured_outputs", "chat_template_kwargs")
FIELDS = {"prompt", "messages", "turns", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop",
          "ignore_eos", "arrival_s", "id", "expect", "category", "n", *CHAT_FIELDS, *SAMPLING_EXTRA}
MAX_N = 128
EXPECT_KEYS = {"json", "regex", "contains"}


def num(where: str, key: str, value: Any, *, lo: float, hi: float, integer: bool = False) -> Any:
    ok_type = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok_type or (isinstance(value, float) and not math.isfinite(value)):
        kind = "an integer" if integer else "a number"
        raise BadInput(f"{where}: '{key}' must be {kind} in [{lo:g}, {hi:g}], got {value!r}")
    if not lo <= value <= hi:
        raise BadInput(f"{where}: '{key}' must be in [{lo:g}, {hi:g}], got {value!r}")
    return value


def _content(where: str, i: int, m: dict[str, Any]) -> str | None:
    """A message's content as text: a string, text parts joined by newlines (as vLLM renders them
    for a string-content chat template), or None beside ``tool_calls``."""
    c = m.get("content")
    if isinstance(c, str):
        return c
    if c is None and m.get("tool_calls"):
        return None
    if isinstance(c, list) and c and all(isinstance(x, dict) and x.get("type") == "text" and isinstance(x.get("text"), str)
                                         for x in c):
        return "\n".join(x["text"] for x in c)
    raise BadInput(f"{where}: 'messages[{i}].content' must be a string or a list of text parts (other parts, such as "
                   f"images, cannot be replayed), got {c!r:.80}")


def messages(where: str, value: Any) -> tuple[dict[str, Any], ...]:
    """Chat messages: a string ``role`` and text ``content`` each; a message's other keys (``tool_calls``,
    ``tool_call_id``, ``name``) are kept, for the chat template and the chat endpoint."""
    if not isinstance(value, list) or not value:
        raise BadInput(f"{where}: 'messages' must be a non-empty list of {{role, content}} objects")
    out = []
    for i, m in enumerate(value):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str)):
            raise BadInput(f"{where}: 'messages[{i}]' must be an object with string 'role' and 'content', got {m!r:.80}")
        out.append({**m, "content": _content(where, i, m)})
    return tuple(out)


def turns(where: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise BadInput(f"{where}: 'turns' must be a non-empty list of strings (the user turns), got {value!r:.60}")
    for i, t in enumerate(value):
        if not isinstance(t, str):
            raise BadInput(f"{where}: 'turns[{i}]' must be a string, got {type(t).__name__} {t!r:.40}")
        if not t.strip():
            raise BadInput(f"{where}: 'turns[{i}]' is empty; expected the text of a user turn")
    return tuple(value)


def expect(where: str, expect: Any) -> dict[str, Any]:
    """The request's expectations, each value checked here: a bad one found only when the candidate's
    outputs are judged (autotune.measure.validate.check_expect) would end the study after the baseline ran."""
    if not isinstance(expect, dict) or set(expect) - EXPECT_KEYS:
        raise BadInput(f"{where}: 'expect' must be an object with keys from {sorted(EXPECT_KEYS)}, got {expect!r}")
    got = {k: f"{type(v).__name__} {v!r:.60}" for k, v in expect.items()}
    if "json" in expect and not isinstance(expect["json"], bool):
        raise BadInput(f"{where}: 'expect.json' must be true or false, got {got['json']}")
    if "contains" in expect and not (isinstance(expect["contains"], str) and expect["contains"]):
        raise BadInput(f"{where}: 'expect.contains' must be a non-empty string, got {got['contains']}")
    if "regex" in expect:
        if not isinstance(expect["regex"], str):
            raise BadInput(f"{where}: 'expect.regex' must be a string (a Python regular expression), got {got['regex']}")
        try:
            re.compile(expect["regex"])
        except (re.error, RecursionError, OverflowError) as e:
            raise BadInput(f"{where}: 'expect.regex' must be a valid regular expression (Python re), "
                           f"got {expect['regex']!r:.60}: {' '.join(str(e).split())}") from None
    return expect


def generation(where: str, obj: dict[str, Any]) -> dict[str, Any]:
    """The Request fields beyond the prompt and the basic sampling: n, structured outputs, tools,
    template kwargs and further sampling, each checked (autotune.core.structured)."""
    from autotune.core.structured import check_both, check_response_format, check_structured_outputs, check_tools

    so, rf = obj.get("structured_outputs"), obj.get("response_format")
    so = check_structured_outputs(where, so) if so is not None else None
    rf = check_response_format(where, rf) if rf is not None else None
    check_both(where, so, rf)
    tools, choice, kwargs = obj.get("tools"), obj.get("tool_choice"), obj.get("chat_template_kwargs")
    check_tools(where, tools, choice)
    if kwargs is not None and not isinstance(kwargs, dict):
        raise BadInput(f"{where}: 'chat_template_kwargs' must be an object, got {kwargs!r:.60}")
    chat_only = [k for k in ("tools", "tool_choice", "chat_template_kwargs") if obj.get(k) is not None]
    if chat_only and obj.get("messages") is None:
        raise BadInput(f"{where}: {chat_only[0]!r} needs chat 'messages' (a prompt, or turns, is sent as text)")
    if rf is not None and obj.get("turns") is not None:
        raise BadInput(f"{where}: 'response_format' on 'turns' cannot be replayed: give each turn as its own "
                       "'messages' request, or use 'structured_outputs'")
    n = num(where, "n", obj.get("n", 1), lo=1, hi=MAX_N, integer=True)
    if n > 1 and obj.get("temperature", 0.0) == 0:
        raise BadInput(f"{where}: 'n' is {n} with temperature 0 (greedy): vLLM refuses it (n must be 1 when using "
                       "greedy sampling), and a service that ran it sampled: give its temperature")
    extra = {k: num(where, k, obj[k], lo=lo, hi=hi, integer=k == "min_tokens")
             for k, (lo, hi) in SAMPLING_EXTRA.items() if obj.get(k) is not None}
    return {"n": n, "structured_outputs": so,
            "response_format": rf, "tools": tools, "tool_choice": choice, "chat_template_kwargs": kwargs,
            "sampling_extra": extra}

