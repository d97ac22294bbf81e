"""Predict, then measure: the acceptance of every ngram setting and draft depth, from the baseline's tokens.

Lossless speculation returns the baseline's greedy tokens, and vLLM's ngram proposer is a pure
function of the tokens so far, so replaying its rule over the baseline's prompt + output says
what every (k, lookup min, max) would draft and how much of it the target would accept, with no
engine. A greedy draft model (vLLM's default ``draft_sample_method="greedy"``) sees exactly the
target's tokens along an accepted prefix, so one teacher-forced pass of the draft (its argmax at
every position) gives every depth at once. For sampled requests the same replay over the
baseline's sampled outputs is an unbiased estimate of the expected acceptance: a deterministic
proposal d is accepted with probability p_target(d), the chance that the baseline sampled d.

What cannot be replayed this way (EAGLE, EAGLE-3, MTP: they read the target's hidden states;
suffix decoding: a cache shared across requests) is measured as before.
Pure Python over token ids; needs neither Optuna nor vLLM.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

Proposer = Callable[[Sequence[int], int], Sequence[int]]  # (context so far, position in output) -> draft


@dataclass(frozen=True)
class Acceptance:
    """What a speculative config would do over a set of requests, in vLLM's counter terms."""

    drafts: int = 0  # engine steps of a request that verified at least one draft token
    draft_tokens: int = 0
    accepted: int = 0
    per_pos: tuple[int, ...] = ()  # accepted tokens at draft position 1, 2, ...
    tokens: int = 0  # output tokens replayed
    steps: int = 0  # decode steps (after the prefill's first token): tokens - 1 - accepted per request
    requests: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.draft_tokens if self.draft_tokens else float("nan")

    @property
    def mean_accepted_length(self) -> float:
        """1 + accepted per draft: vLLM's definition (and autotune.metrics')."""
        return 1 + self.accepted / self.drafts if self.drafts else float("nan")

    @property
    def tokens_per_step(self) -> float:
        """Output tokens per decode step: the speedup speculation would give at equal step cost."""
        decoded = self.tokens - self.requests
        return decoded / self.steps if self.steps else float("nan")

    def __add__(self, other: Acceptance) -> Acceptance:
        n = max(len(self.per_pos), len(other.per_pos))
        pad = lambda p: tuple(p) + (0,) * (n - len(p))  # noqa: E731
        return Acceptance(self.drafts + other.drafts, self.draft_tokens + other.draft_tokens,
                          self.accepted + other.accepted,
                          tuple(a + b for a, b in zip(pad(self.per_pos), pad(other.per_pos))),
                          self.tokens + other.tokens, self.steps + other.steps, self.requests + other.requests)

    def to_dict(self) -> dict[str, float | int | list[int]]:
        return {"drafts": self.drafts, "draft_tokens": self.draft_tokens, "accepted": self.accepted,
                "per_pos": list(self.per_pos), "acceptance_rate": self.acceptance_rate,
                "mean_accepted_length": self.mean_accepted_length, "tokens_per_step": self.tokens_per_step}


def ngram_proposal(tokens: Sequence[int], min_n: int, max_n: int, k: int, max_model_len: int) -> list[int]:
    """vLLM 0.32's ngram proposal for ``tokens`` (prompt + output so far).

    The same rule as ``_find_longest_matched_ngram_and_propose_tokens`` in
    ``vllm/v1/spec_decode/ngram_proposer.py``: the longest suffix n-gram of length in [min_n, max_n]
    that occurs earlier (its earliest occurrence on ties), then up to k tokens that followed it.
    A KMP prefix function over the reversed tokens, as there.
    """
    total = len(tokens)
    if total < min_n:
        return []
    k = min(k, max_model_len - total)
    if k <= 0:
        return []
    rev = tokens[::-1]
    lps = [0] * max_n
    longest, position, prev, i = 0, 0, 0, 1
    while i < total:
        if rev[prev] == rev[i]:
            prev += 1
            if prev >= longest:
                longest, position = prev, i
            if i < max_n:
                lps[i] = prev
            if prev == max_n:
                prev = lps[max_n - 1]
            i += 1
        elif prev:
            prev = lps[prev - 1]
        else:
            i += 1
    if longest < min_n:
        return []
    start = total - 1 - position + longest
    return list(tokens[start:start + min(k, total - start)])


