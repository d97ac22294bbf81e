"""Every token judged (autotune.measure.every_token) on hand-built scores: a differing greedy output
passes only where each of its tokens is the target's top choice or within the threshold of it, and a
run's excused tokens are no more than the baseline's own drift predicts."""

import pytest

from autotune.measure.nearties import FAULT, NEAR, UNSCORED, Threshold
from autotune.measure.numerics import measure_numerics
from autotune.measure.every_token import judge_output
from autotune.measure.validate import Tolerances, Unspeculated, verdict

TH = Threshold(0.25, "test")


def _score(path, lead=3.0, at=None):
    """Teacher-forced scores of ``path``: each token the top one, the runner-up (token + 100) ``lead``
    below; ``at``: position -> (margin under the top, whether the top is another token)."""
    at = at or {}
    top = []
    for i, t in enumerate(path):
        m, other = at.get(i, (0.0, False))
        top.append([[t + 200, round(-0.1 + m, 5)], [t, -0.1]] if other else [[t, -0.1], [t + 100, round(-0.1 - lead, 5)]])
    return {"token_ids": path, "logprobs": [-0.1] * len(path), "top": top}


def _greedy(n, tokens=40):
    reqs = [{"id": f"r{i}", "sampling": {"temperature": 0.0, "max_tokens": tokens}, "expect": {}} for i in range(n)]
    base = [{"id": f"r{i}", "token_ids": list(range(i, i + tokens)), "text": "", "finish_reason": "length", "chunks": 1,
             "error": None} for i in range(n)]
    return reqs, base


def _numerics(base, drift=0.0, every=1):
    """The numerics of a bfloat16 baseline whose decodes drifted ``drift`` at every ``every``-th position."""
    scores = {r["id"]: _score(r["token_ids"]) for r in base}
    move = [drift if i % every == 0 else 0.0 for i in range(len(base[0]["token_ids"]))]
    decode = {rid: {**s, "logprobs": [lp + d for lp, d in zip(s["logprobs"], move)],  # the token and its lead
                    "top": [[[t, lp + d], *rest] for ((t, lp), *rest), d in zip(s["top"], move)]}
              for rid, s in scores.items()}
    return scores, measure_numerics("bfloat16", scores, decode)


def _flip(rec, at, tail):
    """``rec``'s output flipped at ``at`` to the runner-up, then ``tail``."""
    return {**rec, "token_ids": rec["token_ids"][:at] + [rec["token_ids"][at] + 100] + tail}


def test_a_near_tie_flip_followed_by_the_targets_own_continuation_passes():
    """Where the baseline's own decodes moved a lead by 0.12 at a quarter of its positions."""
    reqs, base = _greedy(32)
    scores, num = _numerics(base, drift=0.12, every=4)
    cand = [dict(r) for r in base]
    cand[3] = _flip(base[3], 5, [7000 + j for j in range(34)])
    own = {"r3": _score(cand[3]["token_ids"], at={5: (0.1, True)})}  # 0.1 nats under the top, then its own choices
    v = verdict(reqs, cand, base, lossy=False, tol=Tolerances(), base_scores=scores, own_scores=own,
                numerics=num, threshold=TH)
    assert v.passed and v.status == "ok" and v.near_ties == 1 and v.flip_faults == 0, v.reason
    assert "1/32 greedy outputs differ: 1 within numerics at every token, 0 not" in v.reason
    assert v.excused_positions == 1 and v.flip_margins == (pytest.approx(0.1),)


def test_a_near_tie_flip_followed_by_junk_fails():
    """Judged at its first divergence alone (the rule before), this passed: a near-tie there."""
    reqs, base = _greedy(32)
    scores, num = _numerics(base, drift=0.06)
    cand = [dict(r) for r in base]
    cand[3] = _flip(base[3], 5, [0] * 34)
    junk = {i: (4.0, True) for i in range(6, 40)}  # the target wanted something else, 4 nats up
    own = {"r3": _score(cand[3]["token_ids"], at={5: (0.1, True), **junk})}
    v = verdict(reqs, cand, base, lossy=False, tol=Tolerances(), base_scores=scores, own_scores=own,
                numerics=num, threshold=TH)
    assert not v.passed and v.flip_faults == 1 and v.constraints[0] >= 1, v.reason
    assert "(first: request 'r3' at token 6 (margin 4 nats))" in v.reason


