"""Results by category: which kinds of request gain from a config and which lose.

A speedup averaged over a whole workload hides the answer to what users ask first (editing, RAG,
math, code). From the raw per-request records of each window (autotune.run.engine keeps every
streamed chunk), each category gets its output tok/s, TTFT, TPOT, E2E and acceptance, and its
speedup over the baseline's same category.

Acceptance by category cannot come from vLLM's ``vllm:spec_decode_*`` counters: those are global,
summed over every request. Two per-request sources instead:
- vLLM's own per-request metrics where the engine has them (``per_request_spec_decode_metrics``,
  vLLM 0.32 has it; autotune.run.engine asks for the summary): a histogram of accepted drafts per
  verify step and the drafted tokens, counted as the global counters are. Exact.
- Otherwise the stream: each streamed chunk of a request carries the tokens of one engine step
  for it (1 + the accepted drafts), and the first chunk is the prefill's one token, so a request's
  decode steps are its chunks after the first; a step of m tokens accepted draft positions
  1..m-1. This counts every decode step, also those where nothing was drafted (ngram finds no
  match), which vLLM's counters leave out: it reads lower than they do (measured on the demo pair,
  ngram k=3: 1.0-1.4 tokens a step against vLLM's 2.8 per drafted step). And two biases, small at
  low load: a step cut short by ``max_tokens`` or a stop string counts fewer tokens than were
  accepted, and when the client falls behind vLLM merges several steps' deltas into one chunk.
  Where that happened to more than a few tokens (autotune.measure.coalescing's rule, on the
  category's requests in that window) neither the steps nor TPOT of that window count: TPOT is the
  median over the windows that timed tokens, NaN (not measured) where none did.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from autotune.measure.acceptance import acceptance
from autotune.measure.coalescing import step_tokens, stream_coalesced
from autotune.measure.metrics import complete, ratio_interval, request_latency

# Per-category metrics (medians over windows) and the direction of their speedup ratio.
RATIOS = {"output_tok_s": "maximize", "tpot_ms_p50": "minimize", "e2e_ms_p50": "minimize"}


def _p50_ms(values: list[float]) -> float:
    return float(np.percentile(np.asarray(values) * 1000.0, 50)) if values else float("nan")


def window_metrics(records: list[dict[str, Any]], *, step: int | None = None) -> dict[str, Any]:
    """One window's records of one category: counts, rates and latencies, step sizes. Where their stream
    delivered tokens in bursts (autotune.measure.coalescing.stream_coalesced; ``step``: the most tokens an
    engine step gives a request) no TPOT and no step sizes: a burst merges steps."""
    done = [r for r in records if complete(r)]
    timed = stream_coalesced(done, step=step) is None
    tokens, busy, ttft, tpot, e2e, steps = 0, 0.0, [], [], [], []
    per_request = [r.get("spec_decode") for r in done]
    for r in done:
        first, last, per_token, n = request_latency(r)
        tokens += n
        ttft.append(first)
        e2e.append(last)
        busy += last
        if per_token is not None and timed:
            tpot.append(per_token)
        steps += [c[1] for c in r["chunks"][1:]] if timed else []
    return {
        "requests": len(records), "completed": len(done), "output_tokens": tokens,
        # Each request's own rate, pooled: tokens over the summed time its requests were in flight.
        # At concurrency 1 this is what the category alone gets; under load, the rate a user of it sees.
        "output_tok_s": tokens / busy if busy > 0 else float("nan"),
        "ttft_ms_p50": _p50_ms(ttft), "tpot_ms_p50": _p50_ms(tpot), "e2e_ms_p50": _p50_ms(e2e),
        "steps": steps, "coalesced": not timed,
        # vLLM's per-request acceptance, where every completed request has it
        "spec_decode": per_request if per_request and all(per_request) else None,
    }


def stream_acceptance(steps: list[int], k: int | None) -> dict[str, Any]:
    """Acceptance from decode-step sizes (tokens per streamed chunk after the first).

    ``k``: draft tokens a step (0: no speculation, all NaN; None: speculation of no fixed depth,
    such as suffix decoding: the mean accepted length only)."""
    nan = {"mean_accepted_length": float("nan"), "acceptance_rate": float("nan"), "acceptance_by_pos": []}
    if k == 0 or not steps:
        return nan
    mean = sum(steps) / len(steps)
    if k is None:
        return {**nan, "mean_accepted_length": mean}
    return {"mean_accepted_length": mean, "acceptance_rate": (mean - 1) / k,
            "acceptance_by_pos": [sum(s > i for s in steps) / len(steps) for i in range(1, k + 1)]}


def vllm_acceptance(per_request: list[dict[str, Any]], k: int | None) -> dict[str, Any]:
    """Acceptance from vLLM's per-request metrics (``RequestSpecDecodeMetrics.to_dict``), pooled:
    defined as the global counters are (autotune.measure.acceptance)."""
    hist: list[int] = []
    for m in per_request:
        h = m.get("acceptance_histogram") or []
        hist = [a + b for a, b in zip(hist + [0] * (len(h) - len(hist)), h)]
    steps = sum(hist)
    accepted = sum(j * n for j, n in enumerate(hist))
    drafted = sum(m.get("num_draft_tokens", 0) for m in per_request)
    depth = k or max(len(hist) - 1, 0)
    return acceptance(steps, drafted, accepted, [sum(hist[i:]) for i in range(1, depth + 1)])


def by_category(windows: list[dict[str, Any]], categories: dict[str, str], k: int | None) -> dict[str, dict[str, Any]]:
    """Per category: the median over windows of each metric, and acceptance over all windows.

    ``categories``: record id -> category (every turn of a multi-turn request is a record).
    ``k``: as in ``stream_acceptance``.
    """
    names = list(dict.fromkeys(categories.values()))
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        per = [window_metrics([r for r in w["requests"] if categories.get(r["id"]) == name], step=_step(w, k))
               for w in windows]
        m: dict[str, Any] = {key: float(np.median([p[key] for p in per])) for key in
                             ("output_tok_s", "ttft_ms_p50", "e2e_ms_p50")}
        timed = [p["tpot_ms_p50"] for p in per if not p["coalesced"]]  # a window in bursts timed no token
        m["tpot_ms_p50"] = float(np.median(timed)) if timed else float("nan")
        m["output_tok_s_windows"] = [p["output_tok_s"] for p in per]  # for the speedup's interval
        m["requests"] = per[0]["requests"]  # every window replays the same requests
        m["completed"] = sum(p["completed"] for p in per)
        m["output_tokens"] = int(np.median([p["output_tokens"] for p in per]))
        exact = [p["spec_decode"] for p in per]
        if k != 0 and all(exact):
            m.update(vllm_acceptance([x for e in exact for x in e], k), acceptance_source="vllm")
        else:
            m.update(stream_acceptance([s for p in per for s in p["steps"]], k),
                     acceptance_source="stream" if k != 0 else None)
        out[name] = m
    return out


def _step(window: dict[str, Any], k: int | None) -> int | None:
    """The most tokens an engine step gives a request: from the window's counters where they say
    (autotune.measure.coalescing.step_tokens), else 1 + ``k`` (None: no fixed depth)."""
    step = step_tokens(window.get("spec_counters"))
    return step if step is not None else None if k is None else 1 + k


def _ratio(a: Any, b: Any) -> float:
    ok = all(isinstance(x, (int, float)) and math.isfinite(x) for x in (a, b))
    return a / b if ok and b else float("nan")


def category_speedup(cand: dict[str, dict[str, Any]], base: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per category, ratios to the baseline's same category, each > 1 when the candidate is better; the
    throughput ratio with its 95% bootstrap interval over the windows (``output_tok_s_lo`` .. ``_hi``)
    where both sides kept them (measurements from before they did have the ratio alone)."""
    out = {}
    for name, m in cand.items():
        b = base.get(name)
        if b is None:
            continue
        out[name] = {key: _ratio(m.get(key), b.get(key)) if d == "maximize" else _ratio(b.get(key), m.get(key))
                     for key, d in RATIOS.items()}
        if m.get("output_tok_s_windows") and b.get("output_tok_s_windows"):
            lo, hi = ratio_interval(m["output_tok_s_windows"], b["output_tok_s_windows"])
            out[name].update(output_tok_s_lo=lo, output_tok_s_hi=hi)
    return out


# Columns of by_category.csv (one row per measured trial and category), in order.
COLUMNS = ("trial", "label", "role", "category", "requests", "output_tokens", "output_tok_s", "ttft_ms_p50",
           "tpot_ms_p50", "e2e_ms_p50", "mean_accepted_length", "acceptance_rate", "acceptance_by_pos",
           "acceptance_source", *(f"speedup_{k}" for k in RATIOS))


def rows(trial: int, label: str, role: str, cats: dict[str, dict[str, Any]],
         speedups: dict[str, dict[str, float]] | None) -> list[dict[str, Any]]:
    """by_category.csv rows of one trial."""
    out = []
    for name, m in cats.items():
        row: dict[str, Any] = {"trial": trial, "label": label, "role": role, "category": name}
        row.update({k: m.get(k) for k in COLUMNS if k in m and k != "acceptance_by_pos"})
        row["acceptance_by_pos"] = " ".join(f"{x:.3f}" for x in m.get("acceptance_by_pos") or [])
        row.update({f"speedup_{k}": v for k, v in ((speedups or {}).get(name) or {}).items()})
        out.append({c: row.get(c) for c in COLUMNS})
    return out
