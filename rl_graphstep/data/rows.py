"""A transition's packed row ``[observation | action | reward | not_done | next_observation]``:
where each part lies (RowLayout), packing host transitions into rows, and the critic's views of
a batch of rows."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

__all__ = ["ArrayLike", "CriticTargets", "RowLayout", "as_columns", "leading_size"]

ArrayLike = np.ndarray | torch.Tensor


class CriticTargets(NamedTuple):
    """Views of the critic step's targets ``[reward | not_done | next_observation]``;
    rewards and not_dones are shaped (B, 1)."""

    rewards: torch.Tensor
    not_dones: torch.Tensor
    next_observations: torch.Tensor


class RowLayout:
    """Where each part of a transition lies in a packed row
    ``[observation | action | reward | not_done | next_observation]``: the one owner of it.

    The critic step's inputs ``[observation | action]`` and targets ``[reward | not_done |
    next_observation]`` are two adjacent column ranges, so a sampled batch feeds both steps
    without copies.
    """

    def __init__(self, observation_size: int, action_size: int) -> None:
        self.observation_size = int(observation_size)
        self.action_size = int(action_size)
        critic_input_size = self.observation_size + self.action_size
        self.row_size = 2 * self.observation_size + self.action_size + 2
        self.observations = slice(0, self.observation_size)
        self.actions = slice(self.observation_size, critic_input_size)
        self.critic_inputs = slice(0, critic_input_size)
        self.critic_targets = slice(critic_input_size, self.row_size)
        self.rewards = slice(critic_input_size, critic_input_size + 1)
        self.not_dones = slice(critic_input_size + 1, critic_input_size + 2)
        self.next_observations = slice(critic_input_size + 2, self.row_size)

    def pack(self, rows: np.ndarray, observations: ArrayLike, actions: ArrayLike,
             rewards: ArrayLike, next_observations: ArrayLike, terminations: ArrayLike | None,
             *, not_dones: ArrayLike | None = None) -> None:
        """Write n transitions into the host rows ``rows`` (n, row_size or more), one per row;
        terminations are stored as not_done, or ``not_dones`` as given (instead of
        terminations: n-step rows, whose not_done is a discount). A ValueError names an
        argument of the wrong shape.
        """
        n = rows.shape[0]
        rows[:, self.observations] = as_columns("observations", observations, n,
                                                self.observation_size)
        rows[:, self.actions] = as_columns("actions", actions, n, self.action_size)
        rows[:, self.rewards] = as_columns("rewards", rewards, n, 1)
        if (terminations is None) == (not_dones is None):
            raise ValueError("give terminations or not_dones, one of them")
        rows[:, self.not_dones] = (
            as_columns("not_dones", not_dones, n, 1) if terminations is None
            else 1.0 - as_columns("terminations", terminations, n, 1).astype(rows.dtype))
        rows[:, self.next_observations] = as_columns("next_observations", next_observations,
                                                     n, self.observation_size)

    @staticmethod
    def split_targets(targets: torch.Tensor) -> CriticTargets:
        """Views of ``rows[:, layout.critic_targets]``, what the critic step receives."""
        return CriticTargets(targets[..., :1], targets[..., 1:2], targets[..., 2:])


def leading_size(value: ArrayLike) -> int:
    """The n of an (n, observation_size) batch of observations."""
    shape = tuple(value.shape)
    if len(shape) != 2:
        raise ValueError(
            f"observations must be shaped (num_envs, observation_size), got shape {shape}"
        )
    return shape[0]


def as_columns(name: str, value: ArrayLike, n: int, width: int) -> np.ndarray:
    """`value` as a host array of shape (n, width), or a ValueError naming the argument."""
    array = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
    shape = tuple(array.shape)
    if shape == (n,) and width == 1:
        return array.reshape(n, 1)
    if shape != (n, width):
        expected = f"({n},) or ({n}, 1)" if width == 1 else f"({n}, {width})"
        raise ValueError(f"{name} must have shape {expected}, got {shape}")
    return array
