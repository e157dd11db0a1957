"""Statistics over seed groups' returns, as rliable reports them: the mean, the interquartile
mean (IQM) and its percentile-bootstrap confidence band over the seeds (stratified by task
when several tasks are pooled), and performance profiles."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

# One fixed stream of resamples: the band is then a function of the returns alone, the same
# on a resumed run as on a straight one, with no RNG state to save.
BOOTSTRAP_SEED = 0

Statistic = Callable[..., Any]
"""A reduction called as ``statistic(samples, axis=-1)``, as numpy's are (np.mean, iqm)."""


def iqm(values: ArrayLike, axis: int | None = None) -> Any:
    """The interquartile mean: the mean of the middle 50% of ``values`` (along ``axis``;
    all of them when None), ``scipy.stats.trim_mean(values, 0.25)`` as rliable uses it:
    ``floor(n / 4)`` values are cut from each end, so fewer than 4 values keep them all."""
    data = np.asarray(values, dtype=np.float64)
    if axis is None:
        data, axis = data.reshape(-1), 0
    n = data.shape[axis]
    if n == 0:
        raise ValueError("iqm of no values")
    cut = n // 4  # int(0.25 * n), scipy's count, without the float's rounding
    ordered = np.sort(data, axis=axis)
    middle = np.take(ordered, np.arange(cut, n - cut), axis=axis)
    return middle.mean(axis=axis)


def stratified_resamples(tasks: Sequence[ArrayLike], statistic: Statistic = iqm,
                         resamples: int = 2000, rng: np.random.Generator | None = None
                         ) -> np.ndarray:
    """``statistic`` over ``resamples`` stratified bootstrap draws, as rliable draws them:
    each task's runs (one value per seed) are resampled with replacement within the task,
    and the statistic is taken over all tasks' draws pooled (``statistic(draws, axis=-1)``,
    which may return one value or an array per draw). Returns the (resamples, ...) results.
    ``rng``: where the draws come from (a fixed stream when None, see BOOTSTRAP_SEED)."""
    data = [np.asarray(values, dtype=np.float64).reshape(-1) for values in tasks]
    if not data or any(values.size == 0 for values in data):
        raise ValueError("a bootstrap needs one or more values in every task")
    rng = np.random.default_rng(BOOTSTRAP_SEED) if rng is None else rng
    # All resamples at once: one (resamples, runs) array, one vectorised statistic.
    draws = np.concatenate([values[rng.integers(0, values.size, size=(resamples, values.size))]
                            for values in data], axis=1)
    return np.asarray(statistic(draws, axis=-1), dtype=np.float64)


def percentile_interval(samples: ArrayLike, confidence: float = 0.95
                        ) -> tuple[np.ndarray, np.ndarray]:
    """The ``(1 - confidence) / 2`` and ``(1 + confidence) / 2`` quantiles of bootstrap
    ``samples`` along their first axis."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    tail = (1 - confidence) / 2
    low, high = np.quantile(np.asarray(samples, dtype=np.float64), [tail, 1 - tail], axis=0)
    return low, high


def bootstrap_interval(values: ArrayLike, statistic: Statistic = iqm, confidence: float = 0.95,
                       resamples: int = 2000, rng: np.random.Generator | None = None
                       ) -> tuple[float, float]:
    """The percentile-bootstrap ``confidence`` interval of ``statistic`` over ``values``
    (one per seed of one task): ``resamples`` draws of as many seeds with replacement, and
    the statistic's quantiles over them. rliable's stratified bootstrap over the runs of one
    task is this."""
    if np.asarray(values).size == 0:
        raise ValueError("bootstrap_interval of no values")
    low, high = percentile_interval(stratified_resamples([values], statistic, resamples, rng),
                                    confidence)
    return float(low), float(high)


def performance_profile(scores: ArrayLike, thresholds: ArrayLike, axis: int = -1) -> np.ndarray:
    """The fraction of runs (along ``axis``) whose score exceeds each threshold: rliable's
    score distribution, one curve per row of ``scores``, shaped (..., thresholds)."""
    data = np.asarray(scores, dtype=np.float64)
    above = np.moveaxis(data, axis, -1)[..., None] > np.asarray(thresholds, dtype=np.float64)
    return above.mean(axis=-2)


def seed_means(recent: Sequence[Sequence[float]]) -> list[float | None]:
    """Each seed's mean recent return (None for a seed with no finished episode yet)."""
    return [float(np.mean(r)) if len(r) else None for r in recent]


def group_returns(recent: Sequence[Sequence[float]], rng: np.random.Generator | None = None
                  ) -> dict[str, float] | None:
    """What the group logs at a log step, from each seed's recent returns (its last
    episodes): the mean, min, IQM and the IQM's 95% bootstrap band of the seeds' mean
    returns. None until every seed has finished an episode: a statistic over the seeds that
    happen to have one would mix fewer seeds in than the group has."""
    means = seed_means(recent)
    if not means or any(m is None for m in means):
        return None
    values = np.array(means, dtype=np.float64)
    low, high = bootstrap_interval(values, iqm, rng=rng)
    return {"mean": float(values.mean()), "min": float(values.min()),
            "iqm": float(iqm(values)), "iqm_low": low, "iqm_high": high}
