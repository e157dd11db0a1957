"""Tiny deterministic networks whose losses can be computed by hand."""

from __future__ import annotations

import torch
from torch import Tensor, nn


class FixedActor(nn.Module):
    """SAC-style: action = tanh(w * obs[:, :1]); log_pi = 0.1 * w * obs.sum(1)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor(0.5))

    def forward(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        return torch.tanh(self.w * obs[:, :1]), 0.1 * obs.sum(1) * self.w


class FixedDeterministicActor(nn.Module):
    """TD3-style: action = tanh(w * obs[:, :1])."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor(0.5))

    def forward(self, obs: Tensor) -> Tensor:
        return torch.tanh(self.w * obs[:, :1])


class LinearCritic(nn.Module):
    """Q_e(o, a) = c_e * (o.sum() + a.sum()), with c = (1, 2, ...)[:members]."""

    def __init__(self, members: int = 2) -> None:
        super().__init__()
        self.c = nn.Parameter(torch.arange(1.0, members + 1.0))

    def forward(self, obs: Tensor, act: Tensor) -> Tensor:
        return (obs.sum(1, keepdim=True) + act.sum(1, keepdim=True)) * self.c


# Two transitions, packed as [obs(2) | act(1) | reward | not_done | next_obs(2)].
ROWS = torch.tensor([
    [1.0, 2.0, 0.5, 1.0, 1.0, 0.2, -0.4],
    [-1.0, 0.5, -0.3, -2.0, 0.0, 1.5, 1.0],
])


def assert_same_learning_state(actual: object, expected: object) -> None:
    """Two agents' checkpointed parts (networks, targets, optimizers, temperature) equal to
    the bit, each named on a mismatch."""
    for name, part in expected.checkpointed().items():
        other = actual.checkpointed()[name]
        if isinstance(part, Tensor):
            torch.testing.assert_close(other, part, rtol=0, atol=0, msg=name)
        else:
            torch.testing.assert_close(other.state_dict(), part.state_dict(), rtol=0, atol=0,
                                       msg=name)
