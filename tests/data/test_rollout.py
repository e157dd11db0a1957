"""PPO's rollout storage: GAE against hand-computed values and against CleanRL's loop (with
truncation bootstrapped), the packed rows, K seeds, the explained variance."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rl_graphstep.data.rollout import Rollout, RolloutLayout, gae

GAMMA, LAMBDA = 0.5, 0.5  # carry = 0.25: hand-checkable numbers


def one_env(rewards: list[float], values: list[float], *, terminated: int | None = None,
            truncated: int | None = None, final_value: float = 0.0,
            next_value: float = 2.0) -> list[float]:
    """GAE of one env's rollout (K = N = 1), ending an episode at the given step."""
    steps = len(rewards)
    term, trunc, final = (torch.zeros(1, steps, 1) for _ in range(3))
    if terminated is not None:
        term[0, terminated] = 1
    if truncated is not None:
        trunc[0, truncated] = 1
        final[0, truncated] = final_value
    out = gae(torch.tensor(rewards).view(1, steps, 1), torch.tensor(values).view(1, steps, 1),
              term, trunc, final, torch.tensor([[next_value]]), GAMMA, LAMBDA)
    return out.view(-1).tolist()


REWARDS, VALUES = [1.0, 2.0, 3.0], [0.5, 1.0, 1.5]


def test_gae_of_a_rollout_without_episode_ends() -> None:
    # deltas: 1 + .5*1 - .5 = 1, 2 + .5*1.5 - 1 = 1.75, 3 + .5*2 - 1.5 = 2.5 (V(s_T) = 2)
    assert one_env(REWARDS, VALUES) == pytest.approx([1.59375, 2.375, 2.5])


def test_termination_mid_rollout_cuts_the_bootstrap_and_the_recursion() -> None:
    # delta_1 = 2 - 1 = 1 (no bootstrap), A_1 = 1 (A_2 not carried), A_0 = 1 + .25 * 1
    assert one_env(REWARDS, VALUES, terminated=1) == pytest.approx([1.25, 1.0, 2.5])


def test_truncation_mid_rollout_bootstraps_from_the_final_observation() -> None:
    # delta_1 = 2 + .5 * V(final obs) 4 - 1 = 3, the recursion still stops there
    assert one_env(REWARDS, VALUES, truncated=1, final_value=4.0) == pytest.approx(
        [1.75, 3.0, 2.5])


def test_the_last_step_truncated_bootstraps_from_its_final_observation_not_the_next() -> None:
    # delta_2 = 3 + .5 * 4 - 1.5 = 3.5: V(s_T) = 2 (a new episode's) is not used
    assert one_env(REWARDS, VALUES, truncated=2, final_value=4.0) == pytest.approx(
        [1.65625, 2.625, 3.5])


def test_the_last_step_terminated_does_not_bootstrap() -> None:
    assert one_env(REWARDS, VALUES, terminated=2) == pytest.approx([1.53125, 2.125, 1.5])


def reference_gae(rewards: np.ndarray, values: np.ndarray, terminations: np.ndarray,
                  truncations: np.ndarray, final_values: np.ndarray, next_values: np.ndarray,
                  gamma: float, lam: float) -> np.ndarray:
    """CleanRL's loop, one env at a time in float64, with the truncation bootstrap added."""
    seeds, steps, envs = rewards.shape
    advantages = np.zeros_like(rewards)
    for k in range(seeds):
        for n in range(envs):
            last = 0.0
            for t in reversed(range(steps)):
                next_value = next_values[k, n] if t == steps - 1 else values[k, t + 1, n]
                if truncations[k, t, n]:
                    next_value = final_values[k, t, n]
                delta = (rewards[k, t, n] + gamma * next_value * (1 - terminations[k, t, n])
                         - values[k, t, n])
                ended = max(terminations[k, t, n], truncations[k, t, n])
                last = delta + gamma * lam * (1 - ended) * last
                advantages[k, t, n] = last
    return advantages


def random_rollout(seed: int, shape: tuple[int, int, int], end_rate: float = 0.15
                   ) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    ended = rng.random(shape) < end_rate
    truncated = ended & (rng.random(shape) < 0.5)
    return {"rewards": rng.normal(size=shape), "values": rng.normal(size=shape),
            "terminations": (ended & ~truncated).astype(float),
            "truncations": truncated.astype(float),
            "final_values": rng.normal(size=shape) * truncated,
            "next_values": rng.normal(size=(shape[0], shape[2]))}


def test_gae_matches_the_reference_loop_with_terminations_and_truncations() -> None:
    data = random_rollout(0, (2, 40, 3))
    assert data["terminations"].sum() > 3 and data["truncations"].sum() > 3
    expected = reference_gae(**data, gamma=0.99, lam=0.95)
    tensors = {k: torch.tensor(v, dtype=torch.float32) for k, v in data.items()}
    got = gae(**tensors, gamma=0.99, gae_lambda=0.95)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-5, atol=1e-5)


