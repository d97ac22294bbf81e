"""The user's workload: requests with their sampling parameters, arrival offsets and expectations.

Reads the native JSONL form described in DESIGN.md: one JSON object per line with ``prompt``
(string), ``messages`` (chat list) or ``turns`` (user turns replayed as a conversation, each sent
after the model's own answer to the one before), an optional ``category``, and optional sampling
fields; and what a service's requests carry beyond them (issue 52): ``n``, structured outputs
(``response_format``, ``structured_outputs``: autotune.core.structured), ``tools``,
``tool_choice``, ``chat_template_kwargs`` and further sampling (autotune.core.fields.SAMPLING_EXTRA). A workload
whose chat requests need the server's chat endpoint (tools, or a response format the chat
template may render) goes to ``/v1/chat/completions``, all of it: ``Workload.endpoint``.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from autotune.core.errors import BadInput
from autotune.core.fields import (CHAT_FIELDS, FIELDS, MAX_TOKENS_LIMIT, generation, num,
                                   expect as check_expect, messages as check_messages, turns as check_turns)

TURNS = ("first", "all")  # --turns: what of a multi-turn question is sent


@dataclass(frozen=True)
class Request:
    """One request of the workload, as the engine will receive it."""

    id: str
    prompt: str | None = None
    messages: tuple[dict[str, Any], ...] | None = None
    # User turns of a conversation: turn k+1 is sent after the model's own answer to turn k.
    turns: tuple[str, ...] | None = None
    category: str | None = None
    max_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    arrival_s: float | None = None
    expect: dict[str, Any] = field(default_factory=dict)
    n: int = 1  # completions per request, as the service generates them (all of them load the engine)
    structured_outputs: dict[str, Any] | None = None  # vLLM's form, as written (autotune.core.structured)
    response_format: dict[str, Any] | None = None  # OpenAI's form, as written
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    chat_template_kwargs: dict[str, Any] | None = None
    sampling_extra: dict[str, Any] = field(default_factory=dict)  # SAMPLING_EXTRA's fields, as written

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def needs_chat(self) -> str | None:
        """Why this request needs the server's chat endpoint (its tools, or a response format the
        chat template may render), or None: its rendered text on /v1/completions is what the server runs."""
        if self.tools or self.tool_choice is not None:
            return "tools"
        if self.response_format is not None and self.prompt is None:
            return "response_format on a chat request"
        return None

    def structured(self) -> dict[str, Any] | None:
        """The structured outputs vLLM applies to this request (response_format folded in), or None."""
        from autotune.core.structured import merged

        return merged(self.structured_outputs, self.response_format)

    def render_kwargs(self) -> dict[str, Any]:
        """What the chat template gets besides the messages: the tools and the request's template kwargs."""
        return {**({"tools": self.tools} if self.tools else {}), **(self.chat_template_kwargs or {})}

    def chat_body(self) -> dict[str, Any]:
        """The request's own chat fields, as written, for /v1/chat/completions (sampling aside)."""
        return {"messages": [dict(m) for m in self.messages or ()],
                **{k: getattr(self, k) for k in CHAT_FIELDS if getattr(self, k) is not None}}

    def sampling(self) -> dict[str, Any]:
        """Keyword arguments for ``vllm.SamplingParams`` (plain data, no vLLM import here)."""
        out: dict[str, Any] = {"max_tokens": self.max_tokens, "temperature": self.temperature,
                               "top_p": self.top_p, "ignore_eos": self.ignore_eos}
        if self.top_k > 0:
            out["top_k"] = self.top_k
        if self.seed is not None:
            out["seed"] = self.seed
        if self.stop:
            out["stop"] = list(self.stop)
        if self.n != 1:
            out["n"] = self.n
        structured = self.structured()
        if structured is not None:  # plain data: the engine adapter makes vLLM's StructuredOutputsParams of it
            out["structured_outputs"] = structured
        return {**out, **self.sampling_extra}

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"id": self.id}
        if self.prompt is not None:
            d["prompt"] = self.prompt
        if self.messages is not None:
            d["messages"] = [dict(m) for m in self.messages]
        if self.turns is not None:
            d["turns"] = list(self.turns)
        if self.category is not None:
            d["category"] = self.category
        d.update(max_tokens=self.max_tokens, temperature=self.temperature, top_p=self.top_p)
        for key in ("top_k", "seed", "arrival_s"):
            if getattr(self, key) not in (None, 0):
                d[key] = getattr(self, key)
        if self.stop:
            d["stop"] = list(self.stop)
        if self.ignore_eos:
            d["ignore_eos"] = True
        if self.expect:
            d["expect"] = self.expect
        if self.n != 1:
            d["n"] = self.n
        d.update({k: getattr(self, k) for k in CHAT_FIELDS if getattr(self, k) is not None})
        return {**d, **self.sampling_extra}


