"""An env whose constructor warns as MuJoCo does when a model uses ``settotalmass``, and once
more about something else: made in env workers by ``noisyenv:Noisy-v0`` (the module is light,
so that spawned workers start fast)."""

from __future__ import annotations

import warnings
from typing import Any

import gymnasium as gym
import numpy as np

SETTOTALMASS = ("XML Warning: compiler attribute 'settotalmass' is deprecated and will be "
                "removed; call mj_setTotalmass on the compiled model instead")
"""MuJoCo's deprecation, as a warning of the same category and words."""
OTHER = "noisyenv: a warning the user should see"


class Noisy(gym.Env):
    """One observation entry, one action entry; warns twice when made."""

    def __init__(self) -> None:
        warnings.warn(SETTOTALMASS, UserWarning, stacklevel=2)
        warnings.warn(OTHER, UserWarning, stacklevel=2)
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> Any:
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action: np.ndarray) -> Any:
        return np.zeros(1, np.float32), 0.0, False, False, {}


gym.register("Noisy-v0", entry_point=Noisy, max_episode_steps=10)