def replay(prompt: Sequence[int], output: Sequence[int], propose: Proposer, k: int) -> Acceptance:
    """Step through one request as the engine would: the prefill gives the first output token, then
    each step verifies a draft from the tokens so far and advances by accepted + 1.

    Draft tokens past the known output (the request ended there) count as drafted, not accepted.
    """
    n = len(output)
    if n == 0:
        return Acceptance()
    pos, drafts, drafted, accepted, steps = 1, 0, 0, 0, 0
    per_pos = [0] * k
    context = list(prompt) + list(output[:1])
    while pos < n:
        draft = list(propose(context, pos))[:k]
        run = 0
        while run < len(draft) and pos + run < n and draft[run] == output[pos + run]:
            per_pos[run] += 1
            run += 1
        if draft:
            drafts += 1
            drafted += len(draft)
            accepted += run
        step = min(run + 1, n - pos)
        context.extend(output[pos:pos + step])
        pos += step
        steps += 1
    return Acceptance(drafts, drafted, accepted, tuple(per_pos), n, steps, 1)


def ngram_acceptance(pairs: Sequence[tuple[Sequence[int], Sequence[int]]], *, k: int, min_n: int, max_n: int,
                     max_model_len: int) -> Acceptance:
    """ngram (k, lookup min_n..max_n) over (prompt ids, output ids) pairs."""
    total = Acceptance()
    for prompt, output in pairs:
        total += replay(prompt, output, lambda ctx, _pos: ngram_proposal(ctx, min_n, max_n, k, max_model_len), k)
    return total


@dataclass(frozen=True)
class DraftTrace:
    """A greedy draft's argmax along the baseline's path, teacher-forced: ``argmax[i]`` is the draft's
    next-token choice after prompt + output[:i + 1] (so it predicts output[i + 1])."""

    prompt: tuple[int, ...]
    output: tuple[int, ...]
    argmax: tuple[int, ...] = field(default=())


def draft_acceptance(traces: Sequence[DraftTrace], *, k: int) -> Acceptance:
    """draft_model with depth k (greedy drafting), from each request's teacher-forced draft argmax."""
    total = Acceptance()
    for t in traces:
        # Along an accepted prefix the draft saw the target's tokens, so its j-th proposal from
        # output position pos is its teacher-forced choice at pos + j - 1.
        # It always drafts k tokens; those past the end of the argmax trace cannot be judged (-1).
        total += replay(t.prompt, t.output,
                        lambda _ctx, pos, a=t.argmax: (list(a[pos - 1:pos - 1 + k]) + [-1] * k)[:k], k)
    return total


def trace_job(draft_kwargs: dict[str, Any], outputs: Sequence[dict[str, Any]], engine_module: str) -> dict[str, Any]:
    """The worker job that traces a draft model over the baseline's outputs (autotune.engine._trace).

    ``draft_kwargs``: engine kwargs that load the draft as a plain model; ``outputs``: the baseline
    trial's outputs (with vLLM's own ``prompt_token_ids``).
    """
    return {"engine_kwargs": draft_kwargs, "engine_module": engine_module, "requests": [],
            "trace": {o["id"]: {"prompt": o["prompt_token_ids"], "output": o["token_ids"]}
                      for o in outputs if o.get("prompt_token_ids") and o.get("token_ids")}}


def draft_traces(outputs: Sequence[dict[str, Any]], argmax: dict[str, list[int]]) -> list[DraftTrace]:
    """DraftTraces from the baseline's outputs and a trace job's result (``traces``)."""
    return [DraftTrace(tuple(o["prompt_token_ids"]), tuple(o["token_ids"]), tuple(argmax[o["id"]]))
            for o in outputs if o["id"] in argmax]
