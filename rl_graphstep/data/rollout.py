"""PPO's rollout storage on the device: T steps of N envs (of K seeds), GAE(lambda) with
bootstrapping on truncation, and the packed rows its minibatches are gathered from.

Every step is one row: ``[observation | action | log-prob | advantage | value | return]``.
The actor step reads the first two blocks as its inputs and log-prob and advantage as its
targets; the critic step reads the observation and (value, return). Rewards, terminations,
truncations and the final observations' values only feed GAE, so they live beside the rows.

A step is added in two halves, so that acting costs one launch and one host sync: what the
policy did (:meth:`Rollout.write_acted`, device tensors into the row the device's own step
counter points at: a CUDA graph can replay it) and what the envs returned
(:meth:`Rollout.record`, host arrays kept on the host until the rollout is full, then copied
to the device once for GAE).

With ``--obs-norm`` and ``--reward-norm`` the rollout carries the statistics its observations
and rewards were normalised with (``normalizer``, ``reward_normalizer``): the collector
normalises what it adds, the checkpoint saves them, as the replay buffer carries its own.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from rl_graphstep.data.normalizer import ObservationNormalizer, RewardNormalizer


class PolicyTargets(NamedTuple):
    """What the policy loss compares the new log-probabilities with, each (..., M)."""

    log_probs: Tensor  # the rollout's (old) log-probabilities of its actions
    advantages: Tensor


class ValueTargets(NamedTuple):
    """What the value loss compares the new values with, each (..., M)."""

    values: Tensor  # the rollout's (old) values, the centre of the value clip
    returns: Tensor


class RolloutLayout:
    """The packed row's columns: an observation of ``observation_size`` values, an action of
    ``action_size`` (1 for a discrete action, its index), then log-prob, advantage, value and
    return."""

    def __init__(self, observation_size: int, action_size: int) -> None:
        o, a = observation_size, action_size
        self.observation_size, self.action_size = o, a
        self.observations = slice(0, o)
        self.actions = slice(o, o + a)
        self.log_probs, self.advantages, self.values, self.returns = (o + a, o + a + 1,
                                                                      o + a + 2, o + a + 3)
        self.width = o + a + 4
        # What each step reads: contiguous column ranges of the row.
        self.actor_inputs = slice(0, o + a)          # [observation | action]
        self.actor_targets = slice(o + a, o + a + 2)  # [log-prob | advantage]
        self.critic_inputs = self.observations
        self.critic_targets = slice(o + a + 2, o + a + 4)  # [value | return]

    @staticmethod
    def policy_targets(targets: Tensor) -> PolicyTargets:
        """The actor step's targets (..., M, 2) as named columns."""
        return PolicyTargets(targets[..., 0], targets[..., 1])

    @staticmethod
    def value_targets(targets: Tensor) -> ValueTargets:
        """The critic step's targets (..., M, 2) as named columns."""
        return ValueTargets(targets[..., 0], targets[..., 1])