def test_drafts_accepted_at_near_ties_fail_by_their_count_where_the_drift_is_small():
    """Eight outputs each excused once at 0.1 nats: every token within the threshold, but the
    baseline's own decodes never moved a lead by 0.1, so numerics predict almost none."""
    reqs, base = _greedy(32)
    cand = [dict(r) for r in base]
    own = {}
    scores = {r["id"]: _score(r["token_ids"]) for r in base}
    for i in range(0, 32, 4):
        cand[i] = _flip(base[i], 20, [8000 + j for j in range(19)])
        own[f"r{i}"] = _score(cand[i]["token_ids"], at={20: (0.1, True)})
        scores[f"r{i}"] = _score(base[i]["token_ids"], at={20: (0.1, False)})
        scores[f"r{i}"]["top"][20][1][1] = round(-0.1 - 0.1, 5)  # the baseline's lead there: 0.1 nats
    kw = dict(lossy=False, tol=Tolerances(), base_scores=scores, own_scores=own, threshold=TH)
    _, quiet = _numerics(base, drift=0.001)
    v = verdict(reqs, cand, base, numerics=quiet, **kw)
    assert not v.passed and v.flip_faults == 0 and v.near_ties == 8, v.reason
    assert v.excused_positions == 8 and v.excused_p < 1e-6 and "too many excused positions" in v.reason
    _, loud = _numerics(base, drift=0.12)  # decodes that move leads 0.12 everywhere: 0.1-nat flips are numerics
    v = verdict(reqs, cand, base, numerics=loud, **kw)
    assert v.passed and v.excused_positions == 8 and v.excused_p > 0.01, v.reason


@pytest.mark.parametrize("cand,kind", [([1, 2, 3], FAULT), ([1, 2, 3, 4, 5, 6], FAULT)])
def test_an_output_that_stops_early_or_goes_on_with_the_same_tokens_is_a_fault(cand, kind):
    j = judge_output("r", cand, [1, 2, 3, 4, 5], None, None, TH)
    assert j.kind == kind and j.first == len(min(cand, [1, 2, 3, 4, 5], key=len)) and "goes on" in j.why


def test_an_output_not_scored_leaves_the_verdict_unverified_unless_its_first_divergence_is_a_fault():
    """Not scored teacher-forced, an output's later tokens cannot be judged: no verdict without that
    evidence. Its first divergence still can (the baseline's scores), and the token-agreement budget
    still holds it."""
    reqs, base = _greedy(4)
    scores = {r["id"]: _score(r["token_ids"]) for r in base}
    cand = [dict(r) for r in base]
    cand[0] = _flip(base[0], 38, [0])
    near = {**scores, "r0": _score(base[0]["token_ids"], at={}, lead=0.05)}
    v = verdict(reqs, cand, base, lossy=False, tol=Tolerances(), base_scores=near, threshold=TH)
    assert v.status == "unverified" and v.flips_unscored == 1 and v.constraints[5] > 0, v.reason
    assert "every token of 1 differing greedy output(s)" in v.reason
    v = verdict(reqs, cand, base, lossy=False, tol=Tolerances(), base_scores=scores, threshold=TH)
    assert v.status == "failed" and v.flip_faults == 1  # the baseline was sure there: 3 nats
    early = [*cand[:1], _flip(base[1], 5, [0] * 34), *cand[2:]]
    near["r1"] = _score(base[1]["token_ids"], lead=0.05)
    v = verdict(reqs, early, base, lossy=False, tol=Tolerances(), base_scores=near, threshold=TH)
    assert v.status == "failed" and "token agreement" in v.reason  # unscored early flips: over the budget
    j = judge_output("r0", cand[0]["token_ids"], base[0]["token_ids"], {"token_ids": cand[0]["token_ids"],
                                                                         "error": "refused"}, near["r0"], TH)
    assert j.kind == UNSCORED and j.why == "refused"


