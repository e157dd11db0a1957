"""The collector: the order of a step (request, store, update, wait, step; with envs in
subprocesses the update runs while they step), random actions before a policy, when
transitions are stored, and random actions for envs whose observation is not finite."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from rl_graphstep.data.buffer import ReplayBuffer
from rl_graphstep.envs.vector import first_reset, make_vec_env, scale_action
from rl_graphstep.run.collector import Collector
from rl_graphstep.run.nonfinite import NonFiniteTally

LOW, HIGH = np.array([-2.0], np.float32), np.array([2.0], np.float32)  # Pendulum's torque


class LoggingPipe:
    """A policy pipe that acts ``value`` and notes each request and wait in ``log``."""

    def __init__(self, log: list[str], value: float = 0.5) -> None:
        self.log, self.value = log, value
        self.requested: list[np.ndarray] = []

    def request(self, observations: np.ndarray) -> None:
        self.log.append("request")
        self.requested.append(np.array(observations, copy=True))

    def wait(self) -> tuple[np.ndarray, np.ndarray]:
        self.log.append("wait")
        actions = np.full((len(self.requested[-1]), 1), self.value, np.float32)
        return actions, scale_action(actions, LOW, HIGH)


class LoggingTally(NonFiniteTally):
    def __init__(self, log: list[str]) -> None:
        super().__init__("Pendulum-v1")
        self.log = log

    def store(self, *args: object) -> None:
        self.log.append("store")
        super().store(*args)


@pytest.fixture(params=["sync", "async", "shared"])
def collector(request: pytest.FixtureRequest) -> Iterator[tuple[Collector, list[str]]]:
    envs = make_vec_env("Pendulum-v1", num_envs=2, seed=3, kind=request.param)
    log: list[str] = []
    made = Collector(envs, first_reset(envs, 3), ReplayBuffer(100, 3, 1, "cpu"),
                     LoggingTally(log))
    start, finish = made._stepper.start, made._stepper.finish
    made._stepper.start = lambda actions: log.append("step") or start(actions)
    made._stepper.finish = lambda: log.append("finish") or finish()
    try:
        yield made, log
    finally:
        envs.close()


def test_a_step_queues_the_action_before_the_update_and_steps_after_it(
        collector: tuple[Collector, list[str]]) -> None:
    made, log = collector
    made.act_with(LoggingPipe(log))
    for _ in range(2):
        made.step(0, explore=True, update=lambda: log.append("update"))
    if made._stepper.asynchronous:  # the envs step in their subprocesses meanwhile
        order = ["request", "wait", "step", "update", "finish"]
        assert log == [*order, "request", "store", *order[1:]]
    else:
        order = ["request", "update", "wait", "step", "finish"]
        assert log == [*order, "request", "store", *order[1:]]
    assert made.waits == 2 and made.waited >= 0


def test_the_transition_is_stored_by_the_next_step_or_a_flush() -> None:
    envs = make_vec_env("Pendulum-v1", num_envs=2, seed=0)
    buffer = ReplayBuffer(100, 3, 1, "cpu")
    observations = first_reset(envs, 0)
    made = Collector(envs, observations, buffer, NonFiniteTally("Pendulum-v1"))
    log: list[str] = []
    made.act_with(LoggingPipe(log, value=0.25))
    rewards, terminations, truncations = made.step(0, explore=True, update=None)
    assert rewards.shape == terminations.shape == truncations.shape == (2,)
    assert len(buffer) == 0  # stored while the next action is computed
    next_observations = made.observations
    made.flush(2)
    made.flush(2)  # nothing left to store
    assert len(buffer) == 2
    layout = buffer.layout
    np.testing.assert_array_equal(buffer.storage[:2, layout.observations].numpy(), observations)
    np.testing.assert_array_equal(buffer.storage[:2, layout.actions].numpy(), [[0.25], [0.25]])
    np.testing.assert_allclose(buffer.storage[:2, layout.rewards].numpy()[:, 0], rewards)
    np.testing.assert_allclose(buffer.storage[:2, layout.next_observations].numpy(),
                               next_observations)
    made.step(2, explore=True, update=None)
    made.step(4, explore=True, update=None)
    assert len(buffer) == 4
    envs.close()


@pytest.mark.parametrize("policy", [False, True], ids=["no policy", "warm-up"])
def test_random_actions_before_a_policy_or_while_not_exploring(policy: bool) -> None:
    envs = make_vec_env("Pendulum-v1", num_envs=2, seed=0)
    buffer = ReplayBuffer(100, 3, 1, "cpu")
    made = Collector(envs, first_reset(envs, 0), buffer, NonFiniteTally("Pendulum-v1"))
    log: list[str] = []
    if policy:
        made.act_with(LoggingPipe(log))
    np.random.seed(4)
    made.step(0, explore=not policy, update=None)
    made.flush(2)
    np.random.seed(4)
    expected = np.random.uniform(-1.0, 1.0, (2, 1))
    np.testing.assert_allclose(buffer.storage[:2, buffer.layout.actions].numpy(), expected,
                               rtol=1e-6)
    assert log == [] and made.waits == 0  # the policy was not asked
    envs.close()


def test_envs_whose_observation_is_not_finite_act_randomly() -> None:
    envs = make_vec_env("Pendulum-v1", num_envs=2, seed=0)
    buffer = ReplayBuffer(100, 3, 1, "cpu")
    observations = first_reset(envs, 0)
    observations[1, 0] = np.nan
    tally = NonFiniteTally("Pendulum-v1")
    made = Collector(envs, observations, buffer, tally)
    pipe = LoggingPipe([], value=0.5)
    made.act_with(pipe)
    np.random.seed(6)
    made.step(0, explore=True, update=None)
    np.testing.assert_array_equal(pipe.requested[0][1], np.zeros(3))  # the policy saw zeros
    np.testing.assert_array_equal(pipe.requested[0][0], observations[0])
    assert made.unstored_nonfinite() == 1
    with pytest.warns(UserWarning, match="returned a non-finite observation"):
        made.flush(2)
    assert tally.transitions == 1 and made.unstored_nonfinite() == 0
    # The finite env's row is held until a full batch of num_envs rows is ready.
    made.step(2, explore=True, update=None)
    made.flush(4)
    assert len(buffer) == 2
    stored = buffer.storage[:2, buffer.layout.actions].numpy()
    np.testing.assert_array_equal(stored, [[0.5], [0.5]])  # env 0's two steps
    envs.close()


def test_a_non_finite_observation_gets_a_random_action_in_place_of_the_policy_s(
        monkeypatch: pytest.MonkeyPatch) -> None:
    envs = make_vec_env("Pendulum-v1", num_envs=2, seed=0)
    observations = first_reset(envs, 0)
    observations[0, 2] = np.inf
    made = Collector(envs, observations, ReplayBuffer(100, 3, 1, "cpu"),
                     NonFiniteTally("Pendulum-v1"))
    made.act_with(LoggingPipe([], value=0.5))
    handed: list[np.ndarray] = []
    start = made._stepper.start
    monkeypatch.setattr(made._stepper, "start", lambda a: handed.append(a.copy()) or start(a))
    np.random.seed(8)
    made.step(0, explore=True, update=None)
    np.random.seed(8)
    random = np.random.uniform(-1.0, 1.0, (1, 1))
    np.testing.assert_allclose(handed[0], [scale_action(random, LOW, HIGH)[0], [1.0]],
                               rtol=1e-6)
    envs.close()


@pytest.mark.parametrize("seeds", [1, 2])
def test_obs_norm_counts_each_steps_finite_observations(seeds: int) -> None:
    """--obs-norm: the collector counts the observations of every step's transitions into
    each seed's statistics as it makes them, leaving out those the tally drops (an env's
    observation is inf every 7th of its steps here), and the ring keeps them raw."""
    import math

    from fakes import register_poisoned

    from rl_graphstep.data.normalizer import ObservationNormalizer

    env_id = register_poisoned(f"ObsNormInf{seeds}", "observation", math.inf, every=7)
    envs = make_vec_env(env_id, num_envs=2 * seeds, seed=3, kind="sync")
    normalizer = ObservationNormalizer(seeds, 3, "cpu")
    buffer = ReplayBuffer(100, 3, 1, "cpu", seeds=seeds, normalizer=normalizer)
    tallies = [NonFiniteTally(env_id, seed=s) for s in range(seeds)]
    collector = Collector(envs, first_reset(envs, 3), buffer, tallies[0],
                          seed_tallies=tallies if seeds > 1 else ())
    counted: list[list[np.ndarray]] = [[] for _ in range(seeds)]
    try:
        with pytest.warns(UserWarning, match="non-finite (next )?observation"):
            for step in range(30):
                collector.step(step, explore=False, update=None)
                observations, _, _, next_observations, _ = collector._pending
                finite = np.isfinite(observations).all(1) & np.isfinite(next_observations).all(1)
                for k in range(seeds):
                    rows = slice(2 * k, 2 * k + 2)
                    counted[k].append(observations[rows][finite[rows]])
            collector.flush(30)
    finally:
        envs.close()
    expected = [np.concatenate(rows).astype(np.float64) for rows in counted]
    assert normalizer.count.tolist() == [len(rows) for rows in expected]
    assert all(len(rows) < 60 for rows in expected)  # some were dropped
    np.testing.assert_allclose(normalizer.mean, [rows.mean(0) for rows in expected], rtol=1e-12)
    np.testing.assert_allclose(normalizer.var, [rows.var(0) for rows in expected], rtol=1e-12)
    ring = buffer.storage if seeds > 1 else buffer.storage[None]
    assert np.abs(ring[:, :8, 2].numpy()).max() > 1.5  # raw angular velocities in the ring


def test_learning_is_due_once_past_learning_starts_with_a_batch_stored() -> None:
    """2 envs, --learning-starts 4, --batch-size 4: the iteration at step 2 (it ends at
    step 4) is not past learning_starts; the one at step 4 is, and its check first stores
    the last transition (rows 3 and 4), so it finds a batch.
    The summary's counterpart: updates were due past learning_starts; the rows stored are the
    buffer's (the transition of step 4's iteration waits for the next step)."""
    from rl_graphstep.settings.config import Config

    cfg = Config(env_id="Pendulum-v1", num_envs=2, learning_starts=4, batch_size=4)
    envs = make_vec_env("Pendulum-v1", num_envs=2, seed=0)
    buffer = ReplayBuffer(100, 3, 1, "cpu")
    made = Collector(envs, first_reset(envs, 0), buffer, NonFiniteTally("Pendulum-v1"))
    try:
        for step in (0, 2, 4):
            assert made.learning_due(step, cfg) == (step == 4), step
            made.step(step, explore=False, update=None)
        assert len(buffer) == 4 and made.stored() == 4
        assert [made.updates_due(step, cfg) for step in (4, 6)] == [False, True]
    finally:
        envs.close()
