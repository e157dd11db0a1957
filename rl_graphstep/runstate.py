"""What a checkpoint of a training run holds, and putting it back: the loop's counters, the
learner, the replay buffer, the random-number states, the environments."""

from __future__ import annotations

import pickle
import warnings
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np

from rl_graphstep.checkpoint import FORMAT, networks_mismatch, save_checkpoint
from rl_graphstep.collector import Collector
from rl_graphstep.config import Config, config_to_dict
from rl_graphstep.envs import EpisodeStatistics, rng_state, set_rng_state
from rl_graphstep.errors import CheckpointError
from rl_graphstep.learners import OffPolicyLearner
from rl_graphstep.nonfinite import NonFiniteTally


@dataclass
class Progress:
    """The loop's counters, saved in every checkpoint. ``seed_returns`` and ``tallies`` hold
    one entry per seed (one for a single run): each seed's last 10 returns and its non-finite
    tally."""

    global_step: int = 0
    episodes: int = 0
    episode_stats: EpisodeStatistics = field(default_factory=lambda: EpisodeStatistics(1))
    seed_returns: list[deque[float]] = field(default_factory=lambda: [deque(maxlen=10)])
    tallies: list[NonFiniteTally] = field(default_factory=lambda: [NonFiniteTally("")])

    @classmethod
    def of(cls, env_id: str, seeds: Sequence[int], num_envs: int) -> Progress:
        """Fresh counters for the run's ``seeds`` (each tally named by its seed, which its
        warning and the run's last line give), ``num_envs`` envs each."""
        return cls(episode_stats=EpisodeStatistics(len(seeds) * num_envs),
                   seed_returns=[deque(maxlen=10) for _ in seeds],
                   tallies=[NonFiniteTally(env_id, seed=None if len(seeds) == 1 else seed)
                            for seed in seeds])

    @property
    def recent_returns(self) -> deque[float]:
        """A single run's last 10 returns."""
        return self.seed_returns[0]

    @property
    def nonfinite(self) -> NonFiniteTally:
        """A single run's tally; a group's first (which also counts the group's updates)."""
        return self.tallies[0]

    @property
    def grouped(self) -> bool:
        return len(self.tallies) > 1


def _pickled_envs(envs: gym.vector.VectorEnv) -> bytes | None:
    # A sync vector env of pure-Python envs pickles with its full state (exact resume);
    # cloudpickle (gymnasium's own dependency) because gymnasium builds them from closures.
    # Others (subprocesses, simulators with native handles) restart their episodes instead.
    try:
        return cloudpickle.dumps(envs)
    except Exception:
        return None


def save_run(cfg: Config, run_dir: Path, progress: Progress, learner: OffPolicyLearner,
             collector: Collector) -> Path:
    """Write a checkpoint of the run as it stands (the last transition stored first)."""
    collector.flush(progress.global_step)
    policy = collector.policy
    staged = policy.staged_actor() if policy is not None else []
    state = {
        "format": FORMAT,
        "config": config_to_dict(cfg),
        "run_name": run_dir.name,
        "global_step": progress.global_step,
        "episodes": progress.episodes,
        **_progress_state(progress, learner),
        "episode_stats": progress.episode_stats.state_dict(),
        "agent": learner.state_dict(),
        "rng": rng_state(),
        "envs": _pickled_envs(collector.envs),
        "observations": collector.observations,
        "buffer": collector.buffer.state_dict() if cfg.save_buffer else None,
        "staged_actor": staged or None,
    }
    return save_checkpoint(run_dir, progress.global_step, state, keep=cfg.keep_checkpoints)


def restore_run(state: dict[str, Any], learner: OffPolicyLearner, progress: Progress,
                envs: gym.vector.VectorEnv) -> tuple[gym.vector.VectorEnv, np.ndarray]:
    """Put a checkpoint back: learner (before any capture), buffer, counters, RNG, envs;
    returns the envs to continue with and their observations."""
    try:
        learner.load_state_dict(state["agent"])
    except (RuntimeError, ValueError, KeyError, TypeError) as error:
        algorithm = learner.algorithm
        built = (f"the actor {type(algorithm.actor).__name__} and critic "
                 f"{type(algorithm.critic).__name__}")
        raise CheckpointError(networks_mismatch(state, learner.cfg, error, built)) from None
    if state.get("buffer") is not None:
        learner.buffer.load_state_dict(state["buffer"])
    progress.global_step = int(state["global_step"])
    progress.episodes = int(state["episodes"])
    _load_progress_state(progress, state, learner.updates)
    set_rng_state(state["rng"])
    if state.get("envs") is not None:
        if state.get("episode_stats") is not None:
            progress.episode_stats.load_state_dict(state["episode_stats"])
        envs.close()
        return pickle.loads(state["envs"]), state["observations"]
    warnings.warn("the environments could not be saved with the checkpoint; their episodes "
                  "restart on resume", stacklevel=3)
    observations, _ = envs.reset()
    return envs, observations


def _progress_state(progress: Progress, learner: OffPolicyLearner) -> dict[str, Any]:
    """A single run's returns and tally as before; a group's as one list per seed."""
    if not progress.grouped:
        return {"recent_returns": list(progress.recent_returns),
                "nonfinite": progress.nonfinite.state_dict(learner)}
    return {"recent_returns": [list(r) for r in progress.seed_returns],
            "nonfinite": [t.state_dict(learner) for t in progress.tallies]}


def _load_progress_state(progress: Progress, state: dict[str, Any], updates: int) -> None:
    if not progress.grouped:
        progress.recent_returns.extend(state["recent_returns"])
        progress.nonfinite.load_state_dict(state.get("nonfinite"), updates)
        return
    for returns, saved in zip(progress.seed_returns, state["recent_returns"], strict=True):
        returns.extend(saved)
    for tally, saved in zip(progress.tallies, state["nonfinite"], strict=True):
        tally.load_state_dict(saved, updates)
