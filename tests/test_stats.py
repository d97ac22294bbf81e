"""The two-sample test on a known model (tests/markov.py): passes exact speculative sampling,
flags the variant that resamples from p instead of the residual."""

import numpy as np

from autotune.measure.stats import DEFAULT_ALPHA, two_sample_test
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
    from autotune.measure.stats import sampler_test

    rng = np.random.default_rng(3)
    base = {"a": [list(s) for s in target(rng, N)]}
    good = {"a": [list(s) for s in speculative(rng, N)]}
    bad = {"a": [list(s) for s in speculative(rng, N, broken=True)]}
    flagged, p, n = sampler_test(base, good)
    assert not flagged and n == N and 0.01 <= p <= 1
    assert sampler_test(base, bad)[0]


# --- Faults after the first 3 tokens (issue 16): the whole draw is tested ---------------------

from markov import LATE_START, late_fault, marginals, speculative_batch, target_batch  # noqa: E402

from autotune.measure.stats import HEAD_TOKENS, occupancy_test, sampler_test  # noqa: E402


def _head(samples):
    return {k: [d[:HEAD_TOKENS] for d in v] for k, v in samples.items()}


def test_the_batch_sampler_is_exact_and_its_late_faults_start_late():
    rng = np.random.default_rng(11)
    exact = np.array(speculative_batch(rng, 20000, 8))
    hot = np.array(late_fault(rng, 20000, "temperature 0.7", 8))
    freq = lambda d: np.stack([np.bincount(d[:, t], minlength=4) / len(d) for t in range(d.shape[1])])  # noqa: E731
    assert np.abs(freq(exact) - marginals(8)).max() < 0.02
    gap = np.abs(freq(hot) - marginals(8)).max(axis=1)
    assert gap[:LATE_START].max() < 0.02 and gap[LATE_START + 2:].min() > 0.04


def test_a_late_temperature_fault_is_caught_by_the_whole_draw_not_by_its_first_3_tokens():
    for seed in range(3):
        rng = np.random.default_rng(500 + seed)
        base = {i: target_batch(rng, 400, 12) for i in range(2)}
        cand = {i: late_fault(rng, 400, "temperature 0.7", 12) for i in range(2)}
        assert not sampler_test(_head(base), _head(cand))[0]  # the first 3 tokens are right
        flagged, p, n = sampler_test(base, cand)
        assert flagged and p < 1e-4 and n == 800


def test_exact_speculative_sampling_with_long_draws_is_not_flagged():
    flags = 0
    for seed in range(20):
        rng = np.random.default_rng(700 + seed)
        base = {i: target_batch(rng, 200, 16) for i in range(2)}
        flagged, p, _ = sampler_test(base, {i: speculative_batch(rng, 200, 16) for i in range(2)})
        flags += flagged
        assert 0 < p <= 1
    assert flags == 0  # expected 0.2 of 20 at alpha = 1%


def _eos(draw):
    """A stop rule applied alike to both sides (EOS): the draw ends at its first 3 after the first token."""
    return next((draw[:i + 1] for i in range(1, len(draw)) if draw[i] == 3), draw)


def test_ragged_draws_ending_early_are_tested_with_ended_as_an_outcome():
    rng = np.random.default_rng(9)
    base = {i: [list(_eos(d)) for d in target_batch(rng, 300, 12)] for i in range(2)}
    good = {i: [list(_eos(d)) for d in speculative_batch(rng, 300, 12)] for i in range(2)}
    lengths = {len(d) for v in base.values() for d in v}
    assert min(lengths) < HEAD_TOKENS and max(lengths) == 12  # some end before the 3rd token
    assert not sampler_test(base, good)[0]
    # A candidate that also stops at state 2 from the 4th token on: its first 3 tokens are right,
    # its stopping is not, and the "ended" outcome shows it.
    early = {k: [d[:next((i + 1 for i in range(LATE_START, len(d)) if d[i] == 2), len(d))] for d in v]
             for k, v in good.items()}
    assert sampler_test(base, early)[0] and not sampler_test(_head(base), _head(early))[0]
    # Degenerate input is neutral: no draws, draws no longer than the head, one outcome only.
    assert occupancy_test([([], [[1, 2, 3, 4]])]).dof == 0
    assert occupancy_test([([[1, 2]] * 20, [[1]] * 20)]).dof == 0
    assert occupancy_test([([[1, 2, 3, 4, 4]] * 20, [[9, 9, 3, 4, 4]] * 20)]).p_value == 1.0


def test_draws_of_3_tokens_give_the_two_feature_test_of_before():
    rng = np.random.default_rng(3)
    base = {"a": [list(s) for s in target(rng, 300)], "b": [list(s) for s in target(rng, 300)]}
    cand = {"a": [list(s) for s in speculative(rng, 300, broken=True)], "b": [list(s) for s in speculative(rng, 300)]}
    pairs = lambda f: [([f(x) for x in base[k]], [f(x) for x in cand[k]]) for k in base]  # noqa: E731
    old = min(1.0, 2 * min(two_sample_test(pairs(lambda x: tuple(x[:1]))).p_value,
                           two_sample_test(pairs(tuple)).p_value))
    assert sampler_test(base, cand)[1] == old


def test_one_late_position_without_pairs_is_the_chi_square_test():
    rng = np.random.default_rng(5)
    a = [(0, 0, 0, int(x)) for x in rng.choice(4, 400, p=[0.4, 0.3, 0.2, 0.1])]
    b = [(0, 0, 0, int(x)) for x in rng.choice(4, 300, p=[0.35, 0.3, 0.2, 0.15])]
    occ = occupancy_test([(a, b)], bigrams=False)
    chi = two_sample_test([([x[3:] for x in a], [x[3:] for x in b])])
    assert occ.dof == chi.dof == 3 and 0.8 < occ.p_value / chi.p_value < 1.25
