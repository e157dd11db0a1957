"""PPO's networks, as CleanRL's ``Agent``: a Gaussian actor with a state-independent log-std
(continuous actions), a categorical actor (discrete actions) and a value network, each a
64-64 tanh MLP with orthogonal initialisation.

The protocol a PPO actor meets (a custom one too), with the capture rules of
``networks.builtin`` (fixed shapes, no host syncs, no ``torch.distributions``, noise drawn on
the input's device):

- ``actor(observations) -> (actions, log_probs)``: a sample (B, A) and its log-probability
  (B,), for acting (a discrete action is its index as a float, (B, 1));
- ``actor.log_prob_and_entropy(observations, actions) -> (log_probs, entropy)``, each (B,):
  what the policy loss differentiates;
- ``actor.deterministic_action(observations) -> (B, A)``: the mean, or the most likely index.

A value network maps observations (B, O) to values (B, 1). All of them work stacked over K
seeds (``networks.seeds.SeedStack``): the methods above are public, so a stack batches them.

A custom actor or critic (``--actor`` / ``--critic`` with ``--algo ppo``) is built as
``Class(observation_space, action_space, **kwargs)`` and meets the same protocol, checked at
start-up by ``core.ppocheck``. The simplest keeps the distribution of a built-in one: a
subclass of :class:`GaussianActor` whose ``mean`` (or of :class:`CategoricalActor` whose
``logits``) is a torso of its own, observations (B, O) to (B, A) (or (B, n)); see
``examples/ppo_actor.py``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import pairwise

import gymnasium as gym
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rl_graphstep.core.errors import ConfigError

__all__ = ["ActionEvaluation", "CategoricalActor", "GaussianActor", "ValueNetwork", "ppo_mlp"]

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def ppo_mlp(sizes: Sequence[int], head_std: float) -> nn.Sequential:
    """CleanRL's ``layer_init`` MLP: Linear layers with tanh between them, weights orthogonal
    with gain sqrt(2) and the last one ``head_std``, biases 0."""
    layers: list[nn.Module] = []
    pairs = list(pairwise(sizes))
    for i, (fan_in, fan_out) in enumerate(pairs):
        linear = nn.Linear(fan_in, fan_out)
        nn.init.orthogonal_(linear.weight, head_std if i == len(pairs) - 1 else math.sqrt(2))
        nn.init.constant_(linear.bias, 0.0)
        layers.append(linear)
        if i < len(pairs) - 1:
            layers.append(nn.Tanh())
    return nn.Sequential(*layers)


def _observation_size(space: gym.Space) -> int:
    if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
        raise ConfigError(f"PPO's networks need a flat (1-D) Box observation space, got {space}")
    return int(space.shape[0])


class GaussianActor(nn.Module):
    """A diagonal Gaussian policy: the mean from an MLP (head std 0.01), the log-std a
    parameter of its own, independent of the state (initialised to 0), as CleanRL's.

    Actions are unbounded samples; the loop clips them to the action space (CleanRL's
    ``ClipAction``), and the log-probability is the one of the unclipped sample it stores.
    """

    def __init__(self, observation_space: gym.Space, action_space: gym.Space,
                 hidden_sizes: Sequence[int] = (64, 64)) -> None:
        super().__init__()
        if not isinstance(action_space, gym.spaces.Box) or len(action_space.shape) != 1:
            raise ConfigError(f"GaussianActor needs a flat Box action space, got {action_space}")
        self.observation_size = _observation_size(observation_space)
        self.action_size = int(action_space.shape[0])
        self.mean = ppo_mlp([self.observation_size, *hidden_sizes, self.action_size], 0.01)
        self.log_std = nn.Parameter(torch.zeros(self.action_size))

    def forward(self, observations: Tensor) -> tuple[Tensor, Tensor]:
        """A sample (B, A) and its log-probability (B,)."""
        mean = self.mean(observations)
        # randn_like draws on the tensor's device, so a CUDA graph replay draws afresh.
        noise = torch.randn_like(mean)
        actions = mean + self.log_std.exp() * noise
        log_probs = (-0.5 * noise.pow(2) - self.log_std - _LOG_SQRT_2PI).sum(dim=-1)
        return actions, log_probs

    def log_prob_and_entropy(self, observations: Tensor, actions: Tensor
                             ) -> tuple[Tensor, Tensor]:
        """log N(actions; mean, std) summed over the action (B,), and the entropy (B,)."""
        mean = self.mean(observations)
        z = (actions - mean) * torch.exp(-self.log_std)
        log_probs = (-0.5 * z.pow(2) - self.log_std - _LOG_SQRT_2PI).sum(dim=-1)
        entropy = (0.5 + _LOG_SQRT_2PI + self.log_std).sum(dim=-1).expand_as(log_probs)
        return log_probs, entropy

    def deterministic_action(self, observations: Tensor) -> Tensor:
        """The mean: the action to take when evaluating."""
        return self.mean(observations)


class CategoricalActor(nn.Module):
    """A categorical policy over a Discrete space's ``n`` actions: logits from an MLP (head
    std 0.01), as CleanRL's ``ppo.py``. An action is its index, stored as a float (B, 1)."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space,
                 hidden_sizes: Sequence[int] = (64, 64)) -> None:
        super().__init__()
        if not isinstance(action_space, gym.spaces.Discrete):
            raise ConfigError(f"CategoricalActor needs a Discrete action space, got {action_space}")
        self.observation_size = _observation_size(observation_space)
        self.action_size = 1
        self.num_actions = int(action_space.n)
        self.logits = ppo_mlp([self.observation_size, *hidden_sizes, self.num_actions], 0.01)

    def forward(self, observations: Tensor) -> tuple[Tensor, Tensor]:
        """A sample (B, 1), its index as a float, and its log-probability (B,).

        Drawn by the Gumbel-max trick (argmax of logits plus Gumbel noise is a categorical
        sample): ``torch.multinomial`` would need more care inside a graph."""
        log_p = F.log_softmax(self.logits(observations), dim=-1)
        uniform = torch.rand_like(log_p).clamp(min=torch.finfo(log_p.dtype).tiny)
        index = (log_p - torch.log(-torch.log(uniform))).argmax(dim=-1, keepdim=True)
        return index.to(log_p.dtype), log_p.gather(-1, index).squeeze(-1)

    def log_prob_and_entropy(self, observations: Tensor, actions: Tensor
                             ) -> tuple[Tensor, Tensor]:
        """log p(action) (B,) of the stored indices ``actions`` (B, 1), and the entropy (B,)."""
        log_p = F.log_softmax(self.logits(observations), dim=-1)
        log_probs = log_p.gather(-1, actions.long()).squeeze(-1)
        entropy = -(log_p.exp() * log_p).sum(dim=-1)
        return log_probs, entropy

    def deterministic_action(self, observations: Tensor) -> Tensor:
        """The most likely action's index (B, 1), as a float."""
        logits = self.logits(observations)
        return logits.argmax(dim=-1, keepdim=True).to(logits.dtype)


