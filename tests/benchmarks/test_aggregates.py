"""The field's aggregates, against hand computation: the IQM, its stratified bootstrap interval
(against the exact distribution of every resample), the probability of improvement and a
performance profile."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from benchmarks.evidence.aggregates import (
    IQM,
    MEAN,
    aggregate,
    improvement,
    iqm,
    normalize,
    performance_profile,
    probability_of_improvement,
)


def test_the_iqm_is_the_mean_of_the_middle_half():
    assert iqm(np.arange(1, 9)) == pytest.approx(4.5)  # 3, 4, 5, 6
    assert iqm([10.0, 1.0, 2.0, 3.0]) == pytest.approx(2.5)  # the middle two of four
    assert normalize(0.35, 0.7) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="reference gained nothing"):
        normalize(0.3, 0.0)


def exact_percentiles(scores: dict, statistic, q=(2.5, 97.5)):
    """The percentile interval over every stratified resample, enumerated (each equally
    likely), tasks weighted equally (3 seeds twice, 2 seeds three times): what the bootstrap
    estimates."""
    per_task = [list(itertools.product(v, repeat=len(v))) for v in scores.values()]
    values = [statistic(np.concatenate([np.array(r * (6 // len(r))) for r in combo]))
              for combo in itertools.product(*per_task)]
    return np.percentile(values, q)


def test_the_stratified_interval_matches_the_exact_resampling_distribution():
    scores = {"reviews": [0.0, 1.0, 2.0], "reasoning": [5.0, 9.0]}
    for statistic in (IQM, MEAN):
        point, low, high = aggregate(scores, statistic, resamples=20000)
        assert point == pytest.approx(statistic(np.array([0.0, 1.0, 2.0] * 2 + [5.0, 9.0] * 3)))
        lo, hi = exact_percentiles(scores, statistic)
        assert low == pytest.approx(lo, abs=0.35) and high == pytest.approx(hi, abs=0.35)
    same = aggregate({"a": [1.0, 1.0], "b": [2.0, 2.0]}, IQM)
    assert same == (1.5, 1.5, 1.5)  # nothing varies: the interval is the point


def test_tasks_weigh_alike_whatever_their_seed_counts():
    # 4 seeds of one task and 2 of another: the mean is the mean of the task means, the IQM
    # the middle half of the scores with the second task's counted twice
    scores = {"reviews": [0.0, 1.0, 2.0, 3.0], "reasoning": [10.0, 20.0]}
    assert aggregate(scores, MEAN)[0] == pytest.approx((1.5 + 15.0) / 2)
    assert aggregate(scores, IQM)[0] == pytest.approx(np.mean([2.0, 3.0, 10.0, 10.0]))
    assert aggregate({"a": [1.0, 2.0], "b": [3.0, 4.0]}, MEAN)[0] == pytest.approx(2.5)


def test_the_probability_of_improvement_counts_pairs_and_halves_ties():
    assert improvement([1.0, 3.0], [2.0, 2.0]) == pytest.approx(0.5)
    assert improvement([2.0], [2.0]) == pytest.approx(0.5)
    p, low, high = probability_of_improvement({"a": [3.0, 4.0], "b": [1.0, 1.0]},
                                              {"a": [1.0, 2.0], "b": [1.0, 1.0]})
    assert p == pytest.approx((1.0 + 0.5) / 2) and low <= p <= high


def test_a_performance_profile_is_the_fraction_of_runs_above_each_threshold():
    scores = {"a": [0.0, 1.0, 2.0, 3.0], "b": [1.0, 1.0]}
    profile = performance_profile(scores, [0.5, 1.5], resamples=500)
    assert [p for p, _, _ in profile] == pytest.approx([(0.75 + 1.0) / 2, (0.5 + 0.0) / 2])
    assert all(lo <= p <= hi for p, lo, hi in profile)
