"""Predict, then measure: the acceptance of every ngram setting and draft depth, from the baseline's tokens.

Lossless speculation returns the baseline's greedy tokens, and vLLM's ngram proposer is a pure
function of the tokens so far, so replaying its rule over the baseline's prompt + output says
what every (k, lookup min, max) would draft and how much of it the target would accept, with no
engine. The rule is the runner's that runs it (autotune.core.runner): V1's on the CPU build, V2's on
a GPU (another match on ties, and always k tokens). A greedy draft model (vLLM's default ``draft_sample_method="greedy"``) sees exactly the
target's tokens along an accepted prefix, so one teacher-forced pass of the draft (its argmax at
every position) gives every depth at once. For sampled requests the same replay over the
baseline's sampled outputs is an unbiased estimate of the expected acceptance: a deterministic
proposal d is accepted with probability p_target(d), the chance that the baseline sampled d.

Suffix decoding is deterministic too, but its proposer keeps a cache across requests (each
request's prompt, and every response so far in one global suffix tree): replaying Arctic
Inference's own cache over the baseline's requests, one at a time in the workload's order, says
what vLLM would draft at concurrency 1, exactly as ngram (with requests in flight together, the
responses enter the tree interleaved, and the replay is an estimate). Exact up to what the engine
sees past a request's end and the baseline never does: vLLM's runner puts every token a step
sampled into the tree, a bonus token after an accepted end-of-sequence draft too, which a later
draft can then offer.

EAGLE-3 reads the target's hidden states, but only along the tokens the target verified: a greedy
head drafts deterministically from the baseline's tokens and the target's (teacher-forced) states
over them, chaining on its own output within a step. ``autotune.forecast.eagle3_trace.trace`` replays that
chain at every position once (transformers, the target and the head); ``eagle3_acceptance`` then
walks each request as the engine would, for every depth up to the traced one.
What cannot be replayed this way (EAGLE-1, MTP) is measured as before.
Pure Python over token ids; needs neither Optuna nor vLLM (suffix decoding: Arctic Inference).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from autotune.core.candidate import package_installed
from autotune.core.runner import V1, V2
from autotune.measure import acceptance

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
        return acceptance.acceptance_rate(self.accepted, self.draft_tokens)

    @property
    def mean_accepted_length(self) -> float:
        """1 + accepted per draft: vLLM's definition (autotune.measure.acceptance)."""
        return acceptance.mean_accepted_length(self.accepted, self.drafts)

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


def _longest_match(tokens: Sequence[int], max_n: int, *, rightmost: bool) -> tuple[int, int]:
    """(n, i): the longest suffix n-gram (n <= max_n) that occurs earlier, and where: the occurrence
    starts at ``len(tokens) - 1 - i``. A KMP prefix function over the reversed tokens, as vLLM's V1
    proposer computes it; ties go to the earliest occurrence, or with ``rightmost`` to the latest."""
    total = len(tokens)
    rev = tokens[::-1]
    lps = [0] * max_n
    longest, position, prev, i = 0, 0, 0, 1
    while i < total:
        if rev[prev] == rev[i]:
            prev += 1
            if prev > longest or (prev == longest and not rightmost):
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
    return longest, position


