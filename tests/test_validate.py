import pytest

from autotune.measure.validate import Tolerances, Unspeculated, agreement, check_expect, logprob_drift, verdict


def rec(id, tokens, text="", finish="stop"):
    return {"id": id, "token_ids": tokens, "text": text, "chunks": [[0.1, len(tokens)]], "finish_reason": finish,
            "error": None}


def req(id, temperature=0.0, max_tokens=10, expect=None, stop=()):
    return {"id": id, "sampling": {"temperature": temperature, "max_tokens": max_tokens, "stop": list(stop)},
            "expect": expect or {}}


@pytest.mark.parametrize("a, b, share, first", [
    ([1, 2, 3], [1, 2, 3], 1.0, None), ([1, 2, 3, 4], [1, 2, 9, 4], 0.5, 2), ([1, 2], [1, 2, 3, 4], 0.5, 2),
])
def test_agreement(a, b, share, first):
    assert agreement(a, b) == (share, first)


def test_identical_greedy_passes_and_mismatch_fails_lossless():
    reqs = [req("a"), req("b")]
    base = [rec("a", [1, 2, 3, 4]), rec("b", [5, 6, 7, 8])]
    ok = verdict(reqs, [rec("a", [1, 2, 3, 4]), rec("b", [5, 6, 7, 8])], base, lossy=False, tol=Tolerances())
    assert ok.passed and ok.greedy_identical == 2 and ok.constraints[0] <= 0
    bad = verdict(reqs, [rec("a", [1, 2, 3, 4]), rec("b", [5, 0, 7, 8])], base, lossy=False, tol=Tolerances())
    assert not bad.passed and bad.first_divergence == 1 and bad.token_agreement == pytest.approx(0.625)
    assert "speculation should be lossless" in bad.reason and bad.constraints[0] > 0
    # The same drift is within a 40% budget for a lossy config.
    lossy = verdict(reqs, [rec("a", [1, 2, 3, 4]), rec("b", [5, 0, 7, 8])], base, lossy=True,
                    tol=Tolerances(max_drift=0.4))
    assert lossy.passed


def test_expectation_regressions_fail_but_baseline_failures_do_not():
    reqs = [req("a", expect={"json": True}), req("b", expect={"contains": "ok"})]
    base = [rec("a", [1], '{"x": 1}'), rec("b", [2], "nope")]
    v = verdict(reqs, [rec("a", [1], '{"x": '), rec("b", [2], "nope")], base, lossy=False,
                tol=Tolerances(lossless=1.0))
    assert not v.passed and v.expect_regressions == 1 and v.expect_failed == 2
    assert "request 'a' fails json where the baseline passed" in v.reason


def test_truncated_and_incomplete_outputs_fail():
    reqs = [req("a", max_tokens=2, stop=["END"])]
    base = [rec("a", [1, 2], "fine")]
    v = verdict(reqs, [rec("a", [1, 2], "fine END")], base, lossy=False, tol=Tolerances())
    assert not v.passed and "stop" in v.reason
    v = verdict(reqs, [rec("a", [1], "f", finish=None)], base, lossy=False, tol=Tolerances(lossless=1))
    assert not v.passed and "incomplete" in v.reason and v.constraints[2] == 1


def test_sampled_requests_are_not_token_compared():
    v = verdict([req("a", temperature=0.8)], [rec("a", [1])], [rec("a", [2])], lossy=False, tol=Tolerances())
    assert v.passed and v.sampled_requests == 1 and v.greedy_requests == 0 and v.distribution_p is None


def test_check_expect():
    assert check_expect({"json": True, "regex": r"\d+", "contains": "a"}, '{"a": 1}') == []
    assert check_expect({"json": True, "regex": r"^z", "contains": "q"}, "nope") == ["json", "regex", "contains"]


