"""The collector: the environments and the acting. Each ``step()`` acts, steps every env once
and stores the transition, and runs the update it is given where it overlaps best with the
environments, so the training loop does not know which mode runs."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence

import gymnasium as gym
import numpy as np
from torch import Tensor

from rl_graphstep.core.compiling import quiet_compiler
from rl_graphstep.data.buffer import ReplayBuffer
from rl_graphstep.data.nstep import NStepRows
from rl_graphstep.envs.vector import EnvStepper, scale_action, true_next_observations
from rl_graphstep.learners import OffPolicyLearner
from rl_graphstep.learners.metrics import MetricSums
from rl_graphstep.run.acting import ActionPipe, policy_pipe
from rl_graphstep.run.nonfinite import (
    NonFiniteTally,
    finite_mask,
    finite_transitions,
    policy_inputs,
    random_actions_for,
    store_seeds,
)
from rl_graphstep.settings.config import Config
from rl_graphstep.settings.plan import RunPlan, settle_action_stream

Transition = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]
"""(observations, actions, rewards, next observations, terminations), one row per env."""


class Collector:
    """Acts in ``envs`` and stores what happens in ``buffer``.

    The order inside a step is what makes the loop fast on a GPU: the policy's action is
    queued first and the update after it, so waiting for the action never waits for the
    update; the host then steps the environments while the device updates (envs in
    subprocesses step while the host launches the update). The previous step's transition is
    stored while the action is computed, off the path from one env step to the next.

    Args:
        envs: the vector env, already reset; ``observations`` its current observations.
        buffer: the replay buffer.
        tally: counts (and keeps out of the buffer) transitions with NaN or inf values.
        seed_tallies: with K seeds (a buffer of K rings, seed k's envs being rows k*n ..
            k*n+n-1), one tally per seed, which stores each seed's rows into its own ring.
        nstep: with ``--n-step`` above 1, the windows that turn the transitions into n-step
            rows (see `data.nstep`); the tallies then only count and warn, and the rows the
            windows complete are stored.
    """

    def __init__(self, envs: gym.vector.VectorEnv, observations: np.ndarray,
                 buffer: ReplayBuffer, tally: NonFiniteTally, *,
                 seed_tallies: Sequence[NonFiniteTally] = (),
                 nstep: NStepRows | None = None) -> None:
        self.envs = envs
        self.observations = observations
        self.buffer = buffer
        self.tally = tally
        self.seed_tallies = list(seed_tallies)
        # A seed's envs (the loop counts each seed's steps): K x n rows with K seeds.
        self.envs_per_seed = envs.num_envs // max(1, len(self.seed_tallies))
        self.policy: ActionPipe | None = None  # None: only random actions
        space = envs.single_action_space
        self._low, self._high = space.low, space.high
        self._random_shape = (envs.num_envs, space.shape[0])
        self._stepper = EnvStepper(envs)
        self._pending: Transition | None = None
        self._truncations: np.ndarray | None = None  # the pending transition's
        self.nstep = nstep
        self.waited = 0.0  # seconds spent waiting for the policy's actions
        self.waits = 0

    def learning_due(self, step: int, cfg: Config) -> bool:
        """Whether the learner is built before the iteration that starts at ``step``: once
        that iteration's steps pass ``learning_starts`` and the buffer holds a batch (a run
        resumed without its buffer first refills one)."""
        if step + cfg.num_envs <= cfg.learning_starts:
            return False
        self.flush(step)  # the last transition counts, too
        return len(self.buffer) >= cfg.batch_size

    def start_learning(self, learner: OffPolicyLearner, sums: MetricSums,
                       staged_actor: list[Tensor] | None) -> RunPlan:
        """Build ``learner`` (its updates adding into ``sums``) and act with its policy from
        now on, through the action pipe the plan that holds allows (``staged_actor``: a
        resumed run's, see ActionPipe); returns that plan."""
        with quiet_compiler():
            plan = learner.build(sums)
        algorithm, buffer = learner.algorithm, learner.buffer
        plan = settle_action_stream(plan, algorithm.exploration_noise_size(),
                                    type(algorithm.actor).__name__)
        self.act_with(policy_pipe(algorithm, plan, self.envs.num_envs, buffer.observation_size,
                                  self.envs.single_action_space, staged=staged_actor,
                                  normalizer=buffer.normalizer))
        return plan

    def act_with(self, policy: ActionPipe) -> None:
        """Let ``policy`` choose the actions of steps that explore."""
        self.policy = policy

    def step(self, global_step: int, *, explore: bool, update: Callable[[], None] | None
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One step of every env, with the policy's actions when ``explore`` (and a policy is
        set), else uniform random ones; ``update`` runs meanwhile. Returns the step's
        rewards, terminations and truncations; the transition is stored by the next step (or
        :meth:`flush`). ``global_step``: the env steps so far, for warnings."""
        acting = explore and self.policy is not None
        unsafe = None
        if acting:
            # Envs whose observation is not finite: the policy sees zeros there, and their
            # actions are replaced by random ones (see policy_inputs).
            safe, unsafe = policy_inputs(self.observations)
            self.policy.request(safe)
        self.flush(global_step)
        if update is not None and not self._stepper.asynchronous:
            update()
        if acting:
            with self._waiting():
                actions, env_actions = self.policy.wait()
            if unsafe is not None:
                random_actions_for(unsafe, actions, env_actions, self._low, self._high)
        else:
            actions = np.random.uniform(-1.0, 1.0, self._random_shape)
            env_actions = scale_action(actions, self._low, self._high)
        self._stepper.start(env_actions)
        if update is not None and self._stepper.asynchronous:
            update()
        next_observations, rewards, terminations, truncations, infos = self._stepper.finish()
        self._pending = (self.observations, actions, rewards,
                         true_next_observations(next_observations, infos), terminations)
        self._truncations = truncations
        if self.buffer.normalizer is not None:
            self._count_observations(*self._pending[:4])
        self.observations = next_observations
        return rewards, terminations, truncations

    def _count_observations(self, observations: np.ndarray, actions: np.ndarray,
                            rewards: np.ndarray, next_observations: np.ndarray) -> None:
        """--obs-norm: count the observations of this step's transitions (those the tally
        will store: a non-finite one never counts) into the statistics, and upload them.

        Here, as the transition is made, not where it is stored: a checkpoint stores the last
        transition early (:meth:`flush`), and statistics that changed with it would give a
        resumed run's next action other inputs than the uninterrupted run's. On CUDA the
        upload is queued on the updates' stream (the ring write's), after this step's update
        and before the next step's action and update: the next update reads statistics that
        count every row its sample can draw, and an action in line reads them too; an action
        on its own stream reads them one round later, staged with the actor."""
        finite = finite_mask(observations, actions, rewards, next_observations)
        normalizer = self.buffer.normalizer
        assert normalizer is not None
        normalizer.update(observations, finite)

    @property
    def in_env_step(self) -> bool:
        """Whether the envs are stepping in this process now (in their own code)."""
        return self._stepper.in_env_step

    def flush(self, global_step: int) -> None:
        """Store the last step's transition now (before a checkpoint, say)."""
        if self._pending is not None:
            if self.nstep is not None:
                self._store_nstep(global_step)
            elif self.seed_tallies:
                store_seeds(self.seed_tallies, self.buffer, global_step, *self._pending)
            else:
                self.tally.store(self.buffer, global_step, *self._pending)
            self._pending = None

    def _store_nstep(self, global_step: int) -> None:
        """Push the pending transition into the n-step windows; store one add of the rows
        they have ready (non-finite transitions counted, and left out of every window)."""
        assert self.nstep is not None and self._pending is not None
        observations, actions, rewards, next_observations, terminations = self._pending
        finite = finite_transitions(self.seed_tallies or [self.tally], global_step,
                                    *self._pending[:4])
        self.nstep.push(observations, actions, rewards, next_observations, terminations,
                        self._truncations, finite)
        rows = self.nstep.take()
        if rows is not None:
            self.buffer.add(rows.observations, rows.actions, rows.rewards,
                            rows.next_observations, None, not_dones=rows.not_dones,
                            keep=rows.keep)

    def unstored_nonfinite(self) -> int:
        """The non-finite rows of the transition not stored yet (see :meth:`step`)."""
        return self.tally.count(self._pending)

    def checkpoint_due(self, step: int, every: int) -> bool:
        """Whether the loop saves after ``step`` (each env's steps): every ``every`` of them,
        an iteration stepping each env of a seed once."""
        return step % every < self.envs_per_seed

    def stop_note(self) -> str:
        """What a stop's line adds about this collector's state: nothing is lost here."""
        return ""

    def updates_due(self, step: int, cfg: Config) -> bool:
        """Whether a run at ``step`` was due to have updated: it stepped past
        ``learning_starts``."""
        return step > cfg.learning_starts

    def stored(self) -> int:
        """The replay buffer's rows (a group's least filled seed's), which decide whether it
        holds a batch."""
        return len(self.buffer)

    @contextlib.contextmanager
    def _waiting(self) -> Iterator[None]:
        began = time.perf_counter()
        yield
        self.waited += time.perf_counter() - began
        self.waits += 1
