"""The seed group's statistics: the interquartile mean as rliable (scipy's trim_mean) defines
it, the percentile bootstrap over seeds, and what a log step reports."""

from __future__ import annotations

import numpy as np
import pytest

from rl_graphstep.run.aggregate import (
    bootstrap_interval,
    group_returns,
    iqm,
    percentile_interval,
    performance_profile,
    seed_means,
    stratified_resamples,
)


@pytest.mark.parametrize(("values", "expected"), [
    ([5.0], 5.0),
    ([1.0, 2.0, 9.0], 4.0),  # fewer than 4: nothing is cut
    ([4.0, 1.0, 3.0, 100.0], (3.0 + 4.0) / 2),  # one cut from each end
    ([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], (3 + 4 + 5 + 6) / 4),
    ([-10.0, 1.0, 2.0, 3.0, 1000.0], 2.0),  # 5 values: floor(1.25) = 1 cut each end
    ([7.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0], (2 + 3 + 4 + 5 + 6) / 5),  # 7: one each end
])
def test_iqm_is_the_mean_of_the_middle_half(values: list[float], expected: float) -> None:
    assert iqm(values) == pytest.approx(expected, abs=1e-12)


def test_iqm_along_an_axis_reduces_each_row() -> None:
    rows = np.array([[1.0, 2.0, 3.0, 4.0], [40.0, 10.0, 30.0, 20.0]])
    np.testing.assert_allclose(iqm(rows, axis=-1), [2.5, 25.0])
    np.testing.assert_allclose(iqm(rows.T, axis=0), [2.5, 25.0])
    assert iqm(rows) == pytest.approx(np.mean([3.0, 4.0, 10.0, 20.0]))  # all 8 values
    with pytest.raises(ValueError, match="no values"):
        iqm([])


def test_iqm_matches_scipy_trim_mean() -> None:
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(3)
    for n in range(1, 70):
        values = rng.normal(size=n) * 100
        assert iqm(values) == pytest.approx(stats.trim_mean(values, 0.25), rel=1e-12, abs=1e-12)


def _hand_bootstrap(values: np.ndarray, statistic, confidence: float, resamples: int,
                    seed: int) -> tuple[float, float]:
    """The percentile bootstrap written out one resample at a time."""
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(values), size=(resamples, len(values)))
    stats = sorted(float(statistic(values[row])) for row in draws)
    tail = (1 - confidence) / 2
    return float(np.quantile(stats, tail)), float(np.quantile(stats, 1 - tail))


@pytest.mark.parametrize("statistic", [iqm, np.mean], ids=["iqm", "mean"])
def test_the_bootstrap_is_the_percentile_interval_of_the_resamples(statistic) -> None:
    values = np.array([-150.2, -148.0, -160.1, -140.3, -155.5, -120.0, -139.9, -171.4])
    got = bootstrap_interval(values, statistic, rng=np.random.default_rng(7))
    want = _hand_bootstrap(values, statistic, 0.95, 2000, seed=7)
    assert got == pytest.approx(want, abs=1e-9)
    low, high = got
    assert low < float(statistic(values)) < high
    narrow = bootstrap_interval(values, statistic, confidence=0.5, rng=np.random.default_rng(7))
    assert low < narrow[0] < narrow[1] < high


def test_the_bootstrap_band_is_a_function_of_the_values() -> None:
    values = [1.0, 5.0, 2.0, 8.0, 3.0]
    assert bootstrap_interval(values) == bootstrap_interval(list(values))  # a fixed stream
    assert bootstrap_interval([4.0, 4.0, 4.0]) == (4.0, 4.0)
    assert bootstrap_interval([-3.0]) == (-3.0, -3.0)  # one seed: no spread to resample
    with pytest.raises(ValueError, match="confidence"):
        bootstrap_interval(values, confidence=1.0)
    with pytest.raises(ValueError, match="no values"):
        bootstrap_interval([])


def test_the_mean_bootstrap_covers_like_the_normal_interval() -> None:
    """Many seeds of a normal return: the mean's band is about +-1.96 standard errors."""
    values = np.random.default_rng(0).normal(size=64)
    low, high = bootstrap_interval(values, np.mean, resamples=20_000)
    half = 1.96 * values.std() / np.sqrt(values.size)
    assert (high - low) / 2 == pytest.approx(half, rel=0.05)


def test_a_log_step_reports_the_seeds_means() -> None:
    recent = [[-100.0, -110.0], [-200.0], [-150.0, -160.0, -170.0], [-120.0]]
    assert seed_means(recent) == [-105.0, -200.0, -160.0, -120.0]
    got = group_returns(recent)
    assert got is not None
    means = np.array([-105.0, -200.0, -160.0, -120.0])
    assert got["mean"] == pytest.approx(means.mean())
    assert got["min"] == -200.0
    assert got["iqm"] == pytest.approx((-120.0 - 160.0) / 2)
    assert (got["iqm_low"], got["iqm_high"]) == bootstrap_interval(means)
    assert got["iqm_low"] <= got["iqm"] <= got["iqm_high"]


def test_no_group_statistics_until_every_seed_has_an_episode() -> None:
    assert group_returns([[-100.0], []]) is None
    assert group_returns([]) is None
    assert seed_means([[1.0], []]) == [1.0, None]


def test_a_stratified_bootstrap_resamples_within_each_task() -> None:
    """Each draw keeps every task's number of runs: two tasks of constant returns 1 and 5,
    three seeds each, give a pooled mean of exactly 3 in every draw (a bootstrap over the
    pooled six runs would not)."""
    draws = stratified_resamples([[1.0, 1.0, 1.0], [5.0, 5.0, 5.0]], np.mean, resamples=500)
    assert draws.shape == (500,)
    assert np.all(draws == 3.0)


def test_a_stratified_bootstrap_draws_each_tasks_indices_in_turn() -> None:
    tasks = [np.array([1.0, 2.0, 3.0]), np.array([10.0, 20.0])]
    rng = np.random.default_rng(7)
    expected = np.concatenate([tasks[0][rng.integers(0, 3, size=(4, 3))],
                               tasks[1][rng.integers(0, 2, size=(4, 2))]], axis=1)
    got = stratified_resamples(tasks, lambda d, axis: d, resamples=4,
                               rng=np.random.default_rng(7))
    np.testing.assert_array_equal(got, expected)
    # One task: the same draws, and so the same interval, as bootstrap_interval's.
    low, high = percentile_interval(stratified_resamples([tasks[0]], iqm))
    assert (float(low), float(high)) == bootstrap_interval(tasks[0])
    with pytest.raises(ValueError, match="every task"):
        stratified_resamples([[1.0], []])


def test_a_performance_profile_is_the_fraction_of_runs_above_each_threshold() -> None:
    scores = np.array([[0.5, 1.0, 1.5, 2.0], [3.0, 3.0, 0.0, 0.0]])
    np.testing.assert_array_equal(performance_profile(scores, [0.0, 1.0, 1.75]),
                                  [[1.0, 0.5, 0.25], [0.5, 0.5, 0.5]])
    np.testing.assert_array_equal(performance_profile(scores.T, [1.0], axis=0), [[0.5], [0.5]])
