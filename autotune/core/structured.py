"""Structured outputs and tools as a request carries them, checked before any engine starts.

A service that constrains its output (JSON of a schema, a regex, a choice) constrains what a
drafter can guess and what the target accepts, so a study replays the constraint the service uses.
vLLM 0.32 takes it two ways, both kept as written (plain data: no vLLM here):

- ``structured_outputs``: vLLM's own object, one constraint of ``json`` (a schema), ``regex``,
  ``choice``, ``grammar``, ``json_object`` or ``structural_tag``, with options;
- ``response_format``: OpenAI's, ``{"type": "json_object"}`` or ``{"type": "json_schema",
  "json_schema": {"name": ..., "schema": {...}}}`` (``text``: no constraint), which vLLM turns into
  ``structured_outputs`` (``json_object: true``, ``json: schema``), as ``merged`` does.

The ``guided_*`` request fields were removed in vLLM 0.32: a server now answers them with HTTP 200
and unconstrained output (``vllm/entrypoints/serve/engine/protocol.py``, ``_REMOVED_GUIDED_FIELDS``).
``from_guided`` maps them to ``structured_outputs``, the constraint the client meant.
"""

from __future__ import annotations

import json
from typing import Any

from autotune.core.errors import BadInput

CONSTRAINTS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
OPTIONS = {"disable_any_whitespace": bool, "disable_additional_properties": bool, "whitespace_pattern": str}
# vLLM < 0.32's request fields -> structured_outputs keys. guided_decoding_backend has no per-request
# counterpart any more (the server's --structured-outputs-config picks the backend): ignored.
GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar",
          "guided_whitespace_pattern": "whitespace_pattern"}
GUIDED_IGNORED = "guided_decoding_backend"
TOOL_CHOICES = ("none", "auto", "required")


def _type_ok(key: str, value: Any) -> bool:
    if key == "json":
        return isinstance(value, dict) or (isinstance(value, str) and _is_json(value))
    if key == "choice":
        return isinstance(value, list) and bool(value) and all(isinstance(c, str) for c in value)
    if key == "json_object":
        return isinstance(value, bool)
    return isinstance(value, str) and bool(value)


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def check_structured_outputs(where: str, value: Any) -> dict[str, Any]:
    """A ``structured_outputs`` object as vLLM takes it: one constraint, its options."""
    expected = f"an object with one of {', '.join(CONSTRAINTS)} (and options {', '.join(OPTIONS)})"
    if not isinstance(value, dict):
        raise BadInput(f"{where}: 'structured_outputs' must be {expected}, got {value!r:.60}")
    unknown = sorted(set(value) - set(CONSTRAINTS) - set(OPTIONS))
    if unknown:
        raise BadInput(f"{where}: 'structured_outputs.{unknown[0]}' is not a key vLLM takes; expected {expected}")
    given = [k for k in CONSTRAINTS if value.get(k) is not None]
    if len(given) != 1:
        raise BadInput(f"{where}: 'structured_outputs' must set exactly one of {', '.join(CONSTRAINTS)}, "
                       f"got {', '.join(given) or 'none'}")
    key = given[0]
    if not _type_ok(key, value[key]):
        kind = {"json": "a JSON schema (object or JSON text)", "choice": "a non-empty list of strings",
                "json_object": "true or false"}.get(key, "a non-empty string")
        raise BadInput(f"{where}: 'structured_outputs.{key}' must be {kind}, got {value[key]!r:.60}")
    for opt, kind in OPTIONS.items():
        if value.get(opt) is not None and not isinstance(value[opt], kind):
            raise BadInput(f"{where}: 'structured_outputs.{opt}' must be {'true or false' if kind is bool else 'a string'}"
                           f", got {value[opt]!r:.60}")
    return {k: v for k, v in value.items() if v is not None}


def check_response_format(where: str, value: Any) -> dict[str, Any]:
    """An OpenAI ``response_format``: ``text``, ``json_object`` or ``json_schema`` with its schema."""
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "structural_tag":
        raise BadInput(f"{where}: 'response_format' of type 'structural_tag' cannot be replayed; give it as "
                       "'structured_outputs': {\"structural_tag\": \"...\"}")
    if kind not in ("text", "json_object", "json_schema"):
        raise BadInput(f"{where}: 'response_format' must be an object with 'type' text, json_object or json_schema, "
                       f"got {value!r:.80}")
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not (isinstance(spec, dict) and isinstance(spec.get("schema"), dict)):
            raise BadInput(f"{where}: 'response_format.json_schema' must be an object with the 'schema' "
                           f"(a JSON schema object) and a 'name', got {spec!r:.80}")
    return value


