"""Does a window's stream time tokens, or only the chunks they came in? The one rule for TPOT and ITL.

TPOT and ITL are read from when each chunk of a stream reached the client. That times tokens only
where each arrival carries what one engine step made. When the client or the API process falls
behind, a backlog of steps reaches the client at one instant (chunks read from a buffer microseconds
apart, or deltas merged into one chunk): the decode span shrinks to almost nothing and TPOT reads
microseconds. On the 2-core development machine 11 of 33 served windows did
(benchmarks/data/stream_coalescing.json: client TPOT p50 2.7-8.4 us a token, against 0.7-3.3 ms in the
windows that streamed). There TPOT and ITL are not measured: never a number, never an objective, an
SLO or a gate's comparison (autotune.measure.metrics.unresolved_latency says so in one line).
"""

from __future__ import annotations

from typing import Any

# Chunks of one completion that reach the client closer than this are one arrival: no engine step is
# that short (a step schedules, runs a forward pass and samples; the fastest chunk gaps measured here
# are ~1-2 ms, ITL p50 of the speculative configs), while a backlog read from a buffer arrives 3-13 us a
# chunk apart (stream_coalescing.json's coalesced windows; ITL p50 7-13 us in
# benchmarks/data/demo_served_instrument*_trials.csv). Ten times over the one, ten times under the other.
SAME_INSTANT_S = 0.0001
# The share of a window's decode tokens that may arrive with no step of their own before its TPOT and ITL
# are not measured. Such tokens, at worst all in a request's first arrival, shorten the decode span TPOT
# divides by that share of it; 10% is about the window-to-window spread of TPOT p50 itself (MAD 0.59 of
# 5.66 ms, the round-5 demo's baseline: benchmarks/data/demo_round5_best.json). Streams seen here are
# near 0% or near 100% (stream_coalescing.json), so the line's exact place moves few windows.
MAX_UNSTEPPED_SHARE = 0.10

_PER_POS, _DRAFTS = "vllm:spec_decode_num_accepted_tokens_per_pos", "vllm:spec_decode_num_drafts"


def step_tokens(counters: dict[str, Any] | None) -> int | None:
    """The most tokens one engine step gives a request: 1 + the drafts' depth, read from vLLM's
    per-position acceptance counter (one entry a draft position, created for every position at start);
    1 without speculation. None where the counters do not say (a record without them, or drafts
    counted with no positions): then only arrival times tell steps apart."""
    c = counters or {}
    if _PER_POS not in c:
        return None
    per_pos = c[_PER_POS] or []
    if not per_pos and c.get(_DRAFTS, 0):
        return None
    return 1 + len(per_pos)


def unstepped_tokens(rec: dict[str, Any], step: int | None) -> tuple[int, int]:
    """(tokens with no engine step of their own, decode tokens) of one request's stream.

    An arrival is the chunks of one completion (a chunk's third entry, where n > 1) that reached the
    client less than ``SAME_INSTANT_S`` apart; it carries at most ``step`` tokens (None: its largest
    chunk) that a step made; the rest came without one. Decode tokens: all but each completion's first."""
    by_completion: dict[int, list[list[float]]] = {}
    for c in rec["chunks"]:
        by_completion.setdefault(int(c[2]) if len(c) > 2 else 0, []).append(c)
    excess = decode = 0
    for chunks in by_completion.values():
        decode += int(sum(c[1] for c in chunks)) - 1
        arrival: list[list[float]] = []
        for c in [*chunks, None]:
            if arrival and (c is None or c[0] - arrival[-1][0] >= SAME_INSTANT_S):
                tokens = int(sum(a[1] for a in arrival))
                excess += max(0, tokens - (step if step is not None else int(max(a[1] for a in arrival))))
                arrival = []
            if c is not None:
                arrival.append(c)
    return excess, max(decode, 0)


def unstepped_share(requests: list[dict[str, Any]], *, step: int | None = None) -> float | None:
    """The share of the requests' decode tokens (pass the finished ones: autotune.measure.metrics.complete)
    that arrived with no engine step of their own (``unstepped_tokens``); None where none had a decode token."""
    excess = decode = 0
    for r in requests:
        e, d = unstepped_tokens(r, step)
        excess, decode = excess + e, decode + d
    return excess / decode if decode else None


def stream_coalesced(requests: list[dict[str, Any]], *, step: int | None = None) -> str | None:
    """Why this window's stream does not time its tokens (so TPOT and ITL are not measured), or None
    where it does: more than ``MAX_UNSTEPPED_SHARE`` of its decode tokens came with no engine step of
    their own (``unstepped_share``; ``step``: the most tokens a step gives a request, ``step_tokens``)."""
    share = unstepped_share(requests, step=step)
    if share is None or share <= MAX_UNSTEPPED_SHARE:
        return None
    return f"{share:.0%} of tokens arrived in bursts"
