"""Prompt lengths in the model's own tokens, and whether each request fits the model's context.

Checked before any engine starts: a prompt over ``max_model_len`` fails inside vLLM only when
its turn comes (a Spec-Bench study failed its baseline after a minute with "8 of 52 requests did
not finish"), so every request is tokenized up front with the model's tokenizer (transformers,
imported lazily: only where a length is needed) and rendered as the engine renders it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autotune.core.errors import BadInput
from autotune.core.workload import Request, Workload, chat_text, first_prompt

# Config keys that bound a model's positions; vLLM derives max_model_len from the smallest present.
_LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_sequence_length")
NAMED = 5  # requests named in a "does not fit" message


def load_tokenizer(model: str, *, trust_remote_code: bool = False) -> Any:
    """The model's Hugging Face tokenizer (the one vLLM uses for it)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model, trust_remote_code=trust_remote_code)


def model_context(model: str, max_model_len: int | None) -> int | None:
    """Tokens a sequence may hold: ``max_model_len`` when given, else the model config's bound
    (None when neither is known: vLLM then decides)."""
    if max_model_len is not None:
        return max_model_len
    from autotune.core.candidate import model_configs  # the one reader of a model's config.json

    found = [c[k] for c in model_configs(model) for k in _LENGTH_KEYS if isinstance(c.get(k), int)]
    return min(found) if found else None


def _render(tok: Any, req: Request, messages: list[dict[str, str]]) -> str:
    try:
        return chat_text(tok, messages, **req.render_kwargs())  # the tools too: the template renders them
    except Exception as e:  # no chat template (a base model), or one that rejects these roles
        raise BadInput(f"request {req.id!r}: cannot render its chat messages with the model's chat template "
                       f"({type(e).__name__}: {str(e)[:120]})") from None


def prompt_tokens(tok: Any, req: Request) -> int:
    """Prompt tokens of ``req``'s first (or only) turn, as the engine sends it (autotune.run.engine
    renders chat messages with the chat template, and vLLM tokenizes the text)."""
    return len(tok(first_prompt(req, lambda messages: _render(tok, req, messages)))["input_ids"])


def sequence_bound(tok: Any, req: Request) -> tuple[int, int]:
    """(prompt tokens, tokens to generate) of the longest sequence ``req`` makes.

    A multi-turn request's last turn carries every earlier answer: the bound counts each at its
    ``max_tokens``, the most it can be, so a conversation that passes never overflows mid-run.
    """
    if not req.turns or len(req.turns) == 1:
        return prompt_tokens(tok, req), req.max_tokens
    messages: list[dict[str, str]] = []
    for t in req.turns[:-1]:
        messages += [{"role": "user", "content": t}, {"role": "assistant", "content": ""}]
    messages.append({"role": "user", "content": req.turns[-1]})
    n = len(tok(_render(tok, req, messages))["input_ids"])
    return n + (len(req.turns) - 1) * req.max_tokens, req.max_tokens


@dataclass(frozen=True)
class TooLong:
    id: str
    prompt_tokens: int
    max_tokens: int

    def __str__(self) -> str:
        return f"{self.id!r} ({self.prompt_tokens} prompt + {self.max_tokens} max_tokens)"


def too_long(tok: Any, wl: Workload, context: int) -> list[TooLong]:
    """The requests whose prompt + ``max_tokens`` exceed ``context`` tokens."""
    out = []
    for r in wl.requests:
        n, m = sequence_bound(tok, r)
        if n + m > context:
            out.append(TooLong(r.id, n, m))
    return out


def fit(wl: Workload, tok: Any, context: int, *, drop: bool, source: str) -> tuple[Workload, list[TooLong]]:
    """``wl`` with every request checked against the context: BadInput naming the requests that do
    not fit, or (``drop``) the workload without them and the list of those dropped.

    ``source`` says where the context comes from (``--max-model-len``, the model's config).
    """
    bad = too_long(tok, wl, context)
    if not bad:
        return wl, []
    named = ", ".join(map(str, bad[:NAMED])) + (f" and {len(bad) - NAMED} more" if len(bad) > NAMED else "")
    if not drop:
        raise BadInput(f"{wl.path}: {len(bad)} of {len(wl.requests)} requests do not fit the model's context of "
                       f"{context} tokens ({source}): {named}; shorten them, lower max_tokens, raise "
                       "--max-model-len, or pass --drop-too-long")
    gone = {b.id for b in bad}
    kept = tuple(r for r in wl.requests if r.id not in gone)
    if not kept:
        raise BadInput(f"{wl.path}: none of its {len(wl.requests)} requests fits the model's context of {context} "
                       f"tokens ({source}): {named}")
    return Workload(path=wl.path, requests=kept), bad


@dataclass(frozen=True)
class Fit:
    """A workload checked against a model's context, before any engine starts."""

    workload: Workload
    dropped: list[TooLong]
    context: int | None
    source: str  # where the context comes from
    warning: str | None = None  # why nothing was checked


def fit_model(wl: Workload, *, model: str, max_model_len: int | None, tokenizer: str | None = None,
              trust_remote_code: bool = False, drop: bool = False) -> Fit:
    """Check every request of ``wl`` against ``model``'s context (see ``fit``).

    A tokenizer that cannot be loaded here (a tokenizer mode transformers does not read, a hub id
    with no network) leaves the check to vLLM, with a warning: the engine may still load it.
    """
    context = model_context(model, max_model_len)
    source = "max_model_len" if max_model_len is not None else "the model config's length"
    if context is None:
        return Fit(wl, [], None, source, f"the context length of {model} is unknown: prompts are not checked "
                                         "against it (pass --max-model-len)")
    try:
        tok = load_tokenizer(tokenizer or model, trust_remote_code=trust_remote_code)
    except Exception as e:  # noqa: BLE001 - any loader failure means "cannot check here", not bad input
        return Fit(wl, [], context, source, f"could not load the tokenizer of {tokenizer or model} to check prompt "
                                            f"lengths ({type(e).__name__}: {str(e)[:160]})")
    kept, dropped = fit(wl, tok, context, drop=drop, source=source)
    return Fit(kept, dropped, context, source)