def ngram_proposal(tokens: Sequence[int], min_n: int, max_n: int, k: int, max_model_len: int,
                   runner: str = V1) -> list[int]:
    """vLLM 0.32's ngram proposal for ``tokens`` (prompt + output so far), on the model runner that runs it.

    V1 (the CPU build; a GPU under ``VLLM_USE_V2_MODEL_RUNNER=0``): the same rule as
    ``_find_longest_matched_ngram_and_propose_tokens`` in ``vllm/v1/spec_decode/ngram_proposer.py``:
    the longest suffix n-gram of length in [min_n, max_n] that occurs earlier (its earliest
    occurrence on ties), then up to k tokens that followed it; no match, no draft.
    V2 (the CUDA build's default): ``NgramGPUSpeculator`` in
    ``vllm/v1/worker/gpu/spec_decode/ngram/speculator.py``: the longest n-gram too, but its latest
    occurrence on ties (the scan packs ``n * (L + 1) + pos + 1`` and takes the max), and always k
    tokens: slots past the tokens that followed the match, and every slot without a match, hold the
    last token (``tl.where(slot_valid, gathered, last_tok)``). Both capped by the room left in the
    context, as V1's proposer caps k (near ``max_model_len`` vLLM's scheduler trims either runner's draft).
    """
    total = len(tokens)
    k = min(k, max_model_len - total)
    if k <= 0 or total == 0:
        return []
    if runner == V2:
        longest, position = _longest_match(tokens, max_n, rightmost=True) if total >= min_n else (0, 0)
        got: list[int] = []
        if longest >= min_n:
            start = total - 1 - position + longest
            got = list(tokens[start:start + k])
        return got + [tokens[-1]] * (k - len(got))
    if total < min_n:
        return []
    longest, position = _longest_match(tokens, max_n, rightmost=False)
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
                     max_model_len: int, runner: str = V1) -> Acceptance:
    """ngram (k, lookup min_n..max_n) over (prompt ids, output ids) pairs, as ``runner`` proposes."""
    total = Acceptance()
    for prompt, output in pairs:
        total += replay(prompt, output,
                        lambda ctx, _pos: ngram_proposal(ctx, min_n, max_n, k, max_model_len, runner), k)
    return total


SUFFIX_DEFAULTS = {"suffix_decoding_max_tree_depth": 24, "suffix_decoding_max_spec_factor": 1.0,
                   "suffix_decoding_min_token_prob": 0.1, "suffix_decoding_max_cached_requests": 10000}  # vLLM 0.32's


def suffix_available() -> bool:
    """Whether Arctic Inference (the suffix tree vLLM's ``method: suffix`` runs) is installed here."""
    return package_installed("arctic_inference")


def suffix_acceptance(pairs: Sequence[tuple[Sequence[int], Sequence[int]]], *, k: int, max_model_len: int,
                      max_tree_depth: int = 24, max_spec_factor: float = 1.0, min_token_prob: float = 0.1,
                      max_cached_requests: int = 10000, warmup: int = 0, windows: int = 1) -> Acceptance:
    """Suffix decoding (depth k and vLLM's ``suffix_decoding_*`` knobs) over (prompt ids, output ids)
    pairs, one request at a time in their order, through Arctic Inference's own cache.

    The calls are those of vLLM 0.32's ``SuffixDecodingProposer.propose`` after every engine step of
    a request: ``start_request`` with its prompt on the first, ``add_active_response`` with the
    tokens the step gave, then ``speculate`` on the last ``max_tree_depth`` tokens for at most
    ``min(k, max_model_len - tokens - 1)``; the draft is any length from 0 to that, and a step
    with none is no draft in vLLM's counters (nothing to verify). The last step's tokens are added
    too (the proposer runs after it), so the next requests see the whole response.
    ``warmup`` pairs first (uncounted) and ``windows`` passes over all pairs mirror an engine that
    serves them all with one cache; a trial does not (each window starts with an empty cache,
    autotune.run.vllm_ext), so the study forecasts with the defaults, one pass from an empty cache.
    """
    from arctic_inference.suffix_decoding import SuffixDecodingCache  # optional: only where suffix runs

    cache = SuffixDecodingCache(max_tree_depth=max_tree_depth, max_cached_requests=max_cached_requests)
    total = Acceptance()
    sent = [(p, False) for p in pairs[:warmup]] + [(p, True) for _ in range(windows) for p in pairs]
    for n, ((prompt, output), counted) in enumerate(sent):
        got = _suffix_request(cache, f"r{n}", prompt, output, k=k, max_model_len=max_model_len,
                              max_tree_depth=max_tree_depth, max_spec_factor=max_spec_factor,
                              min_token_prob=min_token_prob)
        if counted:
            total += got
    return total