@dataclass(frozen=True)
class Workload:
    """The requests of one workload file, in order."""

    path: str
    requests: tuple[Request, ...]
    notes: tuple[str, ...] = ()  # what reading it ignored or took a default for, a line each

    @property
    def endpoint(self) -> str:
        """``chat`` where a request needs /v1/chat/completions (``Request.needs_chat``): then the study's
        client and confirm's send every request there; else ``completions``."""
        return "chat" if any(r.needs_chat for r in self.requests) else "completions"

    @property
    def greedy_share(self) -> float:
        return sum(r.greedy for r in self.requests) / len(self.requests)

    @property
    def categories(self) -> list[str]:
        """The requests' categories in order of first appearance (empty: none has one)."""
        return list(dict.fromkeys(r.category for r in self.requests if r.category is not None))


UNCATEGORIZED = "(none)"  # the group of requests without a category, where others have one


def chat_text(tok: Any, messages: Any, **kwargs: Any) -> str:
    """Chat messages as the engine receives them: text rendered by the model's chat template (the
    tokenizer's), with the generation prompt; ``kwargs``: ``Request.render_kwargs`` (tools, ...)."""
    return tok.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True, **kwargs)


def first_messages(req: Request | dict[str, Any]) -> list[dict[str, str]]:
    """The chat a request without a ``prompt`` sends first: its ``messages``, else its first user turn."""
    get = req.get if isinstance(req, dict) else lambda key: getattr(req, key)
    messages = get("messages")
    return list(messages) if messages is not None else [{"role": "user", "content": get("turns")[0]}]


def first_prompt(req: Request | dict[str, Any], render: Callable[[list[dict[str, str]]], str]) -> str:
    """The text of a request's first (or only) prompt, as the engine receives it: its ``prompt`` as
    written, else ``first_messages`` rendered by ``render`` (messages -> text, e.g. ``chat_text``).
    ``req``: a Request, or its ``to_json`` form."""
    prompt = req.get("prompt") if isinstance(req, dict) else req.prompt
    return prompt if prompt is not None else render(first_messages(req))


def turn_id(request_id: str, k: int) -> str:
    """The id of turn ``k`` (from 0) of a request: the request's own id for its first turn."""
    return request_id if k == 0 else f"{request_id}#turn{k + 1}"


