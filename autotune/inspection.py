"""What a tuner user wants to know about a workload before spending GPU hours on it."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import numpy as np

from autotune.workload import Request, Workload


def _text(r: Request) -> str:
    return r.prompt if r.prompt is not None else "\n".join(m["content"] for m in r.messages or ())


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


def summarize(wl: Workload) -> dict[str, Any]:
    """Counts and distributions: prompt and output lengths, sampling mix, arrivals, repetition."""
    reqs = wl.requests
    arrivals = [r.arrival_s for r in reqs if r.arrival_s is not None]
    rep = [repetition(_text(r)) for r in reqs]
    edit_like = sum(bool(re.search(r"\b(edit|rewrite|fix|update|change|refactor)\b", _text(r), re.I)) for r in reqs)
    out: dict[str, Any] = {
        "file": wl.path, "requests": len(reqs),
        "prompt_chars": _dist([len(_text(r)) for r in reqs]),
        "prompt_words": _dist([len(_text(r).split()) for r in reqs]),
        "max_tokens": _dist([r.max_tokens for r in reqs]),
        "chat_requests": sum(r.messages is not None for r in reqs),
        "greedy": sum(r.greedy for r in reqs), "sampled": sum(not r.greedy for r in reqs),
        "seeded": sum(r.seed is not None for r in reqs),
        "with_expectations": sum(bool(r.expect) for r in reqs),
        "arrivals": None,
        "prompt_repetition": _dist(rep),
        "edit_like_requests": edit_like,
    }
    if arrivals:
        span = max(arrivals) - min(arrivals)
        out["arrivals"] = {"timed": len(arrivals), "span_s": span,
                           "mean_rate_per_s": (len(arrivals) - 1) / span if span > 0 else None}
    share = (edit_like / len(reqs) + float(np.mean(rep))) / 2
    out["ngram_hint"] = ("likely to help: outputs may copy the prompt" if share > 0.3 else
                         "may help on some requests" if share > 0.1 else "unlikely to help much")
    return out