def test_without_truncations_gae_is_cleanrls_exactly() -> None:
    """CleanRL stores dones[t] = 'the episode ended before step t' and reads dones[t + 1];
    with every end a termination the two bookkeepings give the same advantages."""
    data = random_rollout(1, (1, 30, 2))
    data["terminations"] = np.maximum(data["terminations"], data["truncations"])
    data["truncations"][:] = 0
    rewards, values, ended = data["rewards"][0], data["values"][0], data["terminations"][0]
    dones = np.concatenate([np.zeros((1, 2)), ended[:-1]])  # CleanRL's, shifted by one
    next_done, next_value = ended[-1], data["next_values"][0]
    cleanrl = np.zeros_like(rewards)
    lastgaelam = 0.0
    for t in reversed(range(30)):
        if t == 29:
            nextnonterminal, nextvalues = 1.0 - next_done, next_value
        else:
            nextnonterminal, nextvalues = 1.0 - dones[t + 1], values[t + 1]
        delta = rewards[t] + 0.99 * nextvalues * nextnonterminal - values[t]
        cleanrl[t] = lastgaelam = delta + 0.99 * 0.95 * nextnonterminal * lastgaelam
    tensors = {k: torch.tensor(v, dtype=torch.float32) for k, v in data.items()}
    got = gae(**tensors, gamma=0.99, gae_lambda=0.95)
    np.testing.assert_allclose(got[0].numpy(), cleanrl, rtol=1e-5, atol=1e-5)


def fill(rollout: Rollout, data: dict[str, np.ndarray], lead: tuple[int, ...]) -> None:
    """Add every step of ``data`` (K, T, N arrays), observations and actions made from t."""
    steps, envs = data["rewards"].shape[1:]
    for t in range(steps):
        def at(name: str, t: int = t) -> torch.Tensor:
            return torch.tensor(data[name][:, t], dtype=torch.float32).view(*lead, envs)
        observations = torch.full((*lead, envs, 2), float(t))
        actions = torch.full((*lead, envs, 1), -float(t))
        rollout.add(observations, actions, at("rewards") * 0 - t, at("values"), at("rewards"),
                    at("terminations") > 0, at("truncations"), at("final_values"))


@pytest.mark.parametrize("seeds", [1, 3])
def test_the_rollout_stores_steps_and_computes_advantages_and_returns(seeds: int) -> None:
    data = random_rollout(2, (seeds, 6, 4))
    lead = () if seeds == 1 else (seeds,)
    rollout = Rollout(6, 4, 2, 1, torch.device("cpu"), seeds=seeds)
    fill(rollout, data, lead)
    assert rollout.full
    next_values = torch.tensor(data["next_values"], dtype=torch.float32).view(*lead, 4)
    rollout.compute_advantages(next_values, 0.99, 0.95)
    expected = reference_gae(**data, gamma=0.99, lam=0.95).reshape(*lead, 6, 4)
    np.testing.assert_allclose(rollout.advantages.numpy(), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rollout.returns, rollout.advantages + rollout.values)
    assert rollout.observations.shape == (*lead, 6, 4, 2)
    assert rollout.observations[..., 3, :, :].eq(3.0).all()
    assert rollout.actions[..., 5, :, 0].eq(-5.0).all()
    assert rollout.log_probs[..., 2, :].eq(-2.0).all()
    # Flat rows for minibatches: step t, env n is row t * N + n, of every seed.
    flat = rollout.flat_rows
    assert flat.shape == (seeds, 24, RolloutLayout(2, 1).width)
    assert flat[:, 4 * 3 + 2, 0].eq(3.0).all()


def test_an_excluded_seed_gets_nan_advantages_and_returns_until_the_next_rollout() -> None:
    """Seed 1 of 3 excluded (a non-finite step): its advantages and returns are NaN, its
    values and the other seeds' columns as computed without the exclusion."""
    data = random_rollout(2, (3, 6, 4))
    rollout = Rollout(6, 4, 2, 1, torch.device("cpu"), seeds=3)
    fill(rollout, data, (3,))
    rollout.exclude(1)
    next_values = torch.tensor(data["next_values"], dtype=torch.float32).view(3, 4)
    rollout.compute_advantages(next_values, 0.99, 0.95)
    expected = reference_gae(**data, gamma=0.99, lam=0.95).reshape(3, 6, 4)
    assert rollout.advantages[1].isnan().all() and rollout.returns[1].isnan().all()
    assert rollout.values[1].isfinite().all()
    for seed in (0, 2):
        np.testing.assert_allclose(rollout.advantages[seed].numpy(), expected[seed],
                                   rtol=1e-5, atol=1e-5)
    rollout.reset()  # the next rollout learns from every seed again
    fill(rollout, data, (3,))
    rollout.compute_advantages(next_values, 0.99, 0.95)
    np.testing.assert_allclose(rollout.advantages.numpy(), expected, rtol=1e-5, atol=1e-5)


def test_a_full_rollout_refuses_a_step_and_an_unfilled_one_its_advantages() -> None:
    rollout = Rollout(2, 1, 2, 1, torch.device("cpu"))
    step = (torch.zeros(1, 2), torch.zeros(1, 1), *(torch.zeros(1),) * 6)
    rollout.add(*step)
    with pytest.raises(RuntimeError, match="holds 1 of its 2 steps"):
        rollout.compute_advantages(torch.zeros(1), 0.99, 0.95)
    rollout.add(*step)
    with pytest.raises(RuntimeError, match="the rollout is full"):
        rollout.add(*step)
    rollout.reset()
    rollout.add(*step)
    assert rollout.step == 1


def test_the_layout_gives_each_step_its_contiguous_columns() -> None:
    layout = RolloutLayout(observation_size=3, action_size=2)
    assert (layout.actor_inputs, layout.actor_targets) == (slice(0, 5), slice(5, 7))
    assert (layout.critic_inputs, layout.critic_targets) == (slice(0, 3), slice(7, 9))
    assert layout.width == 9
    targets = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    assert layout.policy_targets(targets).advantages.tolist() == [2.0, 4.0]
    assert layout.value_targets(targets).returns.tolist() == [2.0, 4.0]