class Rollout:
    """Fixed-size storage of one rollout: ``num_steps`` (T) steps of ``num_envs`` (N) envs,
    with a leading seed dimension K when ``seeds`` > 1 (every tensor a caller passes or reads
    has it then, and none without it).

    The loop adds steps t = 0 .. T-1 (:meth:`write_acted` and :meth:`record`, or both at once
    with :meth:`add`), then :meth:`compute_advantages` with the values of the observations that
    follow the last step. Minibatches are gathered from :attr:`flat_rows`, (K, T*N, W).

    Args:
        num_steps, num_envs: T and N.
        observation_size, action_size: the row's observation and action widths.
        device: where everything lives.
        seeds: K.
        normalizer, reward_normalizer: the statistics of ``--obs-norm`` and ``--reward-norm``
            that the collector normalises what it adds with (None: raw).
    """

    def __init__(self, num_steps: int, num_envs: int, observation_size: int, action_size: int,
                 device: torch.device, seeds: int = 1, *,
                 normalizer: ObservationNormalizer | None = None,
                 reward_normalizer: RewardNormalizer | None = None) -> None:
        self.num_steps, self.num_envs, self.seeds = num_steps, num_envs, seeds
        self.normalizer, self.reward_normalizer = normalizer, reward_normalizer
        self.layout = RolloutLayout(observation_size, action_size)
        self.device = torch.device(device)
        shape = (seeds, num_steps, num_envs)
        # Stored always with the K dimension; what a single run sees drops it (``_view``).
        self.rows = torch.zeros(*shape, self.layout.width, device=self.device)
        # What the steps returned: rewards, terminations, truncations. Filled on the host and
        # copied to the device once the rollout is full: from pinned memory on CUDA, without
        # blocking, and the next rollout's first record waits for that copy (``_copied``).
        cuda = self.device.type == "cuda"
        self._returned_pinned = torch.zeros(3, *shape, pin_memory=cuda)
        self._returned_host = self._returned_pinned.numpy()
        self._returned = torch.zeros(3, *shape, device=self.device)
        self._copied = torch.cuda.Event() if cuda else None
        self.final_values = torch.zeros(shape, device=self.device)
        self.step = 0  # the next step to add, counted on the host
        self.position = torch.zeros(1, dtype=torch.int64, device=self.device)  # its device twin
        # Seeds whose rollout is not learned from (a non-finite step, see exclude): on the
        # host, so that nothing syncs.
        self.excluded = [False] * seeds

    # ------------------------------------------------------------------ views

    def _view(self, tensor: Tensor) -> Tensor:
        return tensor if self.seeds > 1 else tensor[0]

    def _column(self, index: int) -> Tensor:
        return self._view(self.rows[..., index])

    @property
    def observations(self) -> Tensor:
        return self._view(self.rows[..., self.layout.observations])

    @property
    def actions(self) -> Tensor:
        return self._view(self.rows[..., self.layout.actions])

    @property
    def log_probs(self) -> Tensor:
        return self._column(self.layout.log_probs)

    @property
    def values(self) -> Tensor:
        return self._column(self.layout.values)

    @property
    def advantages(self) -> Tensor:
        return self._column(self.layout.advantages)

    @property
    def returns(self) -> Tensor:
        return self._column(self.layout.returns)

    @property
    def rewards(self) -> Tensor:
        """(K, T, N) on the device, once :meth:`compute_advantages` has copied them there."""
        return self._returned[0]

    @property
    def terminations(self) -> Tensor:
        return self._returned[1]

    @property
    def truncations(self) -> Tensor:
        return self._returned[2]

    @property
    def flat_rows(self) -> Tensor:
        """Every row of the rollout, (K, T*N, W) (K = 1 included): what minibatches index."""
        return self.rows.view(self.seeds, self.num_steps * self.num_envs, self.layout.width)

    @property
    def flat_values_and_returns(self) -> tuple[Tensor, Tensor]:
        """The rollout's values and returns, each (K, T*N) (K = 1 included)."""
        flat = self.flat_rows
        return flat[..., self.layout.values], flat[..., self.layout.returns]

    @property
    def full(self) -> bool:
        return self.step == self.num_steps

    # ------------------------------------------------------------------ filling it

    def add(self, observations: Tensor, actions: Tensor, log_probs: Tensor, values: Tensor,
            rewards: Tensor | np.ndarray, terminations: Tensor | np.ndarray,
            truncations: Tensor | np.ndarray, final_values: Tensor | None) -> None:
        """Store step t whole: :meth:`write_acted` then :meth:`record`."""
        self._check_room()
        self.write_acted(observations, actions, log_probs, values)
        self.record(rewards, terminations, truncations, final_values)

    @torch.no_grad()
    def write_acted(self, observations: Tensor, actions: Tensor, log_probs: Tensor,
                    values: Tensor) -> None:
        """The observations (…, N, O) the actions (…, N, A) were taken in, their
        log-probabilities and values (…, N), into the row of step :attr:`position`, which
        then moves on: device work only, the same launches every step (a CUDA graph replays
        it). The caller checks there is room (the host's :attr:`step`)."""
        lead = (self.seeds, self.num_envs)
        zeros = torch.zeros(*lead, 1, device=self.device)  # advantage and return: GAE's
        row = torch.cat([observations.reshape(*lead, -1), actions.reshape(*lead, -1),
                         log_probs.reshape(*lead, 1), zeros, values.reshape(*lead, 1), zeros],
                        dim=-1)
        self.rows.index_copy_(1, self.position, row.unsqueeze(1))
        self.position.add_(1).remainder_(self.num_steps)

    def record(self, rewards: Tensor | np.ndarray, terminations: Tensor | np.ndarray,
               truncations: Tensor | np.ndarray, final_values: Tensor | None) -> None:
        """What step t returned: rewards, terminations and truncations (…, N or K*N; bools or
        0/1), kept on the host, and ``final_values`` (…, N), the critic's values of the final
        observations where an episode was truncated (read only there; None where no episode
        of the step was). Step t is then complete."""
        self._check_room()
        t = self.step
        if t == 0 and self._copied is not None:
            self._copied.synchronize()  # the last rollout's copy has read the host arrays
        for index, value in enumerate((rewards, terminations, truncations)):
            if isinstance(value, Tensor):
                value = value.detach().cpu().numpy()
            self._returned_host[index, :, t] = np.reshape(value, (self.seeds, self.num_envs))
        if final_values is not None:
            self.final_values[:, t] = final_values.reshape(self.seeds, self.num_envs)
        self.step += 1

    def _check_room(self) -> None:
        if self.step >= self.num_steps:
            raise RuntimeError(f"the rollout is full ({self.num_steps} steps); compute its "
                               "advantages and start the next one with reset()")

    def reset(self) -> None:
        """Start the next rollout (the storage is overwritten step by step)."""
        self.step = 0
        self.position.zero_()
        self.excluded = [False] * self.seeds

    def exclude(self, seed: int) -> None:
        """Leave seed ``seed``'s rollout (from 0) out of its update: its advantages and
        returns come out NaN from :meth:`compute_advantages`, so the non-finite guard of each
        of its minibatch steps skips it (and counts it), while the other seeds learn."""
        self.excluded[seed] = True

    # ------------------------------------------------------------------ GAE

    @torch.no_grad()
    def compute_advantages(self, next_values: Tensor, gamma: float, gae_lambda: float) -> None:
        """GAE(lambda) into the rows' advantage and return columns; ``next_values`` (…, N):
        the critic's values of the observations after the last step. See :func:`gae`."""
        if not self.full:
            raise RuntimeError(f"the rollout holds {self.step} of its {self.num_steps} steps; "
                               "fill it before computing advantages")
        self._returned.copy_(self._returned_pinned, non_blocking=True)
        if self._copied is not None:
            self._copied.record()
        values = self.rows[..., self.layout.values]
        advantages = gae(self.rewards, values, self.terminations, self.truncations,
                         self.final_values, next_values.reshape(self.seeds, self.num_envs),
                         gamma, gae_lambda)
        self.rows[..., self.layout.advantages] = advantages
        self.rows[..., self.layout.returns] = advantages + values
        for seed in (k for k, excluded in enumerate(self.excluded) if excluded):
            self.rows[seed, ..., self.layout.advantages] = torch.nan
            self.rows[seed, ..., self.layout.returns] = torch.nan


