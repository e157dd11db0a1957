"""The env worker: the same steps as the in-process env, its errors, its state."""

from __future__ import annotations

import pickle

import gymnasium as gym
import numpy as np
import pytest

from rl_graphstep.config import load_config
from rl_graphstep.envs import EnvStepper, make_vec_env, true_next_observations
from rl_graphstep.envworker import EnvWorker
from rl_graphstep.errors import ConfigError, EnvError


class FailingEnv(gym.Env):
    """Pendulum-shaped; its fourth step raises."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.steps = 0
        return np.zeros(3, np.float32), {}

    def step(self, action: np.ndarray):
        self.steps += 1
        if self.steps == 4:
            raise ValueError("the simulator diverged")
        return np.full(3, self.steps, np.float32), 1.0, False, False, {}


gym.register("FailingForTests-v0", entry_point=FailingEnv)


def test_steps_match_the_in_process_env_episode_ends_included() -> None:
    """Pendulum truncates at 200 steps: 450 steps cross two episode ends in each env."""
    local = make_vec_env("Pendulum-v1", num_envs=2, seed=7)
    worker = EnvWorker(make_vec_env("Pendulum-v1", num_envs=2, seed=7))
    try:
        np.testing.assert_array_equal(local.reset(seed=7)[0], worker.reset(seed=7)[0])
        rng = np.random.default_rng(0)
        ends = 0
        for _ in range(450):
            actions = rng.uniform(-2, 2, (2, 1))
            expected = local.step(actions)
            got = worker.step(actions)
            for e, g in zip(expected[:4], got[:4], strict=True):
                np.testing.assert_array_equal(e, g)
                assert e.dtype == g.dtype
            np.testing.assert_array_equal(true_next_observations(expected[0], expected[4]),
                                          true_next_observations(got[0], got[4]))
            ends += int(got[3].sum())
        assert ends == 4
    finally:
        worker.close()
        local.close()


def test_the_stepper_hands_over_and_collects() -> None:
    worker = EnvWorker(make_vec_env("Pendulum-v1", num_envs=1, seed=0))
    stepper = EnvStepper(worker)
    assert stepper.asynchronous
    worker.reset(seed=0)
    stepper.start(np.zeros((1, 1)))
    with pytest.raises(RuntimeError, match="start\\(\\) twice without finish\\(\\)"):
        stepper.start(np.zeros((1, 1)))
    observations, rewards, *_ = stepper.finish()
    assert observations.shape == (1, 3) and rewards.shape == (1,)
    with pytest.raises(RuntimeError, match="finish\\(\\) without start\\(\\)"):
        stepper.finish()
    worker.close()


def test_an_env_error_in_the_worker_is_raised_here() -> None:
    envs = gym.make_vec("FailingForTests-v0", num_envs=1, vectorization_mode="sync")
    worker = EnvWorker(envs)
    worker.reset(seed=0)
    for _ in range(3):
        worker.step(np.zeros((1, 1)))
    with pytest.raises(EnvError, match="the environment failed in its worker process during "
                                       "step: ValueError: the simulator diverged"):
        worker.step(np.zeros((1, 1)))
    worker.close()


def test_a_dead_worker_is_an_env_error() -> None:
    worker = EnvWorker(make_vec_env("Pendulum-v1", num_envs=1, seed=0))
    worker.reset(seed=0)
    worker._process.kill()
    worker._process.join()
    with pytest.raises(EnvError, match="the environment worker process died during step"):
        worker.step(np.zeros((1, 1)))
    worker.close()


def test_its_state_is_the_envs_state() -> None:
    """state() pickles the envs as the worker holds them: the restored copy steps on alike."""
    worker = EnvWorker(make_vec_env("Pendulum-v1", num_envs=1, seed=2))
    worker.reset(seed=2)
    for _ in range(5):
        worker.step(np.ones((1, 1)))
    restored = pickle.loads(worker.state())
    actions = np.full((1, 1), -0.5)
    np.testing.assert_array_equal(restored.step(actions)[0], worker.step(actions)[0])
    worker.close()
    assert not worker._process.is_alive()


def test_it_cannot_be_combined_with_gymnasiums_subprocesses() -> None:
    with pytest.raises(ConfigError, match="--env-worker and --async-envs both step the "
                                          "environments in other processes; pick one"):
        load_config(["--env", "Pendulum-v1", "--env-worker", "--async-envs"])


def test_the_worker_ends_when_its_parent_is_killed() -> None:
    """A parent killed outright (no close, no atexit) leaves no worker behind."""
    import os
    import signal
    import subprocess
    import sys
    import time

    script = ("import os, signal, numpy as np\n"
              "from rl_graphstep.envs import make_vec_env\n"
              "from rl_graphstep.envworker import EnvWorker\n"
              "w = EnvWorker(make_vec_env('Pendulum-v1', num_envs=1, seed=0))\n"
              "w.reset(seed=0); w.step(np.zeros((1, 1)))\n"
              "print(w._process.pid, flush=True)\n"
              "os.kill(os.getpid(), signal.SIGKILL)\n")
    parent = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=60)
    assert parent.returncode == -signal.SIGKILL, parent.stderr
    worker = int(parent.stdout.split()[0])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(worker, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(worker, signal.SIGKILL)
    raise AssertionError("the env worker outlived its killed parent by 10 s")