class ValueNetwork(nn.Module):
    """The state-value critic: an MLP to one value (head std 1.0), (B, O) -> (B, 1).

    Built as every network is, ``ValueNetwork(observation_space, action_space, **kwargs)``
    (so ``--critic rl_graphstep.networks.policies:ValueNetwork --critic-kwargs
    '{hidden_sizes: [128, 128]}'`` works); a value takes no action, so ``action_space`` is
    unused. ``hidden_sizes`` is keyword-only: given in place of the action space it would be
    taken for one."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space | None = None,
                 *, hidden_sizes: Sequence[int] = (64, 64)) -> None:
        super().__init__()
        del action_space
        self.observation_size = _observation_size(observation_space)
        self.net = ppo_mlp([self.observation_size, *hidden_sizes, 1], 1.0)

    def forward(self, observations: Tensor) -> Tensor:
        return self.net(observations)


class ActionEvaluation(nn.Module):
    """The actor as the actor step calls it: one packed ``[observation | action]`` tensor in,
    ``actor.log_prob_and_entropy(observation, action)`` out (as ``StateActionInput`` packs
    the off-policy critic's input). Its parameters are the actor's own."""

    def __init__(self, actor: nn.Module, observation_size: int) -> None:
        super().__init__()
        self.actor = actor
        self.observation_size = int(observation_size)

    def _get_name(self) -> str:
        return f"{self.actor._get_name()} (via ActionEvaluation)"

    def forward(self, inputs: Tensor) -> tuple[Tensor, Tensor]:
        return self.actor.log_prob_and_entropy(inputs[..., : self.observation_size],
                                               inputs[..., self.observation_size :])
