"""The benchmarks' learner: an algorithm with its default networks, over a replay buffer of
random rows, built (captured or wrapped) as the training loop builds it."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from rl_graphstep.algorithms import ALGORITHMS
from rl_graphstep.buffer import ReplayBuffer
from rl_graphstep.config import Config
from rl_graphstep.learners import OffPolicyLearner
from rl_graphstep.metrics import MetricSums
from rl_graphstep.plan import plan_run


def box(size: int) -> gym.spaces.Box:
    return gym.spaces.Box(-1, 1, (size,), np.float32)


def random_buffer(rows: int, observation_size: int, action_size: int,
                  device: torch.device) -> ReplayBuffer:
    """A full buffer of ``rows`` random transitions (none terminal)."""
    buffer = ReplayBuffer(rows, observation_size, action_size, device)
    rng = np.random.default_rng(0)
    buffer.add(rng.normal(size=(rows, observation_size)),
               rng.uniform(-1, 1, (rows, action_size)), rng.normal(size=rows),
               rng.normal(size=(rows, observation_size)), np.zeros(rows, bool))
    return buffer


def built_learner(cfg: Config, observation_space: gym.spaces.Box, action_space: gym.spaces.Box,
                  device: torch.device, *, rows: int = 10_000, fuse: bool = True
                  ) -> OffPolicyLearner:
    """``cfg.algo``'s learner on ``device`` with its updates built as ``cfg`` plans them
    (``plan_run``; compile auto counts no updates ahead), no update run. Build it inside the
    run's ``matmul_precision``: a captured graph keeps the kernels chosen at capture."""
    kind = ALGORITHMS[cfg.algo]
    torch.manual_seed(0)
    algorithm = kind(kind.default_actor(observation_space, action_space, cfg),
                     kind.default_critic(observation_space, action_space, cfg), cfg,
                     action_size=action_space.shape[0], device=device)
    buffer = random_buffer(rows, observation_space.shape[0], action_space.shape[0], device)
    learner = OffPolicyLearner(algorithm, buffer, cfg, plan_run(cfg, device, updates_ahead=0))
    learner.build(MetricSums(), fuse=fuse)
    return learner