def test_sampled_distribution_shift_fails_lossless_only():
    import random

    rnd = random.Random(0)
    reqs = [req("s", temperature=0.8)]
    recs = [rec("s", [1])]
    same = {"s": [[rnd.choice([1, 2, 3])] for _ in range(300)]}
    base = {"s": [[rnd.choice([1, 2, 3])] for _ in range(300)]}
    shifted = {"s": [[rnd.choice([1, 1, 1, 2, 3])] for _ in range(300)]}
    # float32: a numerics band of ~4e-6 nats, so the exact test decides (bfloat16's: tests/test_sampled_band.py)
    ok = verdict(reqs, recs, recs, lossy=False, tol=Tolerances(), samples=same, base_samples=base, dtype="float32")
    assert ok.passed and ok.distribution_p > 0.01 and ok.distribution_samples == 300
    bad = verdict(reqs, recs, recs, lossy=False, tol=Tolerances(), samples=shifted, base_samples=base,
                  dtype="float32")
    assert not bad.passed and bad.distribution_p < 1e-6 and bad.constraints[3] > 0
    assert "differ in distribution" in bad.reason
    lossy = verdict(reqs, recs, recs, lossy=True, tol=Tolerances(), samples=shifted, base_samples=base)
    assert lossy.passed and lossy.distribution_p < 1e-6  # reported, gated by drift instead


def score(tokens, logprobs, top=None):
    return {"token_ids": tokens, "logprobs": logprobs, "top": top or [[[t, lp]] for t, lp in zip(tokens, logprobs)]}


def test_logprob_drift_is_measured_on_the_shared_path_and_gates_lossy_only():
    reqs = [req("a"), req("b")]
    recs = [rec("a", [1, 2, 3]), rec("b", [4, 5])]
    base_scores = {"a": score([1, 2, 3], [-0.1, -0.2, -0.3]), "b": score([4, 5], [-1.0, -2.0])}
    # "b" was scored on another path from token 1 on: only its first token is comparable.
    cand_scores = {"a": score([1, 2, 3], [-0.1, -0.4, -0.3]), "b": score([4, 9], [-1.6, -0.5])}
    kw = dict(scores=cand_scores, base_scores=base_scores)
    v = verdict(reqs, recs, recs, lossy=True, tol=Tolerances(max_logprob_drift=0.1), **kw)
    assert v.logprob_tokens == 4 and v.logprob_drift == pytest.approx(0.2) and v.logprob_drift_max == pytest.approx(0.6)
    assert not v.passed and "log-prob drift 0.2 nats/token > 0.1" in v.reason and v.constraints[4] == pytest.approx(0.1)
    wide = verdict(reqs, recs, recs, lossy=True, tol=Tolerances(max_logprob_drift=0.5), **kw)
    assert wide.passed and wide.reason.startswith("ok, log-prob drift 0.2") and wide.constraints[4] == 0
    # A lossy config with log-probs is judged by them, not by tokens that flipped at a near-tie...
    flipped = [rec("a", [1, 2, 3]), rec("b", [4, 9])]
    moved = verdict(reqs, flipped, recs, lossy=True, tol=Tolerances(max_drift=0.0, max_logprob_drift=0.5), **kw)
    assert moved.passed and "4 tokens) within 0.5 (token agreement 0.750, 1/2 greedy outputs differ)" in moved.reason
    assert moved.constraints[0] == 0 and moved.constraints[4] == 0
    # ...and without log-probs, token agreement is the gate.
    unscored = verdict(reqs, flipped, recs, lossy=True, tol=Tolerances(max_drift=0.0, max_logprob_drift=0.5))
    assert not unscored.passed and unscored.reason.startswith("drift: token agreement 0.750")
    lossless = verdict(reqs, recs, recs, lossy=False, tol=Tolerances(max_logprob_drift=0.1), **kw)
    assert lossless.passed and lossless.reason == "ok" and lossless.logprob_drift == pytest.approx(0.2)
    # Not scored (an error on one side, or no scores at all): nothing measured, nothing gated.
    none = verdict(reqs, recs, recs, lossy=True, tol=Tolerances(max_logprob_drift=0.0),
                   scores={"a": {"token_ids": [1, 2, 3], "error": "ValueError: no"}}, base_scores=base_scores)
    assert none.passed and none.logprob_drift is None and none.logprob_tokens == 0


def test_topk_kl_is_zero_for_equal_distributions_and_positive_otherwise():
    base = {"a": score([1], [-0.5], top=[[[1, -0.5], [2, -1.2], [3, -2.0]]])}
    same = {"a": score([1], [-0.5], top=[[[1, -0.5], [2, -1.2], [7, -3.0]]])}
    moved = {"a": score([1], [-0.9], top=[[[1, -0.9], [2, -0.6], [3, -2.0]]])}
    assert logprob_drift(same, base).kl == pytest.approx(0.0, abs=1e-12)
    assert logprob_drift(moved, base).kl > 0.05