def merged(structured_outputs: dict[str, Any] | None, response_format: dict[str, Any] | None) -> dict[str, Any] | None:
    """The structured outputs vLLM applies (``structured_outputs_from_response_format``): the
    response format's constraint over ``structured_outputs``; None where neither constrains."""
    kind = (response_format or {}).get("type")
    if kind not in ("json_object", "json_schema"):
        return structured_outputs
    over = {"json_object": True} if kind == "json_object" else {"json": response_format["json_schema"]["schema"]}  # type: ignore[index]
    return {**{k: v for k, v in (structured_outputs or {}).items() if k not in CONSTRAINTS}, **over}


def check_both(where: str, structured_outputs: dict[str, Any] | None, response_format: dict[str, Any] | None) -> None:
    """vLLM refuses two constraints: ``structured_outputs`` with one and a ``response_format`` with another."""
    kind = (response_format or {}).get("type")
    own = [k for k in CONSTRAINTS if (structured_outputs or {}).get(k) is not None]
    if kind in ("json_object", "json_schema") and own:
        raise BadInput(f"{where}: both 'structured_outputs' ({own[0]}) and 'response_format' ({kind}) constrain the "
                       "output; vLLM takes one: keep one of them")


def from_guided(where: str, obj: dict[str, Any]) -> dict[str, Any] | None:
    """``structured_outputs`` from a request's removed ``guided_*`` fields (None where it has none),
    checked as vLLM would check it; refused where it also has ``structured_outputs`` or ``response_format``."""
    got = {GUIDED[k]: v for k, v in obj.items() if k in GUIDED and v is not None}
    if not got:
        return None
    names = ", ".join(k for k in obj if k in GUIDED and obj[k] is not None)
    if obj.get("structured_outputs") is not None or (obj.get("response_format") or {}).get("type") not in (None, "text"):
        raise BadInput(f"{where}: {names} (removed in vLLM 0.32) beside 'structured_outputs' or 'response_format': "
                       "keep only the latter")
    return check_structured_outputs(f"{where} ({names}, as structured_outputs)", got)


def check_tools(where: str, tools: Any, tool_choice: Any) -> None:
    """OpenAI ``tools`` (a list of ``{"type": "function", "function": {"name": ...}}``) and ``tool_choice``."""
    if tools is not None:
        ok = isinstance(tools, list) and all(
            isinstance(t, dict) and isinstance(t.get("function"), dict) and isinstance(t["function"].get("name"), str)
            for t in tools)
        if not ok:
            raise BadInput(f"{where}: 'tools' must be a list of {{\"type\": \"function\", \"function\": {{\"name\": ...}}}} "
                           f"objects, got {tools!r:.80}")
    if tool_choice is None:
        return
    named = isinstance(tool_choice, dict) and isinstance((tool_choice.get("function") or {}).get("name"), str)
    if tool_choice not in TOOL_CHOICES and not named:
        raise BadInput(f"{where}: 'tool_choice' must be none, auto, required or {{\"type\": \"function\", "
                       f"\"function\": {{\"name\": ...}}}}, got {tool_choice!r:.60}")
    if tool_choice != "none" and not tools:
        raise BadInput(f"{where}: 'tool_choice' {tool_choice!r:.40} needs 'tools'")


def tool_refusal(requests: Any, serving: dict[str, Any], instrument: str) -> str | None:
    """Why the requests' tools cannot be replayed as the service runs them, or None. vLLM's chat server
    answers a tool_choice other than none only with a tool parser (``auto``: also
    --enable-auto-tool-choice; ``renderers/online_renderer.py``), and applies required and named
    choices itself, as a constraint an in-process engine has no server to add."""
    for r in requests:
        choice = r.tool_choice if r.tool_choice is not None else ("auto" if r.tools else "none")
        if choice == "none":
            continue
        shown = choice if isinstance(choice, str) else f"function {choice['function']['name']}"
        if instrument == "inprocess" and choice != "auto":
            return (f"request {r.id!r}: tool_choice {shown!r} is applied by vLLM's chat server: measure with "
                    "--instrument served (the default)")
        missing = [f for f, key in (("--enable-auto-tool-choice", "enable_auto_tool_choice"),
                                    ("--tool-call-parser NAME", "tool_call_parser"))
                   if not serving.get(key) and (key == "tool_call_parser" or choice == "auto")]
        if missing and instrument == "served":
            return (f"request {r.id!r}: tool_choice {shown!r} needs vLLM's tool parser, as your service runs it: "
                    f"give {' '.join(missing)} after `--`")
    return None