def gae(rewards: Tensor, values: Tensor, terminations: Tensor, truncations: Tensor,
        final_values: Tensor, next_values: Tensor, gamma: float, gae_lambda: float) -> Tensor:
    """Generalised advantage estimates of a rollout, (K, T, N) inputs, ``next_values`` (K, N).

    As CleanRL computes them, with truncation handled: the value after step t is the final
    observation's value where step t was truncated, the next step's value otherwise (the
    observations after the last step: ``next_values``), and it counts only where step t did
    not terminate::

        delta_t = r_t + gamma * V_next_t * (1 - terminated_t) - V_t
        A_t     = delta_t + gamma * lambda * (1 - ended_t) * A_{t+1}

    with ended = terminated or truncated: the recursion stops at every episode end. The
    deltas are one vectorised expression; the recursion a loop over T of device ops (no
    host sync)."""
    following = torch.cat([values[:, 1:], next_values.unsqueeze(1)], dim=1)
    next_step_values = torch.where(truncations > 0, final_values, following)
    deltas = rewards + gamma * next_step_values * (1 - terminations) - values
    carry = gamma * gae_lambda * (1 - torch.maximum(terminations, truncations))
    advantages = torch.empty_like(deltas)
    last = torch.zeros_like(deltas[:, 0])
    for t in reversed(range(deltas.shape[1])):
        last = deltas[:, t] + carry[:, t] * last
        advantages[:, t] = last
    return advantages