def test_an_incomplete_request_carries_the_engines_own_message():
    reqs = [req("a"), req("b")]
    base = [rec("a", [1, 2]), rec("b", [3, 4])]
    rejected = {**rec("b", []), "chunks": [], "finish_reason": None,
                "error": "ValueError: The decoder prompt (length 1342) is longer than the maximum model length of 1024."}
    v = verdict(reqs, [rec("a", [1, 2]), rejected], base, lossy=False, tol=Tolerances())
    assert not v.passed and v.reason.startswith(
        "1 request(s) incomplete (e.g. 'b': ValueError: The decoder prompt (length 1342) is longer than")


def scored(rid, tokens, lps):
    return {rid: {"token_ids": tokens, "logprobs": lps, "top": [[[t, lp]] for t, lp in zip(tokens, lps)]}}


def test_no_evidence_is_unverified_never_ok():
    """Sampled requests with no distribution test, or a lossy config with no log-probs of them: the
    checks that apply did not run, so the verdict is "unverified" (infeasible unless allowed)."""
    reqs, base, cand = [req("g"), req("s", temperature=0.8)], [rec("g", [1, 2]), rec("s", [3])], \
        [rec("g", [1, 2]), rec("s", [4])]
    v = verdict(reqs, cand, base, lossy=False, tol=Tolerances())
    assert v.status == "unverified" and v.constraints[-1] == 1.0 and v.reason.startswith("unverified: not checked:")
    assert "distribution test of sampled requests (--samples 0)" in v.reason
    assert verdict(reqs, cand, base, lossy=False, tol=Tolerances(allow_unverified=True)).constraints[-1] == 0.0
    # The baseline is the reference: nothing to verify it against.
    assert verdict(reqs, base, None, lossy=False, tol=Tolerances()).status == "ok"
    # Lossy: the baseline's sampled path scored under both engines is its evidence.
    greedy_only = {**scored("g", [1, 2], [-0.1, -0.2])}
    v = verdict(reqs, cand, base, lossy=True, tol=Tolerances(), scores=greedy_only, base_scores=greedy_only)
    assert v.status == "unverified" and "log-prob drift on sampled requests" in v.reason
    both = {**greedy_only, **scored("s", [3], [-0.5])}
    shifted = {**greedy_only, **scored("s", [3], [-0.52])}
    v = verdict(reqs, cand, base, lossy=True, tol=Tolerances(), scores=shifted, base_scores=both)
    assert v.status == "ok" and v.passed and v.logprob_tokens == 3 and v.logprob_drift == pytest.approx(0.02 / 3)
    v = verdict(reqs, cand, base, lossy=True, tol=Tolerances(max_logprob_drift=0.001), scores=shifted,
                base_scores=both)
    assert v.status == "failed" and not v.passed


def test_a_lossy_configs_drift_must_cover_every_scored_request():
    """Issue 26, defect 8: log-prob drift is the lossy gate of greedy requests (token agreement is off
    then), so drift resting on one scored request of several is not the workload's drift: unverified,
    and the reason names how many were scored and which were not."""
    reqs = [req("g1"), req("g2"), req("g3")]
    recs = [rec("g1", [1, 2]), rec("g2", [3, 4]), rec("g3", [5, 6])]
    base_scores = {**scored("g1", [1, 2], [-0.1, -0.2]), **scored("g2", [3, 4], [-0.3, -0.4]),
                   **scored("g3", [5, 6], [-0.5, -0.6])}
    one = {**scored("g1", [1, 2], [-0.1, -0.2]),  # g2's scoring failed; g3 was never scored
           "g2": {"token_ids": [3, 4], "error": "ValueError: prompt_logprobs refused"}}
    v = verdict(reqs, recs, recs, lossy=True, tol=Tolerances(), scores=one, base_scores=base_scores)
    assert v.status == "unverified" and v.passed and v.constraints[-1] == 1.0, v.reason
    assert "log-prob drift on greedy requests (scored under both engines for 1 of 3; not for 'g2', 'g3')" \
        in v.reason, v.reason
    # All scored: ok. Lossless candidates are not gated by drift, so partial scoring is no gap there.
    assert verdict(reqs, recs, recs, lossy=True, tol=Tolerances(), scores=base_scores,
                   base_scores=base_scores).status == "ok"
    lossless = verdict(reqs, recs, recs, lossy=False, tol=Tolerances(), scores=one, base_scores=base_scores)
    assert lossless.status == "ok"
    # Sampled requests, the same rule: every one scored, not just one of them.
    sreqs = [req("s1", temperature=0.8), req("s2", temperature=0.8)]
    srecs = [rec("s1", [1]), rec("s2", [2])]
    sbase = {**scored("s1", [1], [-0.1]), **scored("s2", [2], [-0.2])}
    v = verdict(sreqs, srecs, srecs, lossy=True, tol=Tolerances(), scores=scored("s1", [1], [-0.1]),
                base_scores=sbase)
    assert v.status == "unverified" and "sampled requests (scored under both engines for 1 of 2; not for 's2')" \
        in v.reason, v.reason


