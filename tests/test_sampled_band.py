"""Sampled requests under numerics (issue 43): a first-token shift within the dtype's near-tie
threshold (over the temperature) passes the distribution test, a larger one fails; the later-token
test and float32 stay exact. Unit tests on counts, and fake-engine studies (tests/fake_engine.py's
AUTOTUNE_FAKE_FIRST_SHIFT, a FAKE engine: orchestration only)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from autotune.core.candidate import Settings
from autotune.core.space import load_space
from autotune.core.workload import load_workload
from autotune.measure.config import StudyConfig
from autotune.measure.nearties import dtype_threshold
from autotune.measure.sampled_band import band_pearson, band_test, judge_samples
from autotune.measure.stats import _table_stat, sampler_test
from autotune.study.loop import run_study

BF16, F32 = dtype_threshold("bfloat16"), dtype_threshold("float32")


def _counts(rng: np.random.Generator, p: np.ndarray, n: int) -> np.ndarray:
    return rng.multinomial(n, p / p.sum()).astype(float)


def test_band_zero_is_the_exact_statistic_and_a_wider_band_never_raises_it():
    rng = np.random.default_rng(0)
    p = np.array([0.5, 0.3, 0.15, 0.05])
    a, b = _counts(rng, p, 300), _counts(rng, p * np.exp([0.3, -0.2, 0.0, 0.1]), 300)
    outcomes_a = [i for i, k in enumerate(a) for _ in range(int(k))]
    outcomes_b = [i for i, k in enumerate(b) for _ in range(int(k))]
    exact, _ = _table_stat(outcomes_a, outcomes_b, 1)
    assert band_pearson(a, b, 0.0) == pytest.approx(exact)
    stats = [band_pearson(a, b, band) for band in (0.0, 0.05, 0.1, 0.2, 0.4)]
    assert all(x >= y - 1e-9 for x, y in zip(stats, stats[1:])) and stats[-1] < stats[0] / 4, stats


def test_a_shift_at_the_band_edge_is_flagged_by_the_exact_test_and_rarely_by_the_band_test():
    """The null of the band test is composite: every outcome within exp(+-band). At its edge (each
    log-ratio at +-band) the exact test flags most seeds at 2,000 draws; the band test about alpha."""
    band = 0.25
    up = (1 - np.exp(-band)) / (np.exp(band) - np.exp(-band))  # the share moved up, so that q sums to 1
    p = np.array([0.3, 0.35, up - 0.3, 1 - up - 0.35])
    q = p * np.exp([band, -band, band, -band])
    assert q.sum() == pytest.approx(1.0) and np.allclose(np.abs(np.log(q / p)), band)
    rng = np.random.default_rng(1)
    exact = band_flagged = 0
    for _ in range(100):
        a, b = _counts(rng, p, 2000), _counts(rng, q, 2000)
        oa = [i for i, k in enumerate(a) for _ in range(int(k))]
        ob = [i for i, k in enumerate(b) for _ in range(int(k))]
        exact += band_test([(oa, ob, 0.0)]) < 0.01
        band_flagged += band_test([(oa, ob, band)]) < 0.01
    assert exact >= 90 and band_flagged <= 4, (exact, band_flagged)
    # a fault well past the band (three times it) is still caught
    far = p * np.exp([3 * band, -3 * band, 3 * band, -3 * band])
    a, b = _counts(rng, p, 2000), _counts(rng, far, 2000)
    oa = [i for i, k in enumerate(a) for _ in range(int(k))]
    ob = [i for i, k in enumerate(b) for _ in range(int(k))]
    assert band_test([(oa, ob, band)]) < 1e-6


def test_float32_band_is_the_exact_test_and_later_tokens_stay_exact():
    rng = np.random.default_rng(2)

    def draws(w0: float, n: int = 256) -> list[list[int]]:
        first = rng.choice(3, n, p=np.array([w0, 1, 1]) / (w0 + 2))
        return [[int(f), *rng.integers(0, 3, 5).tolist()] for f in first]

    base, cand = {"s": draws(1.0)}, {"s": draws(3.0)}
    exact = sampler_test(base, cand)
    v32 = judge_samples(base, cand, {"s": 1.0}, F32, alpha=0.01)
    assert v32.p == pytest.approx(exact[1]) and v32.p_band == pytest.approx(v32.p, rel=1e-3) and v32.flagged
    # a fault that starts after the first three tokens: no band there, caught in bfloat16 too
    late = {"s": [d[:3] + [0, 0, 0] for d in draws(1.0)]}
    v16 = judge_samples(base, late, {"s": 1.0}, BF16, alpha=0.01)
    assert v16.flagged and v16.p_band < 1e-6


def _workload(tmp_path, temperature: float):
    rows = [{"id": f"s{i}", "prompt": f"sampled {i}", "max_tokens": 24, "temperature": temperature, "seed": 10 + i}
            for i in range(3)]
    path = tmp_path / "sampled.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return load_workload(str(path))


def _study(tmp_path, dtype: str):
    from autotune.study.pareto import trials_frame
    from autotune.study.view import StudyView

    space = load_space("tests/data/fake_space.yaml", platform="cpu", models=set())
    c = StudyConfig(name="fake", results_dir=tmp_path / "fake", settings=Settings(model="fake-model", dtype=dtype),
                    n_trials=2, trial_timeout_s=20, engine_module="fake_engine", samples=64, sample_tokens=6)
    ngram = {"method": "ngram", "num_speculative_tokens": 3, "kv_cache_dtype": "auto", "quantization": "none"}
    study = run_study(c, _workload(tmp_path, 0.25), space, enqueue=[ngram])
    return study.trials[1].user_attrs["verdict"], trials_frame(StudyView.of(study))


@pytest.mark.parametrize("shift, dtype, passes", [("0.25", "bfloat16", True), ("1.0", "bfloat16", False),
                                                  ("0.25", "float32", False)])
def test_a_first_token_moved_within_bfloat16s_numerics_passes_and_a_fault_does_not(
        tmp_path, fake_engine_env, monkeypatch, shift, dtype, passes):
    """FAKE engine: the speculative config moves its first token's near-tied logits apart by ``shift``
    nats at temperature 0.25. 0.25 is bfloat16's near-tie threshold: the exact test flags it (so the
    rule before issue 43's sampled part rejected it), the band test does not; float32's threshold is
    ~4e-6, so there it is a fault; 1.0 is four thresholds, a fault in any dtype."""
    monkeypatch.setenv("AUTOTUNE_FAKE_FIRST_SHIFT", shift)
    v, frame = _study(tmp_path, dtype)
    assert v["distribution_p"] < 0.01, v  # the exact test sees every one of them
    row = frame.set_index("trial").loc[1]
    assert row["distribution_p"] == pytest.approx(v["distribution_p"])
    assert row["distribution_p_band"] == pytest.approx(v["distribution_p_band"])
    if passes:
        assert v["passed"] and v["distribution_p_band"] >= 0.01 and v["constraints"][3] == 0, v
        assert "sampled outputs differ at numerics only" in v["reason"] and "+-0.25/T nats per token" in v["reason"]
    else:
        assert not v["passed"] and v["distribution_p_band"] < 0.01 and v["constraints"][3] > 0, v
        assert "differ in distribution from the baseline's" in v["reason"] and "within the numerics band" in v["reason"]


def test_the_dual_finds_the_constrained_maximum_likelihood():
    """band_pearson's fit (by its two-multiplier dual) is feasible and at least as likely as a
    general solver's (SLSQP over all 2K log-probabilities) on random tables."""
    from scipy.optimize import minimize

    from autotune.measure.sampled_band import _fit

    rng = np.random.default_rng(3)
    for _ in range(6):
        k = int(rng.integers(3, 20))
        p = rng.dirichlet(np.ones(k))
        a, b = _counts(rng, p, 256), _counts(rng, p * np.exp(rng.normal(0, 0.4, k)), 256)
        keep = a + b > 0
        a, b = a[keep], b[keep]
        k = len(a)
        for band in (0.05, 0.25, 0.75):
            fp, fq = _fit(a, b, band)
            assert abs(fp.sum() - 1) < 1e-6 and abs(fq.sum() - 1) < 1e-6
            assert np.all(np.abs(np.log(fq / fp)) <= band + 1e-6)
            x0 = np.concatenate([np.log((a + b) / (a + b).sum()), np.zeros(k)])
            res = minimize(lambda x: -float(a @ x[:k] + b @ (x[:k] + x[k:])), x0, method="SLSQP",
                           bounds=[(-60.0, 0.0)] * k + [(-band, band)] * k,
                           constraints=[{"type": "eq", "fun": lambda x: np.exp(x[:k]).sum() - 1.0},
                                        {"type": "eq", "fun": lambda x: np.exp(x[:k] + x[k:]).sum() - 1.0}])
            ll = float(a @ np.log(fp) + b @ np.log(fq))
            assert ll >= -res.fun - 1e-4, (band, ll, -res.fun)  # both solvers stop within ~1e-6
