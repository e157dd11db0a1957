"""The on-policy collector: PPO's acting and rollout filling, beside the off-policy collector.

Each ``step()`` asks the on-policy learner for the actions of the current observations (on
the device, sampled from the current policy: no random warm-up, no action stream), steps
every env once and adds the step to the rollout; the next step's acting is queued before this
step's bookkeeping on the host, so that the two run at once (not after the step that fills
the rollout: its update comes first); the step that fills the rollout runs the
update it is given with the values of the observations that follow it, which also empties
the rollout. The loop calls it as it calls the off-policy collector's ``step``.

NaN and inf from the environment are checked on the host as each step is added, as the
off-policy collector checks its transitions: counted in the seeds' tallies, never stored, and
a seed with one is left out of the rollout's update (see ``_checked``).

A Gaussian actor's samples are unbounded: the envs get them clipped to the action space, as
CleanRL's ``ClipAction`` does, and the rollout keeps the unclipped sample, whose
log-probability the policy loss compares with. A discrete action is its index.

With ``--obs-norm`` each step first counts the observations the envs returned (the first
reset's, and after that each step's, resets included) into each seed's statistics, then acts
on them normalised; the rollout stores them normalised, as CleanRL's buffer does behind its
``NormalizeObservation`` wrapper. A step's final observations (truncation bootstrapping) and
the observations after the rollout's last step are normalised with that step's statistics,
uncounted (they are counted, as the next step's observations, when acted on). A non-finite
observation is never counted (the policy acts on zeros in its place). With ``--reward-norm``
the rewards enter the rollout scaled (``data.normalizer.RewardNormalizer``);
:meth:`RolloutCollector.step` returns the env's own, which the episode returns are summed
from.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor

from rl_graphstep.core.compiling import quiet_compiler
from rl_graphstep.envs.vector import EnvStepper, true_next_observations
from rl_graphstep.learners.metrics import MetricSums
from rl_graphstep.learners.onpolicy import OnPolicyLearner
from rl_graphstep.run.nonfinite import NonFiniteTally, finite_transitions, policy_inputs
from rl_graphstep.settings.config import Config
from rl_graphstep.settings.plan import RunPlan

Update = Callable[[Tensor], None]
"""The learner's update of a filled rollout, given the values after its last step."""

# What the warning about a run's first non-finite step says becomes of it.
NOT_LEARNED = ("steps with NaN or inf are not learned from (their seed's update of the rollout "
               "is skipped) and counted in charts/nonfinite_transitions")