def test_a_lossy_speculative_config_is_judged_against_itself_without_speculation():
    """Issue 26, defect 1: two checks that must both pass. Its speculation against the same config
    without speculation (greedy tokens and sampled draws, by the lossless rules); its lossy part
    against the baseline, by drift. The baseline's draws cannot judge its sampler: the lossy part
    moves them on purpose."""
    import random

    rnd = random.Random(1)

    def draws(weights, n=300):
        return [[rnd.choices([1, 2, 3], weights)[0]] for _ in range(n)]

    reqs = [req("g"), req("s", temperature=0.8)]
    base = [rec("g", [1, 2, 3, 4]), rec("s", [9])]
    cand = [rec("g", [1, 2, 3, 7]), rec("s", [8])]  # the lossy part moved g's last token
    scores = {**scored("g", [1, 2, 3, 4], [-0.1] * 4), **scored("s", [9], [-0.2])}
    base_draws, lossy_draws = draws([1, 1, 1]), draws([2, 1, 1])  # lossy on purpose: another law
    kw = dict(lossy=True, tol=Tolerances(), scores=scores, base_scores=scores, base_samples={"s": base_draws},
              speculative=True)
    twin = Unspeculated(outputs=[rec("g", [1, 2, 3, 7]), rec("s", [5])], samples={"s": draws([2, 1, 1])})
    ok = verdict(reqs, cand, base, samples={"s": lossy_draws}, unspeculated=twin, **kw)
    assert ok.passed and ok.status == "ok" and ok.speculation_agreement == 1.0, ok.reason
    assert ok.distribution_p > 0.01 and ok.distribution_samples == 300
    # A broken speculative sampler: its draws leave the lossy config's own law.
    broken = verdict(reqs, cand, base, samples={"s": draws([8, 1, 1])}, unspeculated=twin, **kw)
    assert not broken.passed and broken.constraints[3] > 0 and broken.distribution_p < 1e-6
    assert "differ in distribution from the same config without speculation" in broken.reason, broken.reason
    # Speculation that changes the lossy config's greedy tokens: lossless budget, not the drift's.
    moved = verdict(reqs, [rec("g", [1, 9, 9, 9]), rec("s", [8])], base, samples={"s": lossy_draws},
                    unspeculated=twin, **kw)
    assert not moved.passed and moved.constraints[0] > 0 and moved.speculation_agreement == 0.25
    assert moved.reason.startswith("greedy mismatch against the same config without speculation"), moved.reason
    # The lossy part still counts: drift beyond its budget fails whatever the speculation did.
    drifted = {**scored("g", [1, 2, 3, 4], [-0.5] * 4), **scored("s", [9], [-0.6])}
    lossy_fail = verdict(reqs, cand, base, samples={"s": lossy_draws}, unspeculated=twin,
                         **{**kw, "scores": drifted})
    assert not lossy_fail.passed and "log-prob drift 0.4 nats/token > 0.05" in lossy_fail.reason
    # No reference run (or a failed one): the speculation went unchecked, so unverified, never ok.
    for missing, why in ((None, "not run"), (Unspeculated(error="worker crashed"), "its run failed: worker crashed")):
        v = verdict(reqs, cand, base, samples={"s": draws([8, 1, 1])}, unspeculated=missing, **kw)
        assert v.status == "unverified" and v.constraints[-1] == 1.0, v.reason
        assert f"speculation against the same config without speculation ({why})" in v.reason, v.reason
