"""Workload formats users already have, turned into the native form (then validated as native).

- ``native``: one object a line, as in DESIGN.md (``prompt`` or ``messages`` plus sampling fields).
- ``openai-batch``: OpenAI Batch API lines: ``custom_id`` and a ``body`` with ``messages`` or
  ``prompt``, ``max_tokens``/``max_completion_tokens``, ``temperature``, ``top_p``, ``seed``, ``stop``;
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

from typing import Any

from autotune.core.errors import BadInput

FORMATS = ("auto", "native", "openai-batch", "sharegpt", "vllm-bench", "questions")
_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
          "bard": "assistant", "bing": "assistant", "model": "assistant", "system": "system"}
_BODY_FIELDS = ("temperature", "top_p", "top_k", "seed", "stop", "ignore_eos")


def detect(obj: Any) -> str:
    """The format of one record, judged by its keys."""
    if isinstance(obj, dict):
        if "custom_id" in obj and "body" in obj:
            return "openai-batch"
        if "conversations" in obj:
            return "sharegpt"
        if "question_id" in obj:
            return "questions"
    return "native"


def _category(*sources: Any) -> dict[str, Any]:
    """``{"category": ...}`` from the first source dict that has one (validated as native)."""
    for src in sources:
        if isinstance(src, dict) and src.get("category") is not None:
            return {"category": src["category"]}
    return {}


def from_openai_batch(obj: Any, where: str) -> dict[str, Any]:
    if not isinstance(obj, dict) or not isinstance(obj.get("body"), dict):
        raise BadInput(f"{where}: 'body' must be an object (OpenAI batch line), got {obj.get('body') if isinstance(obj, dict) else obj!r:.60}")
    body = obj["body"]
    out: dict[str, Any] = {"id": obj.get("custom_id")}
    if "messages" in body:
        out["messages"] = body["messages"]
    if "prompt" in body:
        out["prompt"] = body["prompt"]
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    if limit is not None:
        out["max_tokens"] = limit
    out.update({k: body[k] for k in _BODY_FIELDS if k in body and body[k] is not None})
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


CONVERTERS = {"openai-batch": from_openai_batch, "sharegpt": from_sharegpt, "questions": from_questions}


def to_native(obj: Any, fmt: str, where: str) -> Any:
    """The native-form object for a record of format ``fmt`` (native and vllm-bench pass through)."""
    conv = CONVERTERS.get(fmt)
    return conv(obj, where) if conv else obj
