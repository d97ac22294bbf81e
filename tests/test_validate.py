import pytest

from autotune.validate import Tolerances, agreement, check_expect, verdict


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
    ok = verdict(reqs, recs, recs, lossy=False, tol=Tolerances(), samples=same, base_samples=base)
    assert ok.passed and ok.distribution_p > 0.01 and ok.distribution_samples == 300
    bad = verdict(reqs, recs, recs, lossy=False, tol=Tolerances(), samples=shifted, base_samples=base)
    assert not bad.passed and bad.distribution_p < 1e-6 and bad.constraints[3] > 0
    assert "differ in distribution" in bad.reason
    lossy = verdict(reqs, recs, recs, lossy=True, tol=Tolerances(), samples=shifted, base_samples=base)
    assert lossy.passed and lossy.distribution_p < 1e-6  # reported, gated by drift instead