def _suffix_request(cache: Any, rid: str, prompt: Sequence[int], output: Sequence[int], *, k: int,
                    max_model_len: int, max_tree_depth: int, max_spec_factor: float,
                    min_token_prob: float) -> Acceptance:
    """One request through the shared cache (``suffix_acceptance``)."""
    if not output:
        return Acceptance()
    prompt = [int(t) for t in prompt]
    cache.start_request(rid, prompt)
    fed = 0  # output tokens the cache has

    def propose(context: Sequence[int], pos: int) -> list[int]:
        nonlocal fed
        cache.add_active_response(rid, [int(t) for t in output[fed:pos]])
        fed = pos
        draft = cache.speculate(rid, list(context[-max_tree_depth:]),
                                max_spec_tokens=min(k, max_model_len - len(context) - 1),
                                max_spec_factor=max_spec_factor, min_token_prob=min_token_prob)
        return list(draft.token_ids)

    got = replay(prompt, output, propose, k)
    # The step that ended the request: vLLM skips a request at max_model_len (nothing is added).
    if len(prompt) + len(output) < max_model_len:
        cache.add_active_response(rid, [int(t) for t in output[fed:]])
    cache.stop_request(rid)
    return got


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


@dataclass(frozen=True)
class Eagle3Trace:
    """An EAGLE-3 head's greedy drafts along the baseline's path: ``drafts[i]`` is the chain it drafts
    once prompt + output[:i + 1] is known (for output[i + 1], output[i + 2], ...), as deep as traced;
    ``beyond``: the target's greedy tokens after an output that ended in end-of-sequence (vLLM
    verifies, and counts, drafts past an accepted end before it cuts the output there)."""

    prompt: tuple[int, ...]
    output: tuple[int, ...]
    drafts: tuple[tuple[int, ...], ...] = field(default=())
    beyond: tuple[int, ...] = ()


def eagle3_acceptance(traces: Sequence[Eagle3Trace], *, k: int) -> Acceptance:
    """eagle3 with depth k (greedy), from each request's chained drafts (``autotune.forecast.eagle3_trace.trace``).

    Unlike a draft model's, an EAGLE-3 chain is not the teacher-forced argmax at each position: past
    its first token the head reads its own hidden state, so the j-th token of a chain depends on
    where the chain started, and the trace keeps one chain per start. A chain shorter than k (traced
    less deep) is padded with tokens that are never accepted. The steps are ``replay``'s, except
    that a draft run that reaches the output's end-of-sequence goes on being checked against what
    the target says after it (``beyond``), as vLLM's counters do.
    """
    total = Acceptance()
    for t in traces:
        n = len(t.output)
        if n == 0:
            continue
        full = tuple(t.output) + tuple(t.beyond)
        pos, drafts, drafted, accepted, steps = 1, 0, 0, 0, 0
        per_pos = [0] * k
        while pos < n:
            draft = (list(t.drafts[pos - 1][:k]) + [-1] * k)[:k]
            run = 0
            while run < k and pos + run < len(full) and draft[run] == full[pos + run]:
                per_pos[run] += 1
                run += 1
            drafts, drafted, accepted = drafts + 1, drafted + k, accepted + run
            pos += min(run + 1, n - pos)
            steps += 1
        total += Acceptance(drafts, drafted, accepted, tuple(per_pos), n, steps, 1)
    return total


def eagle3_traces(outputs: Sequence[dict[str, Any]], traced: dict[str, dict[str, list]]) -> list[Eagle3Trace]:
    """Eagle3Traces from the baseline's outputs and their trace (request id -> ``drafts``, ``beyond``)."""
    return [Eagle3Trace(tuple(o["prompt_token_ids"]), tuple(o["token_ids"]),
                        tuple(tuple(c) for c in traced[o["id"]]["drafts"]), tuple(traced[o["id"]].get("beyond", ())))
            for o in outputs if o["id"] in traced]


def trace_job(draft_kwargs: dict[str, Any], outputs: Sequence[dict[str, Any]], engine_module: str) -> dict[str, Any]:
    """The worker job that traces a draft model over the baseline's outputs (autotune.run.engine._trace).

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
