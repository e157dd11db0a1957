"""PPO's losses against hand-computed values: the clipped surrogate (ratio clipping at
1 +- eps, its gradients), the clipped value loss, advantage normalisation, the entropy bonus,
CleanRL's diagnostics, K seeds, the annealed rate and the config checks."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from rl_graphstep.algorithms.ppo import PPO, check_ppo_config
from rl_graphstep.core.errors import ConfigError
from rl_graphstep.data.rollout import PolicyTargets, ValueTargets
from rl_graphstep.networks.policies import CategoricalActor, GaussianActor, ValueNetwork
from rl_graphstep.settings.config import Config, config_from_dict

OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
ACT = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
# Off-policy cross-checks (learning_starts, batch_size) are not PPO's: set out of the way.
SMALL = {"learning_starts": 0, "batch_size": 8}


def make(seeds: int = 1, **settings: object) -> PPO:
    cfg = Config(**{"num_steps": 8, "num_envs": 2, "num_minibatches": 2,
                    "total_timesteps": 160, **SMALL, **settings})
    return PPO(GaussianActor(OBS, ACT), ValueNetwork(OBS), cfg, device=torch.device("cpu"),
               seeds=seeds)


RATIOS = [1.5, 0.5, 1.1, 0.5]
ADVANTAGES = [1.0, 1.0, -1.0, -1.0]


def surrogate(ppo: PPO, ratios: list[float] = RATIOS, advantages: list[float] = ADVANTAGES,
              entropy: list[float] | None = None) -> tuple[torch.Tensor, dict, torch.Tensor]:
    new_log_probs = torch.tensor(ratios).log().requires_grad_()
    entropies = torch.tensor(entropy if entropy is not None else [0.0] * len(ratios))
    targets = PolicyTargets(torch.zeros(len(ratios)), torch.tensor(advantages))
    loss, metrics = ppo.policy_loss((new_log_probs, entropies), targets)
    loss.backward()
    return loss, metrics, new_log_probs.grad


def test_the_surrogate_clips_the_ratio_at_one_plus_and_minus_eps() -> None:
    loss, metrics, grad = surrogate(make(norm_adv=False, clip_coef=0.2))
    # per sample max(-A r, -A clip(r, .8, 1.2)): -1.2 (clipped), -0.5, 1.1, 0.8 (clipped)
    assert loss.item() == pytest.approx((-1.2 - 0.5 + 1.1 + 0.8) / 4)
    assert metrics["losses/policy_loss"].item() == pytest.approx(0.05)
    # Where the clipped term wins, no gradient reaches the log-probability; elsewhere
    # d(-A r)/d log r = -A r, over the batch of 4.
    assert grad.tolist() == pytest.approx([0.0, -0.125, 0.275, 0.0])


def test_cleanrls_diagnostics() -> None:
    _, metrics, _ = surrogate(make(norm_adv=False, clip_coef=0.2))
    logs = [math.log(r) for r in RATIOS]
    assert metrics["losses/approx_kl"].item() == pytest.approx(
        sum((r - 1) - lr for r, lr in zip(RATIOS, logs, strict=True)) / 4)
    assert metrics["losses/old_approx_kl"].item() == pytest.approx(-sum(logs) / 4)
    assert metrics["losses/clipfrac"].item() == 0.75  # |r - 1| > 0.2 for 1.5, 0.5, 0.5
    # Computed without a graph: no backward passes through them.
    assert not any(metrics[f"losses/{name}"].requires_grad
                   for name in ("approx_kl", "old_approx_kl", "clipfrac"))


def test_advantages_are_normalised_per_minibatch_with_the_sample_std() -> None:
    ppo = make()
    normalised = ppo.normalized(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    std = math.sqrt(5 / 3)  # sample std of 1..4
    assert normalised.tolist() == pytest.approx([-1.5 / std, -0.5 / std, 0.5 / std, 1.5 / std])
    # At ratio 1 the surrogate is -mean(A): 0 normalised, -2.5 raw.
    ones = [1.0] * 4
    assert surrogate(make(norm_adv=True), ones, [1.0, 2.0, 3.0, 4.0])[0].item() == \
        pytest.approx(0.0, abs=1e-7)
    assert surrogate(make(norm_adv=False), ones, [1.0, 2.0, 3.0, 4.0])[0].item() == \
        pytest.approx(-2.5)


def test_the_entropy_bonus_is_subtracted_with_its_coefficient() -> None:
    ppo = make(norm_adv=False, ent_coef=0.01)
    loss, metrics, _ = surrogate(ppo, entropy=[1.0, 2.0, 3.0, 4.0])
    assert metrics["losses/entropy"].item() == pytest.approx(2.5)
    assert loss.item() == pytest.approx(0.05 - 0.01 * 2.5)


OLD_VALUES, RETURNS, NEW_VALUES = [0.0, 0.0, 0.0], [1.0, 1.0, -1.0], [0.5, 0.1, 0.3]


def value_loss(ppo: PPO) -> tuple[float, float]:
    loss, metrics = ppo.value_loss(torch.tensor(NEW_VALUES).view(3, 1),
                                   ValueTargets(torch.tensor(OLD_VALUES), torch.tensor(RETURNS)))
    return loss.item(), metrics["losses/value_loss"].item()


def test_the_clipped_value_loss_takes_the_larger_error() -> None:
    # V_clipped = 0 + clip(V, -.2, .2) = .2, .1, .2; errors max((V-R)^2, (Vc-R)^2):
    # max(.25, .64) = .64, .81, max(1.69, 1.44) = 1.69
    loss, logged = value_loss(make(clip_vloss=True, clip_coef=0.2, vf_coef=0.5))
    assert logged == pytest.approx(0.5 * (0.64 + 0.81 + 1.69) / 3)
    assert loss == pytest.approx(0.5 * logged)  # vf_coef scales the critic's loss


def test_the_unclipped_value_loss() -> None:
    loss, logged = value_loss(make(clip_vloss=False, vf_coef=2.0))
    assert logged == pytest.approx(0.5 * (0.25 + 0.81 + 1.69) / 3)
    assert loss == pytest.approx(2.0 * logged)


def test_with_k_seeds_each_seed_gets_its_own_loss() -> None:
    ppo = make(seeds=2, norm_adv=True)
    generator = torch.Generator().manual_seed(0)
    new, old, advantages = (torch.randn(2, 6, generator=generator) for _ in range(3))
    entropy = torch.rand(2, 6, generator=generator)
    loss, metrics = ppo.policy_loss((new, entropy), PolicyTargets(old, advantages))
    assert loss.shape == (2,) and metrics["losses/approx_kl"].shape == (2,)
    for k in range(2):
        single, single_metrics = make(norm_adv=True).policy_loss(
            (new[k], entropy[k]), PolicyTargets(old[k], advantages[k]))
        torch.testing.assert_close(loss[k], single)
        torch.testing.assert_close(metrics["losses/clipfrac"][k], single_metrics["losses/clipfrac"])
    values, _ = ppo.value_loss(torch.randn(2, 6, 1), ValueTargets(old, advantages))
    assert values.shape == (2,)


def test_the_learning_rate_anneals_linearly_over_the_rollouts() -> None:
    # 1000 steps in rollouts of 2 x 50: 10 iterations, CleanRL's frac = 1 - (i - 1) / 10
    ppo = make(total_timesteps=1000, num_envs=2, num_steps=50, num_minibatches=5)
    assert ppo.num_iterations == 10
    rates = [ppo.learning_rate(update) for update in (0, 5, 9)]
    assert rates == pytest.approx([3e-4, 1.5e-4, 3e-5])
    assert make(anneal_lr=False).learning_rate(7) == 3e-4


def test_the_default_networks_follow_the_action_space() -> None:
    cfg = Config(**SMALL)
    assert isinstance(PPO.default_actor(OBS, ACT, cfg), GaussianActor)
    assert isinstance(PPO.default_actor(OBS, gym.spaces.Discrete(3), cfg), CategoricalActor)
    assert isinstance(PPO.default_critic(OBS, ACT, cfg), ValueNetwork)


def test_minibatches_must_divide_the_rollout() -> None:
    with pytest.raises(ConfigError, match=r"--num-minibatches 3 does not divide a rollout of "
                                          r"--num-envs 2 x --num-steps 8 = 16 steps"):
        check_ppo_config(Config(num_envs=2, num_steps=8, num_minibatches=3, **SMALL))


def test_the_run_must_hold_one_rollout() -> None:
    with pytest.raises(ConfigError, match="--total-timesteps 100 is below one rollout"):
        make(total_timesteps=100, num_envs=2, num_steps=64, num_minibatches=2)


@pytest.mark.parametrize(("settings", "message"), [
    ({"target_kl": 0.0}, "--target-kl must be a finite number > 0"),
    ({"gae_lambda": 1.5}, r"--gae-lambda must be in \[0, 1\]"),
    ({"num_minibatches": 0}, "--num-minibatches must be a positive int"),
    ({"update_epochs": -1}, "--update-epochs must be a positive int"),
    ({"clip_coef": float("inf")}, "--clip-coef must be a finite number > 0"),
    ({"learning_rate": 0.0}, "--learning-rate must be a finite number > 0"),
    ({"ent_coef": -0.1}, "--ent-coef must be a finite number >= 0"),
])
def test_ppo_settings_are_checked(settings: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Config(**settings)


def test_target_kl_reads_a_number_or_null() -> None:
    assert config_from_dict({"target_kl": "1.5e-2"}).target_kl == 0.015
    assert config_from_dict({"target_kl": None}).target_kl is None
    with pytest.raises(ConfigError, match="target_kl must be a number or null, got 'x'"):
        config_from_dict({"target_kl": "x"})


def test_explained_variance_per_seed_and_nan_for_constant_returns() -> None:
    values = torch.tensor([[1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0]])
    returns = torch.tensor([[1.0, 2.0, 3.0, 5.0], [7.0, 7.0, 7.0, 7.0]])
    explained = PPO.explained_variance(values, returns)
    # Var(returns) = 2.1875, Var(returns - values) = 0.1875 (population variances)
    assert explained[0].item() == pytest.approx(1 - 0.1875 / 2.1875)
    assert math.isnan(explained[1].item())
