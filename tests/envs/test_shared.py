"""The shared-memory vector env: the same transitions as gymnasium's SyncVectorEnv (SAME_STEP
autoreset, final observations included) whatever the split of envs over workers, one clear
line when an env fails or a worker dies, and no worker left after close."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode
from processtools import Children

import rl_graphstep.envs.shared as sharedenvs
from rl_graphstep.core.errors import EnvError
from rl_graphstep.envs.shared import SharedMemoryVectorEnv
from rl_graphstep.envs.vector import make_vec_env


def sync(env_id: str, num_envs: int) -> gym.vector.VectorEnv:
    return gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync",
                        vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP})


@pytest.fixture
def closing() -> Iterator[list[gym.vector.VectorEnv]]:
    made: list[gym.vector.VectorEnv] = []
    yield made
    for envs in made:
        envs.close()


@pytest.mark.parametrize(("env_id", "num_envs", "workers", "steps"), [
    ("Pendulum-v1", 3, 2, 450),  # time-limit truncations at 200 steps, 2 + 1 envs per worker
    ("CartPole-v1", 5, 2, 300),  # many terminations under random actions
    ("CartPole-v1", 2, 4, 100),  # more workers asked for than envs: one env each
])
def test_the_same_transitions_as_the_sync_vector_env(env_id: str, num_envs: int,
                                                     workers: int, steps: int,
                                                     closing: list) -> None:
    shared = SharedMemoryVectorEnv(env_id, num_envs, workers=workers)
    reference = sync(env_id, num_envs)
    closing += [shared, reference]
    assert len(shared._processes) == min(workers, num_envs)
    first, _ = shared.reset(seed=7)
    np.testing.assert_array_equal(first, reference.reset(seed=7)[0])
    reference.action_space.seed(1)
    ended = 0
    for step in range(steps):
        actions = reference.action_space.sample()
        got, want = shared.step(actions), reference.step(actions)
        for mine, theirs in zip(got[:4], want[:4], strict=True):
            np.testing.assert_array_equal(mine, theirs, err_msg=f"step {step}")
        assert ("_final_obs" in got[4]) == ("_final_obs" in want[4])
        if "_final_obs" in want[4]:
            ended += 1
            np.testing.assert_array_equal(got[4]["_final_obs"], want[4]["_final_obs"])
            for index in np.flatnonzero(want[4]["_final_obs"]):
                np.testing.assert_array_equal(got[4]["final_obs"][index],
                                              want[4]["final_obs"][index])
    assert ended > 0  # the comparison went through autoresets


def test_by_default_a_worker_per_usable_cpu_but_one(closing: list,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPUs the process may run on (its affinity), as ``--vec-env auto`` counts them; a
    run's own count (``train(cpus=...)``) reaches the env through ``make_vec_env``."""
    monkeypatch.setattr(sharedenvs, "usable_cpus", lambda: 3)
    shared = SharedMemoryVectorEnv("Pendulum-v1", 4)
    closing.append(shared)
    assert len(shared._processes) == 2
    budgeted = make_vec_env("Pendulum-v1", num_envs=4, seed=0, kind="shared", workers=3)
    closing.append(budgeted)
    assert len(budgeted.unwrapped._processes) == 3


def test_results_are_copies_the_next_step_does_not_rewrite(closing: list) -> None:
    shared = SharedMemoryVectorEnv("Pendulum-v1", 2, workers=1)
    closing.append(shared)
    shared.reset(seed=0)
    observations, rewards, *_ = shared.step(np.ones((2, 1), np.float32))
    kept = observations.copy(), rewards.copy()
    shared.step(-np.ones((2, 1), np.float32))
    np.testing.assert_array_equal(observations, kept[0])
    np.testing.assert_array_equal(rewards, kept[1])


