"""The study's numerics (autotune.measure.numerics) on hand-built scores: the logits' grid read for
the logit scale, the decode-vs-prefill drift, the threshold made of them, the excess test's null, and
the baseline's own flips widening the threshold only up to the cap."""

import random

import pytest

from autotune.measure.nearties import dtype_threshold
from autotune.measure.numerics import (CAP_MULT, DRIFT_MULT, Numerics, logit_scale, measure_drift, measure_numerics,
                                       numerics_for, widen)


def _scores(n_req=8, n_tok=30, step=2.0 ** -4, seed=1):
    """Scores whose top two log-probs differ by a whole number of ``step`` (a 16-bit grid), the
    runner-up (token + 100) below the path token."""
    rng = random.Random(seed)
    out = {}
    for r in range(n_req):
        path = [rng.randrange(50) for _ in range(n_tok)]
        lps = [-round(rng.random() * 0.1, 5) for _ in path]
        gaps = [rng.randrange(1, 80) * step for _ in path]
        out[f"r{r}"] = {"token_ids": path, "logprobs": lps,
                        "top": [[[t, lp], [t + 100, round(lp - g, 5)]] for t, lp, g in zip(path, lps, gaps)]}
    return out


def _decoded(scores, drift):
    """The scores' own paths decoded, each token's log-prob ``drift(i)`` off (its runner-up's not)."""
    return {rid: {"token_ids": s["token_ids"], "logprobs": [lp + drift(i) for i, lp in enumerate(s["logprobs"])],
                  "top": [[[t, lp + drift(i)], *rest] for i, ((t, lp), *rest) in enumerate(s["top"])]}
            for rid, s in scores.items()}


def test_the_logit_scale_is_read_from_the_bf16_grid_and_assumed_in_float32():
    scale, how = logit_scale(_scores(step=2.0 ** -4), "bfloat16")
    # a step of 2^-4 on bfloat16's 8-bit grid: logits in [8, 16) (or an even multiple's coarser reading)
    assert scale in (16.0, 32.0) and "measured" in how
    assert logit_scale(_scores(step=2.0 ** -6), "bfloat16")[0] in (4.0, 8.0)
    none, why = logit_scale(_scores(), "float32")
    assert none is None and "no grid above the scores' resolution" in why
    jitter = {rid: {**s, "top": [[[t, lp], [u, lp - 0.01234 - 0.0007 * i]] for i, ((t, lp), (u, _)) in enumerate(s["top"])]}
              for rid, s in _scores().items()}
    assert logit_scale(jitter, "bfloat16")[0] is None  # not on a grid: not read


def test_the_drift_is_each_decoded_tokens_log_prob_against_its_prefill_one_on_the_common_prefix():
    sc = _scores(n_req=2, n_tok=10)
    dec = _decoded(sc, lambda i: 0.01 * i)
    dec["r1"]["token_ids"] = dec["r1"]["token_ids"][:4] + [999] * 6  # parts after 4 tokens: the rest not compared
    d = measure_drift(dec, sc)
    assert d.positions == 14 and d.requests == 2 and d.max == pytest.approx(0.09)
    assert d.token.nonzero == 12 and d.token.share_at_least(0.085) == pytest.approx(1 / 14, abs=0.02)
    assert d.lead.positions == 14 and d.lead.nonzero == 12  # the top two's lead moved as the token did


def test_the_threshold_is_the_drift_times_two_floored_by_the_dtypes_rounding_at_the_measured_scale():
    sc = _scores(step=2.0 ** -4)
    quiet = measure_numerics("bfloat16", sc, _decoded(sc, lambda i: 0.0))
    scale = logit_scale(sc, "bfloat16")[0]
    assert quiet.threshold.value == pytest.approx(dtype_threshold("bfloat16", scale).value)  # the floor
    assert "rounding at logit scale" in quiet.threshold.source and "measured" in quiet.threshold.source
    loud = measure_numerics("bfloat16", sc, _decoded(sc, lambda i: 0.3 if i == 7 else 0.0))
    assert loud.threshold.value == pytest.approx(DRIFT_MULT * 0.3) and loud.cap == pytest.approx(CAP_MULT * 0.6)
    assert "decode-vs-prefill drift" in loud.threshold.source
    bare = measure_numerics("float32", sc, None)
    assert bare.drift is None and bare.null_rate(0.1) is None and "not measured" in bare.threshold.source
    assert "assumed" in bare.threshold.source
    assert Numerics.from_dict(loud.to_dict()) == loud  # stored in the study and read back whole


def test_the_null_rate_is_the_share_of_positions_whose_lead_moved_that_far():
    sc = _scores(n_req=10, n_tok=100)
    n = measure_numerics("bfloat16", sc, _decoded(sc, lambda i: 0.05 if i % 10 == 0 else 0.0))  # 10% moved 0.05
    assert n.null_rate(0.0) == 1.0
    assert n.null_rate(0.04) == pytest.approx((1 + 100) / 1001)  # a lead moved 0.05 >= 0.04: a tenth of 1000
    assert n.null_rate(0.08) == pytest.approx(1 / 1001)  # none moved 0.08: counted one more


def test_a_lossy_dtype_is_judged_by_its_rounding_at_the_baselines_scale():
    sc = _scores()
    base = measure_numerics("bfloat16", sc, _decoded(sc, lambda i: 0.0))
    assert numerics_for(base, "bfloat16", sc) is base
    other = numerics_for(base, "float16", sc)
    assert other.drift is None and other.threshold.value == pytest.approx(dtype_threshold("float16", base.scale).value)
    assert "not float16" in other.threshold.source


def test_baseline_flips_widen_the_threshold_up_to_the_cap_and_those_above_are_findings():
    th = dtype_threshold("bfloat16")
    assert widen(th, 0.5, []).threshold == th
    assert widen(th, 0.5, [("a", 0.1)]).threshold.value == th.value  # below it: kept, never narrowed
    w = widen(th, 0.5, [("a", 0.1), ("b", 0.4)])
    assert 0.4 < w.threshold.value < 0.4001 and "largest margin 0.4 (cap 0.5)" in w.threshold.source
    three = widen(th, 0.5, [("r7", 3.0)])  # 25x bfloat16's largest measured drift: not numerics
    assert three.threshold == th
    assert three.findings == ("the baseline does not reproduce itself at margin 3 nats, request 'r7' "
                              "(above the cap 0.5: widens nothing)",)


def test_the_scale_is_read_where_the_top_two_nearly_tie_when_there_are_enough():
    """Where the lead is large the runner-up sits in a lower binade, its grid finer: near-ties read the
    top logit's own (here a step of 2^-3: logits in [16, 32)), and they are where the floor matters."""
    far = _scores(n_req=8, n_tok=30, step=2.0 ** -6, seed=2)
    for s in far.values():  # every lead over 1 nat: 64 + k steps of 2^-6
        s["top"] = [[[t, lp], [u, round(lp - 1.0 - 2.0 ** -6 * (i % 7 + 1), 5)]]
                    for i, ((t, lp), (u, _)) in enumerate(s["top"])]
    near = {"n": {"token_ids": [0] * 25, "logprobs": [-0.1] * 25,  # leads of 1, 3 or 5 steps of 2^-3
                  "top": [[[0, -0.1], [1, round(-0.1 - 0.125 * (1 + 2 * (i % 3)), 5)]] for i in range(25)]}}
    assert logit_scale(far, "bfloat16")[0] == 2.0 ** (-6 + 8)
    scale, how = logit_scale({**far, **near}, "bfloat16")
    assert scale == 32.0 and "leads under 1 nats" in how