class RolloutCollector:
    """Acts in ``envs`` (K seeds x N envs, seed k's envs being rows k*N .. k*N+N-1) with
    ``learner``'s policy and fills its rollout.

    Args:
        envs: the vector env, already reset; ``observations`` its current observations.
        learner: the on-policy learner, whose ``act`` and ``values`` the rollout stores.
        tally: the run's non-finite tally (an on-policy run stores no transition it could
            drop: ``unstored_nonfinite`` is 0).
        seed_tallies: with K seeds, one tally per seed, which counts the seed's steps with
            NaN or inf (by default ``tally`` counts them all).
    """

    buffer = None  # no replay buffer: what a checkpoint saves of one is nothing
    policy = None  # no ActionPipe: the learner acts on the updates' device and stream
    nstep = None
    waited = 0.0
    waits = 0

    def __init__(self, envs: gym.vector.VectorEnv, observations: np.ndarray,
                 learner: OnPolicyLearner, tally: NonFiniteTally, *,
                 seed_tallies: Sequence[NonFiniteTally] = ()) -> None:
        self.envs, self.observations, self.learner, self.tally = (envs, observations,
                                                                  learner, tally)
        self.tallies = list(seed_tallies) or [tally]
        self.rollout = learner.rollout
        self.device = learner.device
        self.seeds, self.num_envs = self.rollout.seeds, self.rollout.num_envs
        space = envs.single_action_space
        self.discrete = isinstance(space, gym.spaces.Discrete)
        self._low = None if self.discrete else space.low
        self._high = None if self.discrete else space.high
        self._dtype = space.dtype
        self._stepper = EnvStepper(envs)
        self.normalizer = self.rollout.normalizer
        self.reward_normalizer = self.rollout.reward_normalizer
        self.updated = False  # whether the last step filled the rollout (and updated)
        self._acting = False  # whether the next step's acting is queued already

    def learning_due(self, step: int, cfg: Config) -> bool:
        """PPO acts with its policy from the first step: the learner is built before it."""
        return True

    def start_learning(self, learner: OnPolicyLearner, sums: MetricSums,
                       staged_actor: list[Tensor] | None = None) -> RunPlan:
        """Build ``learner`` (its updates adding into ``sums``); it acts itself, through no
        action pipe (``staged_actor`` is the off-policy collector's). Its build draws nothing
        from the CPU generator the run acts with: a resumed run samples as the straight one
        does. Returns the plan that holds."""
        with quiet_compiler(), torch.random.fork_rng(devices=[]):
            return learner.build(sums)

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

    def _observed(self, safe: np.ndarray) -> Tensor:
        """(K*N, O) host observations, non-finite rows already zeros (:func:`policy_inputs`),
        as the learner sees them: normalised with the current statistics under
        ``--obs-norm`` (counting nothing), else as they are."""
        tensor = self._tensor(safe)
        return tensor if self.normalizer is None else self.normalizer.normalize(tensor)

    def _env_actions(self, rows: np.ndarray) -> np.ndarray:
        """The actions the envs take from the policy's (K*N, A), one row per env: the index of
        a discrete action, a continuous one clipped to the space (the rollout keeps the
        unclipped sample)."""
        if self.discrete:
            return rows[:, 0].astype(self._dtype)
        # np.clip's values, in two ufuncs (np.clip's wrapper costs more than both).
        return np.minimum(np.maximum(rows, self._low), self._high).astype(self._dtype,
                                                                          copy=False)

    def step(self, global_step: int, *, explore: bool = True, update: Update | None
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One step of every env with the policy's sampled actions, added to the rollout; a
        step that fills the rollout then runs ``update`` (where given). Returns the step's
        rewards, terminations and truncations. ``global_step`` and ``explore``: as the
        off-policy collector takes them (PPO always acts with its policy)."""
        del explore
        if not self._acting:
            self._start_acting(self.observations)
        observations = self.observations
        env_actions = self._env_actions(self.learner.actions())
        self._acting = False
        self._stepper.start(env_actions)
        next_observations, rewards, terminations, truncations, infos = self._stepper.finish()
        final_observations = true_next_observations(next_observations, infos)
        # The final observations' values bootstrap truncated episodes (read only there),
        # normalised with this step's statistics: before the next observations count.
        final_values = (self.learner.values(self._observed(policy_inputs(final_observations)[0]))
                        if truncations.any() else None)
        self.observations = next_observations
        if self.rollout.step + 1 < self.rollout.num_steps:
            # The next step's acting runs on the device while the host books this step.
            self._start_acting(next_observations)
        finite = self._checked(global_step, observations, env_actions, rewards,
                               final_observations)
        learned = (rewards if self.reward_normalizer is None
                   else self.reward_normalizer.scale(rewards, terminations, truncations))
        if not finite:  # nothing non-finite is stored: such a reward as 0
            learned = np.where(np.isfinite(learned), learned, 0.0)
        self.rollout.record(learned, terminations, truncations, final_values)
        self.updated = self.rollout.full
        if self.updated and update is not None:
            update(self.learner.values(self._observed(policy_inputs(next_observations)[0])))
        return rewards, terminations, truncations

    def _start_acting(self, observations: np.ndarray) -> None:
        """Count ``observations`` under ``--obs-norm`` (before the policy acts on them, the
        non-finite rows left out) and queue the policy's acting on them, which also fills
        the rollout's next row; :meth:`OnPolicyLearner.actions` waits for it."""
        safe, unsafe = policy_inputs(observations)
        if self.normalizer is not None:
            self.normalizer.observe(observations, None if unsafe is None else ~unsafe)
        self.learner.start_acting(safe)
        self._acting = True

    def _checked(self, global_step: int, observations: np.ndarray, env_actions: np.ndarray,
                 rewards: np.ndarray, final_observations: np.ndarray) -> bool:
        """Whether the step's transitions (observation, action, reward, next observation) are
        all finite. Each seed's tally counts and warns about its others, as the off-policy
        collector's do, and a seed with one is left out of this rollout's update
        (``Rollout.exclude``). Nothing non-finite is stored: the caller stores such a reward
        as 0, and the policy acts on zeros in place of such an observation (see
        :func:`policy_inputs`)."""
        finite = finite_transitions(self.tallies, global_step + self.num_envs,
                                    observations, env_actions, rewards,
                                    final_observations, consequence=NOT_LEARNED)
        if finite.all():
            return True
        for seed, seed_finite in enumerate(finite.reshape(self.seeds, self.num_envs)):
            if not seed_finite.all():
                self.rollout.exclude(seed)
        return False

    def flush(self, global_step: int) -> None:
        """Nothing waits to be stored: every step is in the rollout when ``step`` returns."""

    def unstored_nonfinite(self) -> int:
        return 0

    def checkpoint_due(self, step: int, every: int) -> bool:
        """Whether the loop saves after ``step``: at the first rollout boundary at or after
        each multiple of ``every`` (a checkpoint holds no rollout under way)."""
        rollout = self.num_envs * self.rollout.num_steps  # a seed's steps per rollout
        return self.updated and step // every > (step - rollout) // every

    def updates_due(self, step: int, cfg: Config) -> bool:
        """Whether a run at ``step`` was due to have updated: it filled a rollout."""
        return step >= cfg.num_envs * cfg.num_steps

    def stored(self) -> int:
        """No replay buffer: nothing stored that a batch waits for."""
        return 0

    def stop_note(self) -> str:
        """What a stop's line adds mid-rollout: the checkpoint holds the learner of the last
        update, and the resumed run starts a fresh rollout."""
        if self.at_boundary:
            return ""
        steps = self.rollout.step
        return (f" (mid-rollout: the last {steps} step{'s' if steps > 1 else ''} of each env "
                "are not learned from; the resumed run starts a new rollout)")