def test_a_lossy_configs_speculation_is_judged_at_every_token_against_itself_unspeculated():
    reqs, base = _greedy(4)
    twin = [dict(r) for r in base]
    cand = [dict(r) for r in base]
    cand[1] = _flip(base[1], 8, [0] * 31)
    own = {r["id"]: _score(r["token_ids"]) for r in cand}
    own["r1"] = _score(cand[1]["token_ids"], at={8: (0.05, True), 9: (2.0, True)})  # a near-tie, then a fault
    kw = dict(lossy=True, speculative=True, tol=Tolerances(max_drift=1.0), own_scores=own, threshold=TH)
    v = verdict(reqs, cand, base, unspeculated=Unspeculated(twin), **kw)
    assert not v.passed and "against the same config without speculation" in v.reason and v.flip_faults == 1
    own["r1"] = _score(cand[1]["token_ids"], at={8: (0.05, True)})
    assert verdict(reqs, cand, base, unspeculated=Unspeculated(twin), **kw).near_ties == 1


def test_judge_output_kinds():
    ref = [1, 2, 3, 4]
    cand = [1, 2, 103, 9]
    assert judge_output("r", ref, ref, None, None, TH) is None
    ok = judge_output("r", cand, ref, _score(cand, at={2: (0.2, True)}), None, TH)
    assert ok.kind == NEAR and ok.excused == (pytest.approx(0.2),)
    bad = judge_output("r", cand, ref, _score(cand, at={2: (0.2, True), 3: (0.3, True)}), None, TH)
    assert bad.kind == FAULT and bad.fault == (3, pytest.approx(0.3))


def test_a_draft_accepted_under_the_top_shows_in_its_own_decodes_log_probs_at_any_margin():
    """One output flipped 0.01 nats under the top: inside the threshold and, alone, inside what the
    baseline's drift predicts (loud numerics), so the scores alone pass it; its own decode with
    speculation, whose log-probs come from the verifying target's raw logits, ranked that token second:
    a fault however small the margin."""
    reqs, base = _greedy(32)
    scores, loud = _numerics(base, drift=0.12)
    cand = [dict(r) for r in base]
    cand[3] = _flip(base[3], 5, [7000 + j for j in range(34)])
    own = {"r3": _score(cand[3]["token_ids"], at={5: (0.01, True)})}
    kw = dict(lossy=False, tol=Tolerances(), base_scores=scores, numerics=loud, threshold=TH)
    assert verdict(reqs, cand, base, own_scores=own, **kw).passed
    own["r3"]["decoded"] = _score(cand[3]["token_ids"], at={5: (0.01, True)})
    v = verdict(reqs, cand, base, own_scores=own, **kw)
    assert not v.passed and v.flip_faults == 1, v.reason
    assert "at token 5 (margin 0.01 nats): its own decode with speculation emitted" in v.reason


def test_an_own_decode_that_tops_every_token_passes_ties_included():
    """A lossless engine: its own decode's every token is the top one (a tie at token 5), whatever
    path it took; the teacher-forced scores still judge the measured output."""
    from autotune.measure.every_token import own_rank_fault

    path = list(range(10))
    tie = _score(path)
    tie["top"][5] = [[105, -0.1], [5, -0.1]]  # another token at exactly the same log-prob
    assert own_rank_fault(tie) is None
    assert own_rank_fault({"error": "refused"}) is None and own_rank_fault(None) is None
    assert own_rank_fault(_score(path, at={7: (0.2, True)})) == (7, pytest.approx(0.2))
    reqs, base = _greedy(32)
    scores, num = _numerics(base, drift=0.12, every=4)
    cand = [dict(r) for r in base]
    cand[3] = _flip(base[3], 5, [7000 + j for j in range(34)])
    own = {"r3": {**_score(cand[3]["token_ids"], at={5: (0.1, True)}), "decoded": tie}}
    v = verdict(reqs, cand, base, lossy=False, tol=Tolerances(), base_scores=scores, own_scores=own,
                numerics=num, threshold=TH)
    assert v.passed and v.near_ties == 1, v.reason


@pytest.mark.parametrize("sampling,plain", [
    ({"temperature": 0.0, "max_tokens": 8, "ignore_eos": True}, True),
    ({"temperature": 0.0, "min_tokens": 0, "repetition_penalty": 1.0}, True),
    ({"temperature": 0.0, "min_tokens": 4}, False),  # EOS masked: the raw logits' top may be EOS
    ({"temperature": 0.0, "repetition_penalty": 1.1}, False),
    ({"temperature": 0.0, "structured_outputs": {"json": {}}}, False),
    ({"temperature": 0.7}, False),
])
def test_only_plain_greedy_requests_are_decoded_for_their_ranks(sampling, plain):
    from autotune.run.replay import plain_greedy

    assert plain_greedy(sampling) is plain
