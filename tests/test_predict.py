"""Acceptance replay (autotune.forecast.predict) on hand-built token sequences, and vLLM's own ngram rule."""

import random

import numpy as np
import pytest

from autotune.forecast.predict import (Acceptance, DraftTrace, draft_acceptance, ngram_acceptance, ngram_proposal, replay,
                              suffix_acceptance, suffix_available)

needs_arctic = pytest.mark.skipif(not suffix_available(), reason="Arctic Inference is not installed "
                                  "(scripts/setup.sh builds it): no suffix tree to replay")


def test_ngram_proposal_copies_what_followed_the_longest_earlier_match():
    # ... 5 6 7 8 9 ... 5 6 7 -> the 3-gram "5 6 7" matched, propose what followed: 8 9
    tokens = [1, 5, 6, 7, 8, 9, 2, 5, 6, 7]
    assert ngram_proposal(tokens, 2, 3, 2, 1024) == [8, 9]
    assert ngram_proposal(tokens, 2, 3, 5, 1024) == [8, 9, 2, 5, 6]
    assert ngram_proposal(tokens, 4, 4, 2, 1024) == []  # no earlier 4-gram match
    assert ngram_proposal(tokens, 2, 3, 5, 12) == [8, 9]  # k capped by the room left in the context


@pytest.mark.parametrize("seed", range(4))
def test_ngram_proposal_is_vllms_rule(seed):
    """The same proposals as vLLM 0.32's numba kernel, on random low-entropy token streams."""
    vllm_rule = pytest.importorskip("vllm.v1.spec_decode.ngram_proposer")._find_longest_matched_ngram_and_propose_tokens
    rng = random.Random(seed)
    for _ in range(200):
        tokens = [rng.randrange(6) for _ in range(rng.randint(1, 80))]
        lo = rng.randint(1, 3)
        hi, k = rng.randint(lo, 5), rng.randint(1, 6)
        want = vllm_rule(np.asarray(tokens, dtype=np.int32), min_ngram=lo, max_ngram=hi, max_model_len=96, k=k)
        assert ngram_proposal(tokens, lo, hi, k, 96) == want.tolist(), (tokens, lo, hi, k)


def test_replay_counts_steps_drafts_and_positions():
    out = [10, 11, 12, 13, 14, 15]
    # A perfect 2-token proposer: every step accepts 2 and adds a bonus token.
    perfect = lambda ctx, pos: out[pos:pos + 2]  # noqa: E731
    a = replay([1, 2], out, perfect, 2)
    # pos 1 -> accept 11, 12 (+13) -> pos 4 -> accept 14, 15 (end) -> done: 2 steps.
    assert (a.drafts, a.draft_tokens, a.accepted, a.per_pos, a.steps) == (2, 4, 4, (2, 2), 2)
    assert a.mean_accepted_length == 3.0 and a.tokens_per_step == pytest.approx(5 / 2)
    none = replay([1, 2], out, lambda ctx, pos: [], 2)
    assert (none.drafts, none.steps, none.tokens_per_step) == (0, 5, 1.0)
    wrong = replay([1, 2], out, lambda ctx, pos: [99, 98], 2)
    assert (wrong.drafts, wrong.draft_tokens, wrong.accepted, wrong.steps) == (5, 10, 0, 5)
    assert (a + wrong).drafts == 7 and (a + wrong).requests == 2


def test_ngram_acceptance_on_a_copied_record():
    prompt = list(range(100, 140))
    output = prompt[:20] + [7] + prompt[21:40]  # the record copied back with one field changed
    a = ngram_acceptance([(prompt, output)], k=4, min_n=2, max_n=3, max_model_len=1024)
    assert a.acceptance_rate > 0.7 and a.tokens_per_step > 3


def test_draft_acceptance_from_a_teacher_forced_argmax():
    out = (5, 6, 7, 8, 9)
    # The draft predicts every next token but output[3]: argmax[i] predicts out[i + 1].
    argmax = (6, 7, 0, 9, 2)
    t = DraftTrace(prompt=(1,), output=out, argmax=argmax)
    a = draft_acceptance([t], k=3)
    # pos 1: drafts 6 7 0 -> accepts 6 7, bonus 8 -> pos 4: drafts 9 . . -> accepts 9, ends.
    assert (a.drafts, a.accepted, a.per_pos, a.steps) == (2, 3, (2, 1, 0), 2)
    assert draft_acceptance([t], k=1).accepted == 2  # 6 (bonus 7), then 0 rejected (bonus 8), then 9
    assert isinstance(Acceptance().acceptance_rate, float)


# --- suffix decoding: Arctic Inference's tree, driven as vLLM drives it -------------------------

PROMPT = list(range(100, 140))  # 40 tokens, all distinct


@needs_arctic
def test_suffix_drafts_grow_with_the_match_and_stop_at_the_response_end():
    """A response the cache has seen once (tokens nowhere in the prompt): the first pass drafts
    nothing; the second drafts what followed, as long as the match (spec factor 1), capped by k,
    and only as far as the cached response goes.

    Output 1..20, k=4. Second pass: the prefill gives 1; the match "1" (1 token) drafts 2 ->
    accepted, + bonus: at 4 the match 1..3 drafts 3 tokens; at 8 and 13 the match (7, 12) allows 4
    (k); at 18 the response has 3 tokens left: drafted and accepted. 15 drafted, 15 accepted."""
    once = suffix_acceptance([(PROMPT, list(range(1, 21)))], k=4, max_model_len=1024)
    assert (once.drafts, once.draft_tokens, once.steps) == (0, 0, 19)
    twice = suffix_acceptance([(PROMPT, list(range(1, 21)))], k=4, max_model_len=1024, windows=2)
    assert (twice.drafts, twice.draft_tokens, twice.accepted, twice.per_pos) == (5, 15, 15, (5, 4, 4, 2))
    assert twice.steps == 19 + 5 and twice.requests == 2
    # max_cached_requests=0: no global tree, each request sees only its own prompt and output.
    alone = suffix_acceptance([(PROMPT, list(range(1, 21)))], k=4, max_model_len=1024, windows=2,
                              max_cached_requests=0)
    assert alone.drafts == 0


