"""What a tuner user wants to know about a workload before spending GPU hours on it."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import numpy as np

from autotune.core.load import default_load, suggested_levels
from autotune.core.workload import UNCATEGORIZED, Request, Workload


def _text(r: Request) -> str:
    if r.prompt is not None:
        return r.prompt
    return "\n".join(m["content"] or "" for m in r.messages) if r.messages is not None else "\n".join(r.turns or ())


def _dist(values: list[float]) -> dict[str, float]:
    a = np.asarray(values, dtype=float)
    return {"min": float(a.min()), "p50": float(np.percentile(a, 50)), "p90": float(np.percentile(a, 90)),
            "max": float(a.max()), "mean": float(a.mean())}


def repetition(text: str, n: int = 3) -> float:
    """Share of the word n-grams of ``text`` that occur more than once in it.

    Prompt lookup (ngram speculation) proposes continuations of n-grams already in the
    context, so a prompt that repeats itself, or asks for a copy of itself with edits, is where
    it can win. This is a hint, not a measurement: only a trial measures acceptance.
    """
    words = re.findall(r"\w+|[^\w\s]", text)
    grams = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
    if not grams:
        return 0.0
    counts = Counter(grams)
    return sum(c for c in counts.values() if c > 1) / len(grams)


def by_category(wl: Workload, tokens: list[int] | None) -> dict[str, dict[str, Any]]:
    """Per category: requests, turns, prompt lengths (in tokens where known, else words), max_tokens."""
    out: dict[str, dict[str, Any]] = {}
    for name in [*wl.categories, UNCATEGORIZED]:
        idx = [i for i, r in enumerate(wl.requests) if (r.category or UNCATEGORIZED) == name]
        if not idx:
            continue
        reqs = [wl.requests[i] for i in idx]
        out[name] = {"requests": len(reqs), "turns": sum(len(r.turns or ("",)) for r in reqs),
                     "prompt_words": _dist([len(_text(r).split()) for r in reqs]),
                     "prompt_tokens": _dist([tokens[i] for i in idx]) if tokens is not None else None,
                     "max_tokens": _dist([r.max_tokens for r in reqs])}
    return out


def summarize(wl: Workload, *, tokenizer: Any = None, context: int | None = None) -> dict[str, Any]:
    """Counts and distributions: prompt and output lengths, sampling mix, arrivals, repetition,
    and per category. With the model's ``tokenizer``: prompt lengths in its tokens (the first turn,
    as the engine sends it) and, given its ``context``, the requests that would not fit."""
    from autotune.core.context import prompt_tokens, too_long

    reqs = wl.requests
    tokens = [prompt_tokens(tokenizer, r) for r in reqs] if tokenizer is not None else None
    arrivals = [r.arrival_s for r in reqs if r.arrival_s is not None]
    rep = [repetition(_text(r)) for r in reqs]
    edit_like = sum(bool(re.search(r"\b(edit|rewrite|fix|update|change|refactor)\b", _text(r), re.I)) for r in reqs)
    out: dict[str, Any] = {
        "file": wl.path, "requests": len(reqs),
        "prompt_chars": _dist([len(_text(r)) for r in reqs]),
        "prompt_words": _dist([len(_text(r).split()) for r in reqs]),
        "max_tokens": _dist([r.max_tokens for r in reqs]),
        "prompt_tokens": _dist(tokens) if tokens is not None else None,
        "chat_requests": sum(r.messages is not None or r.turns is not None for r in reqs),
        "multi_turn_requests": sum(len(r.turns or ()) > 1 for r in reqs),
        "greedy": sum(r.greedy for r in reqs), "sampled": sum(not r.greedy for r in reqs),
        "seeded": sum(r.seed is not None for r in reqs),
        "with_expectations": sum(bool(r.expect) for r in reqs),
        "structured_outputs": sum(r.structured() is not None for r in reqs),
        "n_over_1": sum(r.n > 1 for r in reqs), "with_tools": sum(bool(r.tools) for r in reqs),
        "arrivals": None,
        "prompt_repetition": _dist(rep),
        "edit_like_requests": edit_like,
        "categories": by_category(wl, tokens) if wl.categories else {},
        "context": context,
        "too_long": [{"id": b.id, "prompt_tokens": b.prompt_tokens, "max_tokens": b.max_tokens}
                     for b in too_long(tokenizer, wl, context)] if tokenizer is not None and context else None,
    }
    if arrivals:
        span = max(arrivals) - min(arrivals)
        out["arrivals"] = {"timed": len(arrivals), "span_s": span,
                           "mean_rate_per_s": (len(arrivals) - 1) / span if span > 0 else None}
    out["load"] = suggested_load(wl)
    share = (edit_like / len(reqs) + float(np.mean(rep))) / 2
    out["ngram_hint"] = ("likely to help: outputs may copy the prompt" if share > 0.3 else
                         "may help on some requests" if share > 0.1 else "unlikely to help much")
    return out


def suggested_load(wl: Workload) -> dict[str, str]:
    """The load to tune at, from the log: what `search` runs by default (autotune.core.load.default_load)
    and, without arrival times, the levels to give it instead."""
    chosen, _ = default_load([r.arrival_s for r in wl.requests])
    if chosen == "replay":
        return {"search": "replay", "why": "every request has arrival_s: search replays them by default"}
    levels = ",".join(map(str, suggested_levels(len(wl.requests))))
    return {"search": f"--levels {levels}", "why": "without arrival_s search runs one request in flight, where "
            "speculation gains most; give the levels your service sees"}
