"""An ensemble critic with LayerNorm after every hidden layer, as in DroQ and CrossQ.

Normalising the hidden features keeps Q estimates from blowing up when the critic is updated
many times per environment step; optional dropout (DroQ uses 0.01) adds the regularisation
DroQ pairs it with. Plug it in with `--critic examples/layernorm_critic.py:LayerNormCritic`.
"""

from __future__ import annotations

from collections.abc import Sequence

import gymnasium as gym
import torch
from torch import Tensor, nn


def _flat_size(space: gym.Space, what: str) -> int:
    if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
        raise ValueError(f"LayerNormCritic needs a flat (1-D) Box {what} space, got {space}")
    return int(space.shape[0])


class LayerNormCritic(nn.Module):
    """`num_critics` separate Q networks, Linear -> [Dropout] -> LayerNorm -> ReLU per layer.

    Args:
        observation_space: flat Box of the observations.
        action_space: flat Box of the actions.
        hidden_sizes: widths of each member's hidden layers.
        num_critics: ensemble members E (2 for clipped double Q).
        dropout: dropout probability before each LayerNorm; 0 leaves it out. Dropout draws
            random numbers on the device, which a CUDA graph replays with fresh values.
    """

    def __init__(
        self,
        observation_space: gym.Space,
        action_space: gym.Space,
        hidden_sizes: Sequence[int] = (256, 256),
        num_critics: int = 2,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if num_critics < 1:
            raise ValueError(f"num_critics must be at least 1, got {num_critics}")
        self.observation_size = _flat_size(observation_space, "observation")
        self.action_size = _flat_size(action_space, "action")
        self.num_critics = int(num_critics)
        self.members = nn.ModuleList(
            self._member(self.observation_size + self.action_size, hidden_sizes, dropout)
            for _ in range(self.num_critics)
        )

    @staticmethod
    def _member(fan_in: int, hidden_sizes: Sequence[int], dropout: float) -> nn.Sequential:
        layers: list[nn.Module] = []
        for width in hidden_sizes:
            layers.append(nn.Linear(fan_in, width))
            # DroQ's order: dropout on the pre-activation, then normalise what survives.
            if dropout > 0:
                layers.append(nn.Dropout(dropout))
            layers += [nn.LayerNorm(width), nn.ReLU()]
            fan_in = width
        layers.append(nn.Linear(fan_in, 1))
        return nn.Sequential(*layers)

    def forward(self, observations: Tensor, actions: Tensor) -> Tensor:
        """Q values shaped (B, num_critics), one column per member."""
        x = torch.cat([observations, actions], dim=-1)
        return torch.cat([member(x) for member in self.members], dim=-1)
