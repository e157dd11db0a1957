"""The benchmarks' learner: an algorithm with its default networks (stacked, for a group of
seeds), over a replay buffer of random rows, built (captured or wrapped) as the training loop
builds it."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from rl_graphstep.algorithms import ALGORITHMS
from rl_graphstep.data.buffer import ReplayBuffer
from rl_graphstep.learners import OffPolicyLearner
from rl_graphstep.learners.metrics import MetricSums
from rl_graphstep.run.netspec import make_seed_networks
from rl_graphstep.settings.config import Config
from rl_graphstep.settings.plan import plan_run


def box(size: int) -> gym.spaces.Box:
    return gym.spaces.Box(-1, 1, (size,), np.float32)


def random_buffer(rows: int, observation_size: int, action_size: int,
                  device: torch.device, seeds: int = 1) -> ReplayBuffer:
    """A full buffer of ``rows`` random transitions (none terminal), per seed with K seeds."""
    buffer = ReplayBuffer(rows, observation_size, action_size, device, seeds=seeds)
    rng = np.random.default_rng(0)
    total = rows * seeds
    # Seed k's rows are k*rows .. (k+1)*rows - 1 of one add: the whole ring of each seed.
    buffer.add(rng.normal(size=(total, observation_size)),
               rng.uniform(-1, 1, (total, action_size)), rng.normal(size=total),
               rng.normal(size=(total, observation_size)), np.zeros(total, bool))
    return buffer


def built_learner(cfg: Config, observation_space: gym.spaces.Box, action_space: gym.spaces.Box,
                  device: torch.device, *, rows: int = 10_000, fuse: bool = True
                  ) -> OffPolicyLearner:
    """``cfg.algo``'s learner (of ``cfg``'s seeds) on ``device`` with its updates built as
    ``cfg`` plans them (``plan_run``; compile auto counts no updates ahead), no update run.
    Build it inside the run's ``matmul_precision``: a captured graph keeps the kernels chosen
    at capture."""
    kind = ALGORITHMS[cfg.algo]
    torch.manual_seed(0)
    seeds = cfg.seed_list
    actor, critic = make_seed_networks(kind, cfg, seeds, observation_space, action_space, device)
    algorithm = kind(actor, critic, cfg, action_size=action_space.shape[0], device=device,
                     seeds=len(seeds))
    buffer = random_buffer(rows, observation_space.shape[0], action_space.shape[0], device,
                           seeds=len(seeds))
    learner = OffPolicyLearner(algorithm, buffer, cfg, plan_run(cfg, device, updates_ahead=0))
    learner.build(MetricSums(shape=(len(seeds),) if len(seeds) > 1 else ()), fuse=fuse)
    return learner