def expand_turns(requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Job requests (plain dicts) with each turn of a multi-turn request as its own entry.

    The engine returns one record per turn (``turn_id``); every turn is judged against the
    baseline's same turn. Expectations apply to the last answer only.
    """
    out = []
    for r in requests:
        turns = r.get("turns")
        if not turns:
            out.append(r)
            continue
        for k in range(len(turns)):
            out.append({**{key: v for key, v in r.items() if key != "turns"}, "id": turn_id(r["id"], k),
                        "expect": r.get("expect", {}) if k == len(turns) - 1 else {}})
    return out


def parse_request(obj: Any, where: str, index: int) -> Request:
    """Validate one native-form object; ``where`` is ``file:line`` for error messages."""
    if not isinstance(obj, dict):
        raise BadInput(f"{where}: expected a JSON object, got {type(obj).__name__}")
    unknown = set(obj) - FIELDS
    if unknown:
        bad = sorted(unknown)[0]
        if bad.startswith("guided_"):
            raise BadInput(f"{where}: {bad!r} was removed in vLLM 0.32 (a server answers it unconstrained); write "
                           "it as \"structured_outputs\": {\"json\": ...} (or read the file with --format openai, "
                           "which maps it)")
        raise BadInput(f"{where}: unknown field {bad!r}; expected one of {sorted(FIELDS)}")
    prompt, messages, turns = obj.get("prompt"), obj.get("messages"), obj.get("turns")
    if sum(x is not None for x in (prompt, messages, turns)) != 1:
        raise BadInput(f"{where}: expected exactly one of 'prompt' (string), 'messages' (chat list) "
                       "or 'turns' (list of user turns)")
    category = obj.get("category")
    if category is not None and (not isinstance(category, str) or not category.strip()):
        raise BadInput(f"{where}: 'category' must be a non-empty string, got {category!r:.60}")
    if prompt is not None and (not isinstance(prompt, str) or not prompt):
        raise BadInput(f"{where}: 'prompt' must be a non-empty string, got {prompt!r:.60}")
    stop = obj.get("stop", [])
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise BadInput(f"{where}: 'stop' must be a string or a list of non-empty strings, got {stop!r}")
    expect = check_expect(where, obj.get("expect", {}))
    for key in ("ignore_eos",):
        if key in obj and not isinstance(obj[key], bool):
            raise BadInput(f"{where}: '{key}' must be true or false, got {obj[key]!r}")
    rid = obj.get("id", str(index))
    if not isinstance(rid, (str, int)) or isinstance(rid, bool):
        raise BadInput(f"{where}: 'id' must be a string or an integer, got {rid!r}")
    return Request(
        id=str(rid), prompt=prompt,
        messages=check_messages(where, messages) if messages is not None else None,
        turns=check_turns(where, turns) if turns is not None else None, category=category,
        max_tokens=num(where, "max_tokens", obj.get("max_tokens", 128), lo=1, hi=MAX_TOKENS_LIMIT, integer=True),
        temperature=float(num(where, "temperature", obj.get("temperature", 0.0), lo=0, hi=10)),
        top_p=float(num(where, "top_p", obj.get("top_p", 1.0), lo=1e-9, hi=1)),
        top_k=num(where, "top_k", obj.get("top_k", 0), lo=-1, hi=1_000_000, integer=True),
        seed=num(where, "seed", obj["seed"], lo=0, hi=2**63 - 1, integer=True) if "seed" in obj else None,
        stop=tuple(stop), ignore_eos=obj.get("ignore_eos", False),
        arrival_s=float(num(where, "arrival_s", obj["arrival_s"], lo=0, hi=1e7)) if "arrival_s" in obj else None,
        expect=expect, **generation(where, obj),
    )


MAX_LINE_BYTES = 8 * 1024 * 1024


def _records(p: Path, text: str) -> list[tuple[str, Any]]:
    """(where, parsed JSON) for each record: JSONL lines, or the items of one JSON array."""
    if text.lstrip().startswith("["):  # ShareGPT dumps are one JSON array
        try:
            items = json.loads(text)
        except json.JSONDecodeError as e:
            raise BadInput(f"{p}:{e.lineno}: not valid JSON ({e.msg} at column {e.colno})") from None
        return [(f"{p}[{i}]", obj) for i, obj in enumerate(items)]
    out = []
    for lineno, line in enumerate(text.splitlines(), start=1):  # CRLF is valid input
        if not line.strip():
            continue
        where = f"{p}:{lineno}"
        if len(line) > MAX_LINE_BYTES:
            raise BadInput(f"{where}: line is {len(line)} characters long; expected at most {MAX_LINE_BYTES}")
        try:
            out.append((where, json.loads(line)))
        except json.JSONDecodeError as e:
            raise BadInput(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
        except RecursionError:
            raise BadInput(f"{where}: JSON nested too deeply") from None
    return out


def load_workload(path: str | Path, *, format: str = "auto", output_len: int | None = None,
                  turns: str | None = None) -> Workload:
    """Read a workload file in any supported format (see autotune.core.formats) into native requests.

    ``output_len`` is the ``max_tokens`` of requests that do not set one (``vllm bench serve``
    custom files carry prompts only). ``turns``: ``first`` sends only the first turn of each
    multi-turn request, ``all`` replays every turn; None (the default) is ``first`` for question
    files and ``all`` for native ``turns``. Raises BadInput naming the file and line on any problem.
    """
    from autotune.core.formats import FORMATS, detect, to_native

    p = Path(path)
    if format not in FORMATS:
        raise BadInput(f"--format: expected one of {', '.join(FORMATS)}, got {format!r}")
    if turns is not None and turns not in TURNS:
        raise BadInput(f"--turns: expected one of {', '.join(TURNS)}, got {turns!r}")
    if not p.exists():
        raise BadInput(f"{p}: no such file (expected a JSONL workload)")
    if p.is_dir():
        raise BadInput(f"{p}: is a directory (expected a JSONL workload file)")
    try:
        text = p.read_text(encoding="utf-8-sig")  # a BOM is valid input
    except UnicodeDecodeError as e:
        raise BadInput(f"{p}: not UTF-8 text (byte {e.start}); expected a JSONL workload") from None
    records = _records(p, text)
    if not records:
        raise BadInput(f"{p}: no requests (expected one JSON object per line)")
    fmt = detect(records[0][1]) if format == "auto" else format
    first_only = (turns or ("first" if fmt == "questions" else "all")) == "first"
    requests: list[Request] = []
    tally: Counter[str] = Counter()
    for where, obj in records:
        native = to_native(obj, fmt, where, tally)
        if output_len is not None and isinstance(native, dict) and "max_tokens" not in native:
            native = {**native, "max_tokens": output_len}
        if isinstance(native, dict) and native.get("id") is None:
            native = {k: v for k, v in native.items() if k != "id"}
        req = parse_request(native, where, len(requests))
        if first_only and req.turns is not None:
            req = replace(req, turns=None, messages=tuple(first_messages(req)))
        requests.append(req)
    ids = [turn_id(r.id, k) for r in requests for k in range(len(r.turns or ("",)))]
    if len(set(ids)) != len(ids):
        seen: set[str] = set()
        dup = next(i for i in ids if i in seen or seen.add(i))
        raise BadInput(f"{p}: request id {dup!r} appears more than once; ids must be unique "
                       "(turn k of a multi-turn request is 'ID#turnk')")
    chat = next((r for r in requests if r.needs_chat), None)
    text = next((r for r in requests if r.prompt is not None or r.turns is not None), None)
    if chat is not None and text is not None:  # vllm bench serve sends a run to one endpoint
        raise BadInput(f"{p}: request {chat.id!r} needs /v1/chat/completions ({chat.needs_chat}) and request "
                       f"{text.id!r} is a {'prompt' if text.prompt is not None else 'conversation of turns'}: "
                       "one workload goes to one endpoint; give it as 'messages', or tune the two apart")
    from autotune.core.request_body import notes

    return Workload(path=str(p), requests=tuple(requests), notes=tuple(notes(tally)))
