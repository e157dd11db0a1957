"""The on-policy collector: PPO's acting and rollout filling, beside the off-policy collector.

Each ``step()`` asks the on-policy learner for the actions of the current observations (on
the device, sampled from the current policy: no random warm-up, no action stream), steps
every env once and adds the step to the rollout; the step that fills the rollout runs the
update it is given with the values of the observations that follow it, which also empties
the rollout. The loop calls it as it calls the off-policy collector's ``step``.

A Gaussian actor's samples are unbounded: the envs get them clipped to the action space, as
CleanRL's ``ClipAction`` does, and the rollout keeps the unclipped sample, whose
log-probability the policy loss compares with. A discrete action is its index.
"""

from __future__ import annotations

from collections.abc import Callable

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor

from rl_graphstep.envs.vector import EnvStepper, true_next_observations
from rl_graphstep.learners.onpolicy import OnPolicyLearner
from rl_graphstep.run.nonfinite import NonFiniteTally

Update = Callable[[Tensor], None]
"""The learner's update of a filled rollout, given the values after its last step."""


class RolloutCollector:
    """Acts in ``envs`` (K seeds x N envs, seed k's envs being rows k*N .. k*N+N-1) with
    ``learner``'s policy and fills its rollout.

    Args:
        envs: the vector env, already reset; ``observations`` its current observations.
        learner: the on-policy learner, whose ``act`` and ``values`` the rollout stores.
        tally: the run's non-finite tally (an on-policy run stores no transition it could
            drop: ``unstored_nonfinite`` is 0).
    """

    buffer = None  # no replay buffer: what a checkpoint saves of one is nothing
    policy = None  # no ActionPipe: the learner acts on the updates' device and stream
    nstep = None
    waited = 0.0
    waits = 0

    def __init__(self, envs: gym.vector.VectorEnv, observations: np.ndarray,
                 learner: OnPolicyLearner, tally: NonFiniteTally) -> None:
        self.envs, self.observations, self.learner, self.tally = (envs, observations,
                                                                  learner, tally)
        self.rollout = learner.rollout
        self.device = learner.device
        self.seeds, self.num_envs = self.rollout.seeds, self.rollout.num_envs
        space = envs.single_action_space
        self.discrete = isinstance(space, gym.spaces.Discrete)
        self._low = None if self.discrete else space.low
        self._high = None if self.discrete else space.high
        self._dtype = space.dtype
        self._stepper = EnvStepper(envs)
        self.updated = False  # whether the last step filled the rollout (and updated)

    @property
    def in_env_step(self) -> bool:
        """Whether the envs are stepping in this process now (in their own code)."""
        return self._stepper.in_env_step

    @property
    def at_boundary(self) -> bool:
        """Whether no rollout is under way: a checkpoint now resumes exactly."""
        return self.rollout.step == 0

    def _tensor(self, array: np.ndarray) -> Tensor:
        """(K*N, ...) host rows as the learner takes them: (N, ...) or (K, N, ...)."""
        tensor = torch.as_tensor(np.asarray(array), dtype=torch.float32, device=self.device)
        shape = (self.num_envs,) if self.seeds == 1 else (self.seeds, self.num_envs)
        return tensor.reshape(*shape, *tensor.shape[1:])

    def _env_actions(self, actions: Tensor) -> np.ndarray:
        """The actions the envs take, one row per env: the index of a discrete action, a
        continuous one clipped to the space (the rollout keeps the unclipped sample)."""
        rows = actions.reshape(self.seeds * self.num_envs, -1).cpu().numpy()
        if self.discrete:
            return rows[:, 0].astype(self._dtype)
        return np.clip(rows, self._low, self._high).astype(self._dtype, copy=False)

    def step(self, global_step: int, *, explore: bool = True, update: Update | None
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One step of every env with the policy's sampled actions, added to the rollout; a
        step that fills the rollout then runs ``update`` (where given). Returns the step's
        rewards, terminations and truncations. ``global_step`` and ``explore``: as the
        off-policy collector takes them (PPO always acts with its policy)."""
        del global_step, explore
        observations = self._tensor(self.observations)
        actions, log_probs, values = self.learner.act(observations)
        self._stepper.start(self._env_actions(actions))
        next_observations, rewards, terminations, truncations, infos = self._stepper.finish()
        # The final observations' values bootstrap truncated episodes (read only there).
        final_values = (self.learner.values(self._tensor(true_next_observations(
            next_observations, infos))) if np.any(truncations) else torch.zeros_like(values))
        self.rollout.add(observations, actions, log_probs, values, self._tensor(rewards),
                         self._tensor(terminations), self._tensor(truncations), final_values)
        self.observations = next_observations
        self.updated = self.rollout.full
        if self.updated and update is not None:
            update(self.learner.values(self._tensor(next_observations)))
        return rewards, terminations, truncations

    def flush(self, global_step: int) -> None:
        """Nothing waits to be stored: every step is in the rollout when ``step`` returns."""

    def unstored_nonfinite(self) -> int:
        return 0
