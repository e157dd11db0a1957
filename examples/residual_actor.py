"""A SAC actor built from pre-LayerNorm residual blocks instead of a plain MLP.

Residual blocks (`x + mlp(layernorm(x))`) keep gradients healthy in deeper or wider actors
(as in BRO and SimBa). Plug it in with `--actor examples.residual_actor:ResidualActor`.
"""

from __future__ import annotations

import math

import gymnasium as gym
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rl_graphstep.networks.builtin import LOG_STD_MAX, LOG_STD_MIN


def _flat_size(space: gym.Space, what: str) -> int:
    if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
        raise ValueError(f"ResidualActor needs a flat (1-D) Box {what} space, got {space}")
    return int(space.shape[0])


class ResidualBlock(nn.Module):
    """`x + mlp(layernorm(x))` with a two-layer ReLU MLP of the same width."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width))

    def forward(self, x: Tensor) -> Tensor:
        """The block's output, shaped like `x`."""
        return x + self.mlp(self.norm(x))


class ResidualActor(nn.Module):
    """A squashed-Gaussian SAC actor: linear stem, `blocks` residual blocks, LayerNorm, heads.

    Args:
        observation_space: flat Box of the observations.
        action_space: flat Box of the actions; actions come out in [-1, 1].
        width: features carried through the residual stream.
        blocks: number of residual blocks.
    """

    def __init__(
        self,
        observation_space: gym.Space,
        action_space: gym.Space,
        width: int = 256,
        blocks: int = 2,
    ) -> None:
        super().__init__()
        self.observation_size = _flat_size(observation_space, "observation")
        self.action_size = _flat_size(action_space, "action")
        self.stem = nn.Linear(self.observation_size, width)
        self.blocks = nn.Sequential(*(ResidualBlock(width) for _ in range(blocks)))
        # The residual stream is never normalised inside the blocks, so normalise it once here.
        self.norm = nn.LayerNorm(width)
        self.mean = nn.Linear(width, self.action_size)
        self.log_std = nn.Linear(width, self.action_size)

    def mean_and_log_std(self, observations: Tensor) -> tuple[Tensor, Tensor]:
        """The pre-squash Gaussian's mean and log-std, each (B, A); log-std in [-5, 2]."""
        features = torch.relu(self.norm(self.blocks(self.stem(observations))))
        # Squashed into the bounds by tanh rather than clamped, so the gradient never vanishes.
        raw = torch.tanh(self.log_std(features))
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (raw + 1)
        return self.mean(features), log_std

    def forward(self, observations: Tensor) -> tuple[Tensor, Tensor]:
        """A reparameterised sample: actions (B, A) in [-1, 1] and their log-probability (B,)."""
        mean, log_std = self.mean_and_log_std(observations)
        # randn_like, not torch.distributions: no argument validation (a host sync), and the
        # noise is drawn on the device, so each CUDA graph replay draws afresh.
        eps = torch.randn_like(mean)
        pre_tanh = mean + log_std.exp() * eps
        gaussian = -0.5 * eps.pow(2) - log_std - 0.5 * math.log(2 * math.pi)
        # log(1 - tanh(u)^2) in its exact, stable form: no epsilon, finite even where tanh(u)
        # rounds to ±1 in float32.
        log_det = 2.0 * (math.log(2.0) - pre_tanh - F.softplus(-2.0 * pre_tanh))
        return torch.tanh(pre_tanh), (gaussian - log_det).sum(dim=-1)

    def deterministic_action(self, observations: Tensor) -> Tensor:
        """tanh of the mean: the action to take when evaluating."""
        mean, _ = self.mean_and_log_std(observations)
        return torch.tanh(mean)
