"""PPO actors with a torso of their own: a LayerNorm SiLU MLP in place of CleanRL's tanh MLP,
under PPO's built-in distribution heads (a Gaussian with a state-independent log-std for a
Box action space, a categorical one for a Discrete space).

Subclassing the built-in actors keeps their sampling, log-probabilities, entropy and
deterministic action, which all read the torso through one attribute (``mean`` / ``logits``):

    python -m rl_graphstep.train --env Pendulum-v1 --algo ppo \\
        --actor examples.ppo_actor:LayerNormGaussianActor --actor-kwargs '{width: 64}'
    python -m rl_graphstep.train --env CartPole-v1 --algo ppo \\
        --actor examples/ppo_actor.py:LayerNormCategoricalActor
"""

from __future__ import annotations

import gymnasium as gym
from torch import nn

from rl_graphstep.networks.policies import CategoricalActor, GaussianActor


def layernorm_torso(in_size: int, width: int, depth: int, out_size: int) -> nn.Sequential:
    """``depth`` blocks of Linear, LayerNorm and SiLU of ``width``, then a linear head whose
    orthogonal weights have gain 0.01 (CleanRL's: the first policy is near uniform)."""
    layers: list[nn.Module] = []
    for i in range(depth):
        layers += [nn.Linear(in_size if i == 0 else width, width), nn.LayerNorm(width),
                   nn.SiLU()]
    head = nn.Linear(width if depth else in_size, out_size)
    nn.init.orthogonal_(head.weight, 0.01)
    nn.init.zeros_(head.bias)
    return nn.Sequential(*layers, head)


class LayerNormGaussianActor(GaussianActor):
    """GaussianActor whose mean comes from :func:`layernorm_torso` (Box action spaces)."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space,
                 width: int = 64, depth: int = 2) -> None:
        super().__init__(observation_space, action_space)
        self.mean = layernorm_torso(self.observation_size, width, depth, self.action_size)


class LayerNormCategoricalActor(CategoricalActor):
    """CategoricalActor whose logits come from :func:`layernorm_torso` (Discrete spaces)."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space,
                 width: int = 64, depth: int = 2) -> None:
        super().__init__(observation_space, action_space)
        self.logits = layernorm_torso(self.observation_size, width, depth, self.num_actions)
