"""Acceptance replay (autotune.predict) on hand-built token sequences, and vLLM's own ngram rule."""

import random

import numpy as np
import pytest

from autotune.predict import Acceptance, DraftTrace, draft_acceptance, ngram_acceptance, ngram_proposal, replay


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
