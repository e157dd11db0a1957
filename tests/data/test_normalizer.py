"""The observation normaliser: Chan's rule against hand values, per-seed statistics, the
device tensor every normalisation reads, its checkpoint state, and the sampler that normalises
with it (the collector counts: tests/run/test_collector.py); PPO's CleanRL form of it, and
PPO's reward normaliser on a hand sequence (the rollout collector: tests/test_train_ppo_norm.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rl_graphstep.data.buffer import ReplayBuffer
from rl_graphstep.data.normalizer import (
    CLEANRL_FORM,
    REFERENCE_FORM,
    STD_EPS,
    ObservationNormalizer,
    RewardNormalizer,
    chan_update,
    chan_update_seeds,
)
from rl_graphstep.data.sampler import BatchSampler


def column(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float64)[:, None]


def test_chan_update_uses_the_old_mean_in_its_cross_term() -> None:
    count, mean, var = chan_update(0, np.zeros(1), np.ones(1), column(1, 3))
    assert (count, mean[0], var[0]) == (2, 2.0, 1.0)
    count, mean, var = chan_update(count, mean, var, column(5))
    # {1, 3, 5}: mean 3, population variance (4 + 0 + 4) / 3; the references' new-mean cross
    # term would give 1.556.
    assert count == 3
    assert mean[0] == pytest.approx(3.0, abs=1e-15)
    assert var[0] == pytest.approx(8 / 3, abs=1e-15)


@pytest.mark.parametrize("rows", [1, 3])
def test_the_seeds_at_once_are_each_seeds_update_to_the_bit(rows: int) -> None:
    rng = np.random.default_rng(0)
    count = np.array([0, 5, 12])
    mean, var, batch = rng.normal(size=(3, 4)), rng.random((3, 4)), rng.normal(size=(3, rows, 4))
    together = chan_update_seeds(count, mean, var, batch)
    for k in range(3):
        alone = chan_update(int(count[k]), mean[k], var[k], batch[k])
        assert together[0][k] == alone[0]
        np.testing.assert_array_equal(together[1][k], alone[1])
        np.testing.assert_array_equal(together[2][k], alone[2])


def test_one_seeds_one_row_counts_as_the_seeds_at_once_do_to_the_bit() -> None:
    """One env of one seed takes its own path (its count arithmetic in Python floats): the
    same statistics and device values as chan_update_seeds, row after row; a row not kept
    (a non-finite observation) is not counted."""
    rng = np.random.default_rng(4)
    one = ObservationNormalizer(1, 5, "cpu", form=CLEANRL_FORM)
    count, mean, var = np.zeros(1, dtype=np.int64), np.zeros((1, 5)), np.ones((1, 5))
    for step in range(400):
        row = rng.normal(size=(1, 5)) * (1 + step % 9) + 0.01 * step
        if step == 7:
            one.update(row, keep=np.array([False]))
            continue
        one.update(row)
        count, mean, var = chan_update_seeds(count, mean, var, row[:, None])
        assert one.count.tolist() == count.tolist() and one.count.dtype == count.dtype
        assert np.array_equal(one.mean, mean) and np.array_equal(one.var, var), step
    assert one.count[0] == 399
    reference = ObservationNormalizer(1, 5, "cpu", form=CLEANRL_FORM)
    reference.load_state_dict({"count": count, "mean": mean, "var": var})
    assert torch.equal(one.stats, reference.stats)


def test_an_empty_batch_changes_nothing() -> None:
    assert chan_update(2, np.array([2.0]), np.array([1.0]), np.empty((0, 1)))[0] == 2


def test_normalised_values_by_hand() -> None:
    normalizer = ObservationNormalizer(1, 2, "cpu")
    normalizer.update(np.array([[1.0, 7.0], [3.0, 7.0]], dtype=np.float32))
    normalizer.update(np.array([[5.0, 7.0]], dtype=np.float32))
    assert normalizer.count.tolist() == [3]
    np.testing.assert_allclose(normalizer.mean, [[3.0, 7.0]], atol=1e-15)
    np.testing.assert_allclose(normalizer.var, [[8 / 3, 0.0]], atol=1e-15)
    out = normalizer.normalize(torch.tensor([[5.0, 7.0], [3.0, 7.0], [1.0, 8.0]]))
    std = np.sqrt(8 / 3)  # 1.63299...
    expected = torch.tensor([[2 / (std + 0.01), 0.0], [0.0, 0.0], [-2 / (std + 0.01), 100.0]],
                            dtype=torch.float32)
    torch.testing.assert_close(out, expected)
    assert STD_EPS == 0.01 and out[0, 0].item() == pytest.approx(1.21729, abs=1e-5)


def test_a_constant_dimension_normalises_to_zero_not_nan() -> None:
    normalizer = ObservationNormalizer(1, 2, "cpu")
    for _ in range(3):
        normalizer.update(np.array([[0.3, -2.5]] * 4, dtype=np.float32))
    assert normalizer.var.tolist() == [[0.0, 0.0]]
    out = normalizer.normalize(torch.tensor([[0.3, -2.5]]))
    assert torch.equal(out, torch.zeros(1, 2))


def test_before_any_observation_it_is_the_identity() -> None:
    normalizer = ObservationNormalizer(2, 3, "cpu")
    x = torch.randn(2, 5, 3)
    assert torch.equal(normalizer.normalize(x), x)


def test_each_seed_keeps_its_own_statistics() -> None:
    normalizer = ObservationNormalizer(2, 1, "cpu")
    # Rows 0-1 are seed 0's envs, rows 2-3 seed 1's.
    normalizer.update(np.array([[1.0], [3.0], [10.0], [30.0]]))
    normalizer.update(np.array([[5.0], [5.0], [50.0], [50.0]]))
    np.testing.assert_allclose(normalizer.mean[:, 0], [np.mean([1, 3, 5, 5]),
                                                       np.mean([10, 30, 50, 50])])
    np.testing.assert_allclose(normalizer.var[:, 0], [np.var([1, 3, 5, 5]),
                                                      np.var([10, 30, 50, 50])])
    # (K, B, O) batches: seed k's rows through seed k's statistics.
    out = normalizer.normalize(torch.tensor([[[3.5]], [[35.0]]]))
    torch.testing.assert_close(out, torch.zeros(2, 1, 1))


def test_rows_not_kept_are_not_counted() -> None:
    normalizer = ObservationNormalizer(2, 1, "cpu")
    normalizer.update(np.array([[1.0], [np.nan], [2.0], [4.0]]),
                      keep=np.array([True, False, True, True]))
    assert normalizer.count.tolist() == [1, 2]
    np.testing.assert_allclose(normalizer.mean[:, 0], [1.0, 3.0])
    assert np.isfinite(normalizer.var).all() and torch.isfinite(normalizer.stats).all()


def test_in_place_normalisation_is_the_same_to_the_bit() -> None:
    normalizer = ObservationNormalizer(1, 3, "cpu")
    normalizer.update(np.random.default_rng(0).normal(3.0, 2.0, (50, 3)).astype(np.float32))
    x = torch.randn(8, 3, generator=torch.Generator().manual_seed(0)) * 5
    expected = normalizer.normalize(x)
    assert torch.equal(normalizer.normalize_(x.clone()), expected)
    mean, std = normalizer.mean[0], np.sqrt(normalizer.var[0])
    np.testing.assert_allclose(expected.numpy(), (x.numpy() - mean) / (std + 0.01), rtol=1e-5,
                               atol=1e-6)


def test_the_device_tensor_is_written_in_place() -> None:
    normalizer = ObservationNormalizer(1, 2, "cpu")
    stats = normalizer.stats
    pointer = stats.data_ptr()
    normalizer.update(np.array([[1.0, 2.0], [3.0, 6.0]]))
    assert normalizer.stats is stats and stats.data_ptr() == pointer
    torch.testing.assert_close(stats[:, 0, 0], torch.tensor([[2.0, 4.0], [1.01, 2.01]]))


def test_state_dict_round_trip_is_bit_for_bit() -> None:
    rng = np.random.default_rng(1)
    normalizer = ObservationNormalizer(2, 3, "cpu")
    for _ in range(4):
        normalizer.update(rng.normal(size=(6, 3)).astype(np.float32))
    restored = ObservationNormalizer(2, 3, "cpu")
    restored.load_state_dict(normalizer.state_dict())
    for name in ("count", "mean", "var"):
        assert np.array_equal(getattr(restored, name), getattr(normalizer, name))
    assert torch.equal(restored.stats, normalizer.stats)
    # Both go on counting the same way.
    batch = rng.normal(size=(6, 3))
    normalizer.update(batch)
    restored.update(batch)
    assert np.array_equal(restored.var, normalizer.var)
    one = normalizer.member(1)
    assert torch.equal(one.stats[:, 0], normalizer.stats[:, 1])


def test_a_state_of_another_shape_is_one_line() -> None:
    saved = ObservationNormalizer(1, 3, "cpu").state_dict()
    with pytest.raises(ValueError, match=r"\(1, 3\), this run has \(2, 3\)"):
        ObservationNormalizer(2, 3, "cpu").load_state_dict(saved)


def test_the_sampler_normalises_observations_and_next_observations() -> None:
    normalizer = ObservationNormalizer(1, 2, "cpu")
    buffer = ReplayBuffer(100, 2, 1, "cpu", normalizer=normalizer)
    index = np.arange(40, dtype=np.float32)
    observations = np.stack([index, 3 * index], 1)
    buffer.add(observations, index[:, None], np.zeros(40), observations + 100,
               np.zeros(40, bool))
    normalizer.update(observations)  # the collector's part
    layout = buffer.layout
    obs, rest = torch.zeros(16, 3), torch.zeros(16, 4)
    sampler = BatchSampler(buffer, 16, [(obs, layout.critic_inputs),
                                        (rest, layout.critic_targets)])
    sampler()
    rows = buffer.storage[obs[:, 2].long()]  # the action column is the row's index, raw
    assert torch.equal(obs[:, :2], normalizer.normalize(rows[:, layout.observations]))
    assert torch.equal(rest[:, 2:], normalizer.normalize(rows[:, layout.next_observations]))
    assert not torch.equal(obs[:, :2], rows[:, layout.observations])


# ---------------------------------------------------------------- PPO: CleanRL's form


def test_the_cleanrl_form_divides_by_sqrt_var_plus_1e8_and_clips_at_10() -> None:
    """{1, 3, 5} and a constant 7: mean (3, 7), variance (8/3, 0). CleanRL's form divides by
    sqrt(var + 1e-8) (1.6329932 and 1e-4) and clips to +-10; the off-policy form is the
    default, unchanged."""
    assert ObservationNormalizer(1, 2, "cpu").form == REFERENCE_FORM
    normalizer = ObservationNormalizer(1, 2, "cpu", form=CLEANRL_FORM)
    normalizer.update(np.array([[1.0, 7.0], [3.0, 7.0]], dtype=np.float32))
    normalizer.update(np.array([[5.0, 7.0]], dtype=np.float32))
    np.testing.assert_allclose(normalizer.mean, [[3.0, 7.0]], atol=1e-15)
    np.testing.assert_allclose(normalizer.var, [[8 / 3, 0.0]], atol=1e-15)
    divisor = np.sqrt(8 / 3 + 1e-8)  # 1.632993165...
    torch.testing.assert_close(normalizer.stats[1, 0, 0],
                               torch.tensor([divisor, 1e-4], dtype=torch.float32))
    x = torch.tensor([[5.0, 7.0], [1.0, 7.00001], [100.0, 8.0], [-100.0, 6.0]])
    out = normalizer.normalize(x)
    expected = torch.tensor([[2 / divisor, 0.0],       # 1.2247449, 0
                             [-2 / divisor, 0.1],      # 0.00001 / 1e-4 (float32's 7.00001)
                             [10.0, 10.0],             # 59.4 and 1e4, clipped
                             [-10.0, -10.0]], dtype=torch.float32)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=2e-3)
    assert out[0, 0].item() == pytest.approx(1.2247449, abs=1e-6)
    assert out.abs().max().item() == 10.0
    assert torch.equal(normalizer.normalize_(x.clone()), out)
    # A seed's member keeps the form (evaluate's).
    assert torch.equal(normalizer.member(0).normalize(x), out)


def test_the_reference_form_does_not_clip() -> None:
    normalizer = ObservationNormalizer(1, 1, "cpu")
    normalizer.update(np.array([[0.0], [2.0]]))  # mean 1, std 1: divisor 1.01
    out = normalizer.normalize(torch.tensor([[102.0]]))
    assert out.item() == pytest.approx(101 / 1.01, rel=1e-6)


# ---------------------------------------------------------------- PPO: rewards


def test_rewards_are_scaled_by_the_discounted_returns_std_by_hand() -> None:
    """Two envs of one seed, gamma 0.5. Each step adds the rewards to the returns, counts the
    returns (both envs pooled), divides the rewards by sqrt(var + 1e-8); an ended env's
    return starts again at 0 (env 0 terminates at step 2, env 1 is truncated at step 3)."""
    rewards = RewardNormalizer(1, 2, 0.5)
    no = np.array([False, False])
    # Step 1: returns (1, 2); var of {1, 2} = 0.25.
    out = rewards.scale(np.array([1.0, 2.0]), no, no)
    np.testing.assert_allclose(rewards.returns, [1.0, 2.0])
    np.testing.assert_allclose(out, np.array([1.0, 2.0]) / np.sqrt(0.25 + 1e-8), rtol=1e-14)
    assert out[0] == pytest.approx(2.0, abs=1e-7)
    # Step 2: returns (0.5 + 2, 1 + 4) = (2.5, 5); {1, 2, 2.5, 5}: mean 2.625, var 2.171875.
    out = rewards.scale(np.array([2.0, 4.0]), np.array([True, False]), no)
    assert (rewards.count[0], rewards.mean[0]) == (4, pytest.approx(2.625, abs=1e-15))
    assert rewards.var[0] == pytest.approx(2.171875, abs=1e-14)
    np.testing.assert_allclose(out, np.array([2.0, 4.0]) / np.sqrt(2.171875 + 1e-8),
                               rtol=1e-14)
    np.testing.assert_allclose(rewards.returns, [0.0, 5.0])  # env 0's episode ended
    # Step 3: returns (0 + 3, 2.5 - 1) = (3, 1.5); {1, 2, 2.5, 5, 3, 1.5}: mean 2.5, var 5/3.
    out = rewards.scale(np.array([3.0, -1.0]), no, np.array([False, True]))
    assert rewards.mean[0] == pytest.approx(2.5, abs=1e-15)
    assert rewards.var[0] == pytest.approx(5 / 3, abs=1e-14)
    np.testing.assert_allclose(out, np.array([3.0, -1.0]) / np.sqrt(5 / 3 + 1e-8), rtol=1e-14)
    assert out[1] == pytest.approx(-0.7745967, abs=1e-7)  # the sign stays: no mean taken
    np.testing.assert_allclose(rewards.returns, [3.0, 0.0])


def test_each_seed_scales_by_its_own_variance_and_clips_at_10() -> None:
    """Two seeds of two envs: seed 0's returns {1, 3} (var 1), seed 1's {10, 30} (var 100)
    scale each seed's rewards to (1, 3); a seed whose returns are all equal has variance 0,
    a divisor of 1e-4, and its rewards clip to +-10."""
    rewards = RewardNormalizer(2, 2, 0.99)
    ends = np.zeros(4, dtype=bool)
    out = rewards.scale(np.array([1.0, 3.0, 10.0, 30.0]), ends, ends)
    np.testing.assert_allclose(rewards.var, [1.0, 100.0])
    np.testing.assert_allclose(out, [1.0, 3.0, 1.0, 3.0], rtol=1e-7)
    equal = RewardNormalizer(2, 2, 0.99)
    out = equal.scale(np.array([0.5, 0.5, -2.0, -2.0]), ends, ends)
    assert out.tolist() == [10.0, 10.0, -10.0, -10.0]


def test_a_non_finite_return_is_not_counted() -> None:
    rewards = RewardNormalizer(1, 2, 0.5)
    no = np.array([False, False])
    rewards.scale(np.array([np.nan, 2.0]), no, no)
    assert rewards.count.tolist() == [1] and rewards.var.tolist() == [0.0]
    rewards.scale(np.array([1.0, 2.0]), np.array([True, False]), no)  # env 0's episode ends
    rewards.scale(np.array([4.0, 0.0]), no, no)  # returns (4, 3): counted again
    assert rewards.count.tolist() == [4] and np.isfinite(rewards.var).all()


def test_one_env_scales_as_the_vectorised_path_does_to_the_bit() -> None:
    """One seed's one env takes Python floats; the same operations as the numpy path for
    many envs, so the same rewards, statistics and returns to the bit, over episode ends,
    a NaN reward (not counted) and clipping."""
    rng = np.random.default_rng(5)
    one, vectorised = RewardNormalizer(1, 1, 0.99), RewardNormalizer(1, 1, 0.99)
    rewards = rng.normal(size=600) * 3.0
    rewards[17] = np.nan
    rewards[0] = 250.0  # the first step's variance is 0: clipped at +10
    for step, reward in enumerate(rewards):
        ends = (np.array([step % 50 == 49]), np.array([step % 70 == 69]))
        got = one.scale(np.array([reward]), *ends)
        want = vectorised._scale_all(np.array([reward]), *ends)
        assert got.dtype == want.dtype and got.shape == want.shape == (1,)
        assert np.array_equal(got, want, equal_nan=True), step
        for name in ("count", "mean", "var", "returns"):
            assert np.array_equal(getattr(one, name), getattr(vectorised, name),
                                  equal_nan=True), (step, name)
    # The NaN at step 17 stays in its env's return until the episode ends at step 49: the 33
    # returns from 17 to 49 are not counted.
    assert one.count[0] == 600 - 33 and 0 < one.var[0] < np.inf


def test_the_reward_state_round_trip_continues_bit_for_bit() -> None:
    rng = np.random.default_rng(2)
    rewards = RewardNormalizer(2, 3, 0.9)
    for _ in range(5):
        rewards.scale(rng.normal(size=6), rng.random(6) < 0.2, rng.random(6) < 0.1)
    restored = RewardNormalizer(2, 3, 0.9)
    restored.load_state_dict(rewards.state_dict())
    batch, ends = rng.normal(size=6), rng.random(6) < 0.3
    assert np.array_equal(restored.scale(batch, ends, ~ends), rewards.scale(batch, ends, ~ends))
    for name in ("count", "mean", "var", "returns"):
        assert np.array_equal(getattr(restored, name), getattr(rewards, name)), name
    # Another --num-envs on resume: the statistics go on, the episodes' returns restart.
    wider = RewardNormalizer(2, 4, 0.9)
    wider.load_state_dict(rewards.state_dict())
    assert np.array_equal(wider.var, rewards.var) and not wider.returns.any()
    with pytest.raises(ValueError, match=r"for 2 seeds, this run has 1$"):
        RewardNormalizer(1, 3, 0.9).load_state_dict(rewards.state_dict())