class FailingStep(gym.Env):
    """Pendulum-shaped; its third step raises."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.steps = 0
        return np.zeros(3, np.float32), {}

    def step(self, action):
        self.steps += 1
        if self.steps == 3:
            raise ValueError("the simulator blew up")
        return np.zeros(3, np.float32), 0.0, False, False, {}


gym.register("FailingStepForSharedEnvs-v0", entry_point=FailingStep)


def test_an_env_that_raises_is_one_line(closing: list) -> None:
    # fork: the worker inherits this module's registration
    shared = SharedMemoryVectorEnv("FailingStepForSharedEnvs-v0", 2, workers=2, context="fork")
    closing.append(shared)
    shared.reset(seed=0)
    actions = np.zeros((2, 1), np.float32)
    shared.step(actions)
    shared.step(actions)
    with pytest.raises(EnvError, match=r"^the environment's step raised ValueError: the "
                                       r"simulator blew up \(at tests/envs/test_shared.py:\d+\)$"):
        shared.step(actions)


class FailingSecondMake(FailingStep):
    """Made fine once (the main process's probe), raises when a worker makes it."""

    made = 0

    def __init__(self) -> None:
        type(self).made += 1
        if type(self).made > 1:
            raise RuntimeError("no license for a second copy")


gym.register("FailingSecondMakeForSharedEnvs-v0", entry_point=FailingSecondMake)


def test_a_worker_that_cannot_make_its_env_is_one_line(closing: list,
                                                        capfd: pytest.CaptureFixture) -> None:
    shared = SharedMemoryVectorEnv("FailingSecondMakeForSharedEnvs-v0", 1, workers=1,
                                   context="fork")
    closing.append(shared)
    # The line the main process gives for an env it cannot make (make_env's, in both).
    with pytest.raises(EnvError, match=r"^environment 'FailingSecondMakeForSharedEnvs-v0' could "
                                       r"not be made: RuntimeError: no license for a second "
                                       r"copy \(at tests/envs/test_shared"):
        shared.reset(seed=0)
    assert "Traceback" not in capfd.readouterr().err


def test_a_worker_that_dies_is_named(closing: list) -> None:
    shared = SharedMemoryVectorEnv("Pendulum-v1", 3, workers=2)
    closing.append(shared)
    shared.reset(seed=0)
    os.kill(shared._processes[1].pid, signal.SIGKILL)
    shared._processes[1].join(timeout=5)
    with pytest.raises(EnvError, match=r"^env worker 1 \(envs 2-2\) stopped with exit code -9 "
                                       r"during the envs' step$"):
        shared.step(np.zeros((3, 1), np.float32))


def test_close_stops_every_worker() -> None:
    shared = SharedMemoryVectorEnv("Pendulum-v1", 4, workers=3)
    shared.reset(seed=0)
    shared.step(np.zeros((4, 1), np.float32))
    processes = list(shared._processes)
    shared.close()
    shared.close()  # twice is fine
    assert not any(process.is_alive() for process in processes)


def test_an_idle_worker_sleeps_instead_of_spinning(closing: list) -> None:
    shared = SharedMemoryVectorEnv("Pendulum-v1", 1, workers=1)
    closing.append(shared)
    shared.reset(seed=0)
    pid = shared._processes[0].pid
    time.sleep(0.1)  # past the spin
    before = _cpu_seconds(pid)
    time.sleep(0.5)
    assert _cpu_seconds(pid) - before < 0.25  # a spinning worker would burn ~0.5 s


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_it_does_not_pickle() -> None:
    import cloudpickle

    shared = SharedMemoryVectorEnv("Pendulum-v1", 1, workers=1)
    try:
        with pytest.raises(TypeError, match="do not pickle"):
            cloudpickle.dumps(shared)
    finally:
        shared.close()


def test_workers_exit_when_the_training_process_is_killed(tmp_path: Path,
                                                          children: Children) -> None:
    import subprocess

    script = tmp_path / "owner.py"
    script.write_text(
        "import time\n"
        "from rl_graphstep.envs.shared import SharedMemoryVectorEnv\n"
        "envs = SharedMemoryVectorEnv('Pendulum-v1', 2, workers=2)\n"
        "envs.reset(seed=0)\n"
        "print(*(p.pid for p in envs._processes), flush=True)\n"
        "time.sleep(60)\n")
    owner = children.python(str(script), stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
    assert owner.stdout is not None
    workers = [int(pid) for pid in owner.stdout.readline().split()]
    owner.kill()  # SIGKILL, the owner alone; the test's end kills its group (children)
    owner.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_running(pid) for pid in workers):
        time.sleep(0.05)
    assert not any(_running(pid) for pid in workers)


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, exited but not yet reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_it_is_refused_off_x86_64(monkeypatch: pytest.MonkeyPatch) -> None:
    import platform

    from rl_graphstep.core.errors import ConfigError

    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    with pytest.raises(ConfigError, match=r"^--vec-env shared needs an x86-64 host .* this one "
                                          r"is aarch64: use --vec-env async or sync$"):
        SharedMemoryVectorEnv("Pendulum-v1", 2)