@needs_arctic
@pytest.mark.parametrize("factor, drafted, per_pos", [(1.0, 16, (5, 4, 4, 2)), (2.0, 18, (5, 4, 3, 3))])
def test_suffix_copies_the_prompt_as_far_as_the_spec_factor_lets_it(factor, drafted, per_pos):
    """The output copies prompt tokens 105..124. Factor 1: drafts of 1, 3, 4, 4, 4 tokens (the last
    runs past the output's end: drafted, not accepted); factor 2: 2, 4, 4, 4, 4. 15 accepted."""
    a = suffix_acceptance([(PROMPT, PROMPT[5:25])], k=4, max_model_len=1024, max_spec_factor=factor)
    assert (a.drafts, a.draft_tokens, a.accepted, a.per_pos, a.steps) == (5, drafted, 15, per_pos, 5)
    # Little room left in the context caps every draft at max_model_len - tokens - 1.
    tight = suffix_acceptance([(PROMPT, PROMPT[5:25])], k=4, max_model_len=len(PROMPT) + 21, max_spec_factor=factor)
    assert tight.draft_tokens < a.draft_tokens


class _Batch:
    """The part of vLLM's InputBatch that SuffixDecodingProposer.propose reads: one request."""

    def __init__(self, rid, prompt, tokens, max_model_len):
        self.req_ids = [rid]
        self.req_id_to_index = {rid: 0}
        self.num_prompt_tokens = np.array([len(prompt)])
        self.num_tokens_no_spec = np.array([len(tokens)])
        self.token_ids_cpu = np.zeros((1, max_model_len), dtype=np.int32)
        self.token_ids_cpu[0, :len(tokens)] = tokens


def _vllm_suffix(pairs, *, k, depth, factor, prob, cached, max_model_len):
    """vLLM 0.32's own SuffixDecodingProposer, fed step by step as its engine does at concurrency 1;
    drafts counted as its scheduler counts them (a step with a draft is one)."""
    from types import SimpleNamespace

    from vllm.v1.spec_decode.suffix_decoding import SuffixDecodingProposer

    spec = SimpleNamespace(num_speculative_tokens=k, suffix_decoding_max_tree_depth=depth,
                           suffix_decoding_max_spec_factor=factor, suffix_decoding_min_token_prob=prob,
                           suffix_decoding_max_cached_requests=cached)
    proposer = SuffixDecodingProposer(SimpleNamespace(speculative_config=spec,
                                                      model_config=SimpleNamespace(max_model_len=max_model_len)))
    total = Acceptance()
    for n, (prompt, output) in enumerate(pairs):
        rid, pos, sampled = f"req-{n}", 1, list(output[:1])
        drafts = drafted = accepted = steps = 0
        per_pos = [0] * k
        while True:
            tokens = list(prompt) + list(output[:pos])
            draft = proposer.propose(k, _Batch(rid, prompt, tokens, max_model_len), [sampled])[0]
            if pos >= len(output):
                break  # the request ended at this step: its draft is never verified
            run = 0
            while run < len(draft) and pos + run < len(output) and draft[run] == output[pos + run]:
                per_pos[run] += 1
                run += 1
            if draft:
                drafts, drafted, accepted = drafts + 1, drafted + len(draft), accepted + run
            sampled = list(output[pos:pos + run + 1])
            pos += len(sampled)
            steps += 1
        total += Acceptance(drafts, drafted, accepted, tuple(per_pos), len(output), steps, 1)
    return total


@needs_arctic
@pytest.mark.parametrize("seed", range(3))
def test_suffix_replay_is_vllms_proposer(seed):
    """The replay equals vLLM 0.32's own proposer driven request by request, on low-entropy token
    streams where prompts and earlier responses both feed the drafts."""
    pytest.importorskip("vllm.v1.spec_decode.suffix_decoding")
    rng = random.Random(seed)
    phrases = [[rng.randrange(50) for _ in range(rng.randint(3, 9))] for _ in range(6)]

    def text(n):
        return [t for _ in range(n) for t in rng.choice(phrases)] + [rng.randrange(50)]

    pairs = [(text(rng.randint(2, 8)), text(rng.randint(3, 12))) for _ in range(8)]
    longest = max(len(p) + len(o) for p, o in pairs)  # at longest + 2, drafts near the end are capped
    for k, depth, factor, prob, cached, room in [(4, 24, 1.0, 0.1, 10000, 64), (7, 12, 2.5, 0.3, 10000, 2),
                                                 (5, 16, 1.0, 0.0, 3, 64), (3, 24, 1.0, 0.1, 0, 2)]:
        knobs = dict(k=k, max_model_len=longest + room)
        want = _vllm_suffix(pairs, depth=depth, factor=factor, prob=prob, cached=cached, **knobs)
        got = suffix_acceptance(pairs, max_tree_depth=depth, max_spec_factor=factor, min_token_prob=prob,
                                max_cached_requests=cached, **knobs)
        assert got == want, (k, depth, factor, prob, cached)
        assert got.drafts > 0
