"""PPO's networks: the Gaussian and categorical actors' log-probabilities and entropies
against torch.distributions, their samples, CleanRL's initialisation, and K seeds stacked."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch.distributions import Categorical, Normal

from rl_graphstep.core.errors import ConfigError
from rl_graphstep.networks.policies import (
    ActionEvaluation,
    CategoricalActor,
    GaussianActor,
    ValueNetwork,
)
from rl_graphstep.networks.seeds import SeedStack

OBS = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
ACT = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)


def gaussian(seed: int = 0) -> GaussianActor:
    torch.manual_seed(seed)
    actor = GaussianActor(OBS, ACT)
    with torch.no_grad():
        actor.log_std.copy_(torch.tensor([-0.5, 0.3]))
    return actor


def test_the_gaussian_log_prob_and_entropy_are_the_normal_distributions() -> None:
    actor, observations = gaussian(), torch.randn(5, 4)
    actions = torch.randn(5, 2)
    log_probs, entropy = actor.log_prob_and_entropy(observations, actions)
    normal = Normal(actor.mean(observations), actor.log_std.exp())
    torch.testing.assert_close(log_probs, normal.log_prob(actions).sum(-1))
    torch.testing.assert_close(entropy, normal.entropy().sum(-1))


def test_a_gaussian_sample_comes_with_its_own_log_prob() -> None:
    actor, observations = gaussian(), torch.randn(5, 4)
    actions, log_probs = actor(observations)
    assert actions.shape == (5, 2) and log_probs.shape == (5,)
    torch.testing.assert_close(log_probs, actor.log_prob_and_entropy(observations, actions)[0])
    torch.testing.assert_close(actor.deterministic_action(observations), actor.mean(observations))


def test_cleanrls_initialisation() -> None:
    actor, critic = GaussianActor(OBS, ACT), ValueNetwork(OBS)
    assert actor.log_std.tolist() == [0.0, 0.0]
    hidden, head = actor.mean[0].weight, actor.mean[-1].weight
    # Orthogonal with gain g: rows orthonormal times g (fewer rows than columns: W W^T = g^2 I)
    torch.testing.assert_close(head @ head.T, 0.01**2 * torch.eye(2))
    torch.testing.assert_close(critic.net[-1].weight @ critic.net[-1].weight.T, torch.eye(1))
    # 64 x 4: columns orthonormal times sqrt(2)
    torch.testing.assert_close(hidden.T @ hidden, 2.0 * torch.eye(4), atol=1e-5, rtol=1e-5)
    assert all(layer.bias.abs().sum() == 0 for layer in actor.mean if hasattr(layer, "bias"))
    assert [type(m).__name__ for m in critic.net] == ["Linear", "Tanh", "Linear", "Tanh",
                                                      "Linear"]
    assert critic(torch.randn(7, 4)).shape == (7, 1)


def categorical(seed: int = 0) -> CategoricalActor:
    torch.manual_seed(seed)
    actor = CategoricalActor(OBS, gym.spaces.Discrete(3))
    with torch.no_grad():  # a policy far from uniform, for the sampling test
        actor.logits[-1].bias.copy_(torch.tensor([0.0, 1.0, -1.0]))
    return actor


def test_the_categorical_log_prob_and_entropy_are_the_categorical_distributions() -> None:
    actor, observations = categorical(), torch.randn(6, 4)
    actions = torch.tensor([0, 1, 2, 2, 1, 0], dtype=torch.float32).view(6, 1)
    log_probs, entropy = actor.log_prob_and_entropy(observations, actions)
    distribution = Categorical(logits=actor.logits(observations))
    torch.testing.assert_close(log_probs, distribution.log_prob(actions.view(-1).long()))
    torch.testing.assert_close(entropy, distribution.entropy())
    assert actor.deterministic_action(observations).view(-1).tolist() == \
        distribution.probs.argmax(-1).float().tolist()


def test_categorical_samples_follow_the_probabilities() -> None:
    actor = categorical()
    observation = torch.zeros(1, 4)
    torch.manual_seed(1)
    actions, log_probs = actor(observation.expand(20000, 4))
    assert actions.shape == (20000, 1) and actions.dtype == torch.float32
    counts = torch.bincount(actions.view(-1).long(), minlength=3).float() / 20000
    probabilities = torch.softmax(actor.logits(observation), -1).view(-1)
    torch.testing.assert_close(counts, probabilities.detach(), atol=0.015, rtol=0)
    torch.testing.assert_close(log_probs, actor.log_prob_and_entropy(
        observation.expand(20000, 4), actions)[0])


def test_the_actors_refuse_the_other_kind_of_action_space() -> None:
    with pytest.raises(ConfigError, match="GaussianActor needs a flat Box action space"):
        GaussianActor(OBS, gym.spaces.Discrete(2))
    with pytest.raises(ConfigError, match="CategoricalActor needs a Discrete action space"):
        CategoricalActor(OBS, ACT)
    with pytest.raises(ConfigError, match="flat"):
        ValueNetwork(gym.spaces.Box(-1, 1, (2, 2), np.float32))


def test_the_action_evaluation_unpacks_observation_and_action() -> None:
    actor = gaussian()
    observations, actions = torch.randn(3, 4), torch.randn(3, 2)
    packed = ActionEvaluation(actor, 4)(torch.cat([observations, actions], -1))
    for got, expected in zip(packed, actor.log_prob_and_entropy(observations, actions),
                             strict=True):
        torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("kind", ["gaussian", "categorical"])
def test_stacked_over_seeds_each_seed_is_its_own_network(kind: str) -> None:
    members = [gaussian(s) if kind == "gaussian" else categorical(s) for s in (0, 1)]
    stack = SeedStack(members)
    observations = torch.randn(2, 5, 4)
    actions = (torch.randn(2, 5, 2) if kind == "gaussian"
               else torch.randint(0, 3, (2, 5, 1)).float())
    log_probs, entropy = ActionEvaluation(stack, 4)(torch.cat([observations, actions], -1))
    for k, member in enumerate(members):
        expected = member.log_prob_and_entropy(observations[k], actions[k])
        torch.testing.assert_close(log_probs[k], expected[0])
        torch.testing.assert_close(entropy[k], expected[1])
    sampled, sampled_log_probs = stack(observations)
    assert sampled.shape == actions.shape and sampled_log_probs.shape == (2, 5)
    critics = SeedStack([ValueNetwork(OBS) for _ in range(2)])
    assert critics(observations).shape == (2, 5, 1)
    assert stack.deterministic_action(observations).shape == actions.shape
