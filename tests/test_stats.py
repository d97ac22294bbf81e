"""The two-sample test on a known model (tests/markov.py): passes exact speculative sampling,
flags the variant that resamples from p instead of the residual."""

import numpy as np

from autotune.stats import DEFAULT_ALPHA, two_sample_test
from markov import speculative, target

N = 1000  # samples per side per prompt: power 19/20 at 800 (benchmarks/false_alarm.py)


def test_identical_samples_are_not_flagged_and_empty_input_is_neutral():
    a = [(1, 2, 3)] * 30 + [(1, 2, 4)] * 30
    assert two_sample_test([(a, list(a))]).p_value == 1.0
    assert two_sample_test([([], a)]).dof == 0 and two_sample_test([]).p_value == 1.0


def test_exact_speculative_sampling_passes_over_many_seeds():
    flags = 0
    for seed in range(100):
        rng = np.random.default_rng(seed)
        pairs = [(target(rng, N), speculative(rng, N)) for _ in range(2)]
        flags += two_sample_test(pairs).flagged(DEFAULT_ALPHA)
    # Calibrated at alpha = 1%: expect about 1 in 100; 4 or more would happen by chance < 2% of the time.
    assert flags <= 3, flags


def test_resampling_from_p_after_rejection_is_caught():
    caught = 0
    for seed in range(20):
        rng = np.random.default_rng(1000 + seed)
        pairs = [(target(rng, N), speculative(rng, N, broken=True)) for _ in range(2)]
        caught += two_sample_test(pairs).flagged(DEFAULT_ALPHA)
    assert caught >= 18, caught


def test_correct_sampler_matches_the_target_marginals():
    rng = np.random.default_rng(7)
    a, b = target(rng, 20000), speculative(rng, 20000)
    fa = np.bincount([s[0] for s in a], minlength=4) / len(a)
    fb = np.bincount([s[0] for s in b], minlength=4) / len(b)
    assert np.abs(fa - fb).max() < 0.02


def test_sampler_test_bonferroni_over_first_token_and_joint():
    from autotune.stats import sampler_test

    rng = np.random.default_rng(3)
    base = {"a": [list(s) for s in target(rng, N)]}
    good = {"a": [list(s) for s in speculative(rng, N)]}
    bad = {"a": [list(s) for s in speculative(rng, N, broken=True)]}
    flagged, p, n = sampler_test(base, good)
    assert not flagged and n == N and 0.01 <= p <= 1
    assert sampler_test(base, bad)[0]
