"""Workload formats users already have, turned into the native form (then validated as native).

- ``native``: one object a line, as in DESIGN.md (``prompt`` or ``messages`` plus sampling fields).
- ``openai``: OpenAI chat or completions request bodies as gateways log them (``model``,
  ``messages`` or ``prompt``, ``stream``, ``max_completion_tokens``, ``response_format``, ``n``,
  ``tools``, ...): autotune.core.request_body says which fields are replayed, ignored or refused.
  Detected by a ``model`` key, or a key only such bodies have (``max_completion_tokens``, ``stream``, ...).
- ``openai-batch``: OpenAI Batch API lines: ``custom_id`` and a ``body`` read as an ``openai`` line;
  the category from ``metadata.category`` (of the body, or of the line).
- ``sharegpt``: ``conversations`` of ``{from, value}`` turns (JSONL, or one JSON array as the
  public dumps are); the request is the conversation up to its last human turn; the category from
  ``category`` or, where present, the dump's ``source``.
- ``questions``: Spec-Bench and MT-Bench question files: ``question_id``, ``category`` and
  ``turns`` (the user turns; MT-Bench's ``reference`` answers, for judges, are not sent). Which
  turns are sent is ``load_workload``'s ``turns``.
- ``vllm-bench``: ``vllm bench serve`` custom JSONL, ``prompt`` only; output length from
  ``--output-len`` (it is native form with a default ``max_tokens``).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from autotune.core.errors import BadInput
from autotune.core.request_body import OPENAI_ONLY, from_openai_body

FORMATS = ("auto", "native", "openai", "openai-batch", "sharegpt", "vllm-bench", "questions")
_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
          "bard": "assistant", "bing": "assistant", "model": "assistant", "system": "system"}


def detect(obj: Any) -> str:
    """The format of one record, judged by its keys."""
    if isinstance(obj, dict):
        if "custom_id" in obj and "body" in obj:
            return "openai-batch"
        if "conversations" in obj:
            return "sharegpt"
        if "question_id" in obj:
            return "questions"
        if "model" in obj or set(obj) & OPENAI_ONLY:  # a request body as logged: the OpenAI form
            return "openai"
    return "native"


def _category(*sources: Any) -> dict[str, Any]:
    """``{"category": ...}`` from the first source dict that has one (validated as native)."""
    for src in sources:
        if isinstance(src, dict) and src.get("category") is not None:
            return {"category": src["category"]}
    return {}


def from_openai(obj: Any, where: str, tally: Counter[str] | None = None) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise BadInput(f"{where}: expected a JSON object (an OpenAI request body), got {type(obj).__name__}")
    return {**from_openai_body(obj, where, tally), **_category(obj, obj.get("metadata"))}


def from_openai_batch(obj: Any, where: str, tally: Counter[str] | None = None) -> dict[str, Any]:
    if not isinstance(obj, dict) or not isinstance(obj.get("body"), dict):
        raise BadInput(f"{where}: 'body' must be an object (OpenAI batch line), got {obj.get('body') if isinstance(obj, dict) else obj!r:.60}")
    body = obj["body"]
    out = {**from_openai_body(body, where, tally), "id": obj.get("custom_id")}
    out.update(_category(body.get("metadata"), obj.get("metadata")))
    return out


def from_sharegpt(obj: Any, where: str) -> dict[str, Any]:
    turns = obj.get("conversations") if isinstance(obj, dict) else None
    if not isinstance(turns, list) or not turns:
        raise BadInput(f"{where}: 'conversations' must be a non-empty list of {{from, value}} turns")
    messages = []
    for i, t in enumerate(turns):
        if not (isinstance(t, dict) and isinstance(t.get("value"), str) and t.get("from") in _ROLES):
            raise BadInput(f"{where}: 'conversations[{i}]' must have 'from' in {sorted(_ROLES)} and a string "
                           f"'value', got {t!r:.80}")
        messages.append({"role": _ROLES[t["from"]], "content": t["value"]})
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=None)
    if last_user is None:
        raise BadInput(f"{where}: 'conversations' has no human turn to send")
    out: dict[str, Any] = {"messages": messages[:last_user + 1]}
    if "id" in obj:
        out["id"] = obj["id"]
    source = obj.get("source")  # the public dumps' origin tag, where present
    out.update(_category(obj, {"category": source} if isinstance(source, str) else None))
    return out


def from_questions(obj: Any, where: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise BadInput(f"{where}: expected a JSON object (a question line), got {type(obj).__name__}")
    if "turns" not in obj:
        raise BadInput(f"{where}: 'turns' is missing; expected a non-empty list of strings (the user turns)")
    qid = obj.get("question_id")
    if qid is not None and (isinstance(qid, bool) or not isinstance(qid, (str, int))):
        raise BadInput(f"{where}: 'question_id' must be a string or an integer, got {qid!r:.60}")
    out = {k: v for k, v in obj.items() if k not in ("question_id", "reference")}
    out["id"] = qid
    return out


CONVERTERS = {"sharegpt": from_sharegpt, "questions": from_questions}
BODIES = {"openai": from_openai, "openai-batch": from_openai_batch}  # these count what they ignore


def to_native(obj: Any, fmt: str, where: str, tally: Counter[str] | None = None) -> Any:
    """The native-form object for a record of format ``fmt`` (native and vllm-bench pass through);
    ``tally``: what the OpenAI forms ignored or took a default for (autotune.core.request_body.notes)."""
    if fmt in BODIES:
        return BODIES[fmt](obj, where, tally)
    conv = CONVERTERS.get(fmt)
    return conv(obj, where) if conv else obj
