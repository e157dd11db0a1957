"""Tests for env construction, space checks, SAME_STEP final observations and action scaling."""

from __future__ import annotations

import importlib.util
import os
import random
import signal
import sys
import time
from pathlib import Path

import fakes  # noqa: F401 (registers IntActions-v0 and NoActions-v0)
import gymnasium as gym
import numpy as np
import pytest
import torch
from processtools import run_python

from rl_graphstep import train
from rl_graphstep.core.errors import ConfigError, EnvError
from rl_graphstep.envs.vector import (
    EnvStepper,
    EpisodeStatistics,
    OneEnvVector,
    check_continuous_spaces,
    make_vec_env,
    scale_action,
    seed_everything,
    true_next_observations,
)
from rl_graphstep.evaluate import evaluate


def test_pendulum_vec_env_spaces() -> None:
    envs = make_vec_env("Pendulum-v1", num_envs=3, seed=1)
    try:
        assert envs.num_envs == 3
        assert envs.single_observation_space.shape == (3,)
        assert envs.single_action_space.shape == (1,)
        assert envs.observation_space.shape == (3, 3)
        np.testing.assert_array_equal(envs.single_action_space.low, [-2.0])
        np.testing.assert_array_equal(envs.single_action_space.high, [2.0])
        assert envs.metadata["autoreset_mode"] == gym.vector.AutoresetMode.SAME_STEP
        check_continuous_spaces(
            "Pendulum-v1", envs.single_observation_space, envs.single_action_space
        )
        observations, _ = envs.reset(seed=1)
        assert observations.shape == (3, 3)
    finally:
        envs.close()


def test_same_seed_same_rollout() -> None:
    def rollout() -> np.ndarray:
        envs = make_vec_env("Pendulum-v1", num_envs=2, seed=7)
        observations, _ = envs.reset(seed=7)
        trace = [observations]
        for _ in range(5):
            observations, *_ = envs.step(envs.action_space.sample())
            trace.append(observations)
        envs.close()
        return np.stack(trace)

    np.testing.assert_array_equal(rollout(), rollout())


@pytest.mark.parametrize("env_id", ["Pendulum-v1", "HalfCheetah-v5"])
def test_one_env_steps_exactly_as_gymnasiums_sync_vector_env(env_id: str) -> None:
    """Observations, rewards, end flags and final observations to the bit, over episode ends
    (Pendulum's 200-step and HalfCheetah's 1000-step time limits); the infos hold the final
    observation where an episode ended and nothing else, as the shared env's do."""
    if env_id == "HalfCheetah-v5" and importlib.util.find_spec("mujoco") is None:
        pytest.skip("needs MuJoCo")
    ours = make_vec_env(env_id, num_envs=1, seed=3)
    theirs = gym.make_vec(env_id, num_envs=1, vectorization_mode="sync",
                          vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})
    assert isinstance(ours, OneEnvVector) and type(theirs) is gym.vector.SyncVectorEnv
    for envs in (ours, theirs):
        envs.action_space.seed(3)
    np.testing.assert_array_equal(ours.reset(seed=3)[0], theirs.reset(seed=3)[0])
    ends = 0
    for _ in range(2100 if env_id == "HalfCheetah-v5" else 450):
        actions = ours.action_space.sample()
        assert np.array_equal(actions, theirs.action_space.sample())
        got, want = ours.step(actions), theirs.step(actions)
        for mine, reference in zip(got[:4], want[:4], strict=True):
            assert mine.dtype == reference.dtype and mine.shape == reference.shape
            np.testing.assert_array_equal(mine, reference)
        if "_final_obs" in want[4]:
            ends += 1
            assert got[4].keys() == {"final_obs", "_final_obs"}
            np.testing.assert_array_equal(got[4]["_final_obs"], want[4]["_final_obs"])
            np.testing.assert_array_equal(got[4]["final_obs"][0], want[4]["final_obs"][0])
            assert got[4]["final_obs"][0].dtype == want[4]["final_obs"][0].dtype
        else:
            assert got[4] == {}
    assert ends == 2
    ours.close()
    theirs.close()


def test_unknown_env_suggests_close_match() -> None:
    with pytest.raises(EnvError) as info:
        make_vec_env("Pendulm-v1", seed=0)
    assert str(info.value) == (
        "unknown environment 'Pendulm-v1'; did you mean Pendulum-v1? "
        "(see gymnasium.envs.registry for the list)"
    )


@pytest.mark.parametrize("env_id", ["pendulum-v1", "Pendulum-v9", "Foo/Pendulum-v1"])
def test_unknown_env_variants(env_id: str) -> None:
    with pytest.raises(EnvError, match=f"unknown environment '{env_id}'; did you mean Pendulum-v1"):
        make_vec_env(env_id, seed=0)


def test_unknown_env_without_close_match() -> None:
    with pytest.raises(EnvError, match="no registered environment has a similar name"):
        make_vec_env("Zzzqqq-v0", seed=0)


@pytest.mark.parametrize(("env_id", "hint"), [
    ("fakes:breaks_nne-v0", "did you mean fakes:Breaks_none-v0?"),
    ("fakes:Zzzqqq-v0", "no environment of a similar name is registered, with 'fakes' "
                        "imported"),
    ("Zzzqqq-v0", "no registered environment has a similar name; an environment your own "
                  "module registers is given as module:EnvId"),
])
def test_unknown_env_of_a_module_suggests_the_module_form(env_id: str, hint: str) -> None:
    """The suggestion is what to pass: with the module, whose import registers the id."""
    with pytest.raises(EnvError) as info:
        make_vec_env(env_id, seed=0)
    assert str(info.value) == (f"unknown environment '{env_id}'; {hint} (see "
                               "gymnasium.envs.registry for the list)")


def test_missing_mujoco_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    # Not installed, as far as gymnasium's MuJoCo envs can tell, whether or not it is here:
    # `import mujoco` fails, and those envs' modules are imported afresh (and put back after).
    monkeypatch.setitem(sys.modules, "mujoco", None)
    for name in [m for m in sys.modules if m.startswith("gymnasium.envs.mujoco")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(EnvError, match=r'pip install "rl_graphstep\[mujoco\]"'):
        make_vec_env("HalfCheetah-v5", seed=0)


def test_num_envs_below_one() -> None:
    with pytest.raises(ConfigError, match="num_envs must be at least 1, got 0"):
        make_vec_env("Pendulum-v1", num_envs=0, seed=0)


def test_discrete_action_space_message() -> None:
    env = gym.make("CartPole-v1")
    with pytest.raises(EnvError) as info:
        check_continuous_spaces("CartPole-v1", env.observation_space, env.action_space)
    assert str(info.value) == ("SAC needs a continuous action space; CartPole-v1 has "
                               "Discrete(2) (--algo ppo takes discrete actions)")


def test_dict_observation_space_message() -> None:
    observation_space = gym.spaces.Dict({"position": gym.spaces.Box(-1, 1, (2,))})
    action_space = gym.spaces.Box(-1, 1, (2,))
    with pytest.raises(EnvError) as info:
        check_continuous_spaces("Maze-v0", observation_space, action_space, algo="td3")
    message = str(info.value)
    assert message.startswith("TD3 needs a flat Box observation space; Maze-v0 has Dict(")
    assert "gymnasium.wrappers.FlattenObservation" in message
    assert "\n" not in message


def test_image_observation_and_unbounded_action_are_rejected() -> None:
    flat = gym.spaces.Box(-1, 1, (4,))
    image = gym.spaces.Box(0, 255, (8, 8, 3), np.uint8)
    with pytest.raises(EnvError, match="flat Box observation space; Img-v0 has Box"):
        check_continuous_spaces("Img-v0", image, flat)
    unbounded = gym.spaces.Box(-np.inf, np.inf, (2,))
    with pytest.raises(EnvError, match="finite bounds"):
        check_continuous_spaces("Free-v0", flat, unbounded)


def test_an_int_action_space_is_refused_naming_the_env_and_the_space() -> None:
    """The policy's actions are floats: an int env would get values outside its space."""
    flat = gym.spaces.Box(-1, 1, (4,))
    with pytest.raises(EnvError) as info:
        check_continuous_spaces("Grid-v0", flat, gym.spaces.Box(-5, 5, (2,), np.int64),
                                algo="td3")
    assert str(info.value) == (
        "TD3 needs a float Box action space (SAC, TD3 and DDPG choose real-valued actions); "
        "Grid-v0 has Box(-5, 5, (2,), int64): declare a float32 Box and round the actions in "
        "the environment")
    check_continuous_spaces("Half-v0", flat, gym.spaces.Box(-1, 1, (2,), np.float16))


@pytest.mark.parametrize(("observation_space", "action_space", "message"), [
    (gym.spaces.Box(-1, 1, (4,)), gym.spaces.Box(-1, 1, (0,)),
     "SAC needs an action space of at least one entry; Odd-v0 has Box([], [], (0,), float32)"),
    (gym.spaces.Box(-1, 1, (0,)), gym.spaces.Box(-1, 1, (2,)),
     "SAC needs an observation space of at least one entry; Odd-v0 has Box([], [], (0,), "
     "float32)"),
    # Finite bounds whose width overflows float32: scaled actions would be inf or nan.
    (gym.spaces.Box(-1, 1, (4,)), gym.spaces.Box(-3e38, 3e38, (1,)),
     "SAC needs action bounds whose width (high - low) is a finite float32; Odd-v0 has "
     "Box(-3e+38, 3e+38, (1,), float32)"),
    # float64 bounds past float32's range: the policy's float32 actions would be inf or nan
    # (they were, from the first policy step on).
    (gym.spaces.Box(-1, 1, (4,)), gym.spaces.Box(-1e300, 1e300, (1,), np.float64),
     "SAC needs action bounds whose width (high - low) is a finite float32; Odd-v0 has "
     "Box(-1e+300, 1e+300, (1,), float64)"),
    (gym.spaces.Box(-1, 1, (4,)), gym.spaces.Box(-6e4, 6e4, (1,), np.float16),
     "SAC needs action bounds whose width (high - low) is a finite float16; Odd-v0 has "
     "Box(-6e+04, 6e+04, (1,), float16)"),
], ids=["no actions", "no observations", "too wide", "past float32", "too wide in float16"])
def test_spaces_the_agent_cannot_act_in_are_refused(observation_space: gym.Space,
                                                    action_space: gym.Space,
                                                    message: str) -> None:
    with pytest.raises(EnvError) as info:
        check_continuous_spaces("Odd-v0", observation_space, action_space)
    assert str(info.value) == message


@pytest.mark.parametrize(("env_id", "message"), [
    ("IntActions-v0", "SAC needs a float Box action space (SAC, TD3 and DDPG choose "
                      "real-valued actions); IntActions-v0 has Box(-5, 5, (2,), int64)"),
    ("NoActions-v0", "SAC needs an action space of at least one entry; NoActions-v0 has "
                     "Box([], [], (0,), float32)"),
])
@pytest.mark.parametrize("vec_env", ["sync", "async", "shared"])
def test_a_run_in_spaces_it_cannot_act_in_is_one_line_before_any_step(
        env_id: str, message: str, vec_env: str, tmp_path: Path,
        capfd: pytest.CaptureFixture[str]) -> None:
    """Before the shared env lays out its memory, and with no async worker left behind to
    print its traceback."""
    code = train.main(["--env", env_id, "--vec-env", vec_env, "--num-envs", "2", "--device",
                       "cpu", "--total-timesteps", "300", "--learning-starts", "100",
                       "--no-progress", "--log-dir", str(tmp_path / "runs")])
    err = capfd.readouterr().err
    assert code == 2 and err.startswith(f"error: {message}") and err.count("\n") == 1, err
    assert not (tmp_path / "runs").exists()


class Sized(gym.Env):
    """Observations of ``size`` zeros; episodes of 50 steps."""

    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def __init__(self, size: int = 3) -> None:
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (size,), np.float32)
        self.t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
        self.t = 0
        return np.zeros(self.observation_space.shape, np.float32), {}

    def step(self, action: np.ndarray) -> tuple:
        self.t += 1
        return (np.zeros(self.observation_space.shape, np.float32), 0.0, False, self.t >= 50,
                {})


@pytest.mark.filterwarnings("ignore:.*Overriding environment Edited-v0")
def test_resume_and_evaluate_of_an_env_edited_since_say_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Said before the networks meet ones built for another env (whose mismatch advised
    resuming with other networks)."""
    gym.register("Edited-v0", entry_point=Sized, kwargs={"size": 3})
    run = tmp_path / "run"
    assert train.main(["--env", "Edited-v0", "--device", "cpu", "--total-timesteps", "300",
                       "--learning-starts", "100", "--batch-size", "32", "--hidden-sizes",
                       "16", "--no-progress", "--log-dir", str(tmp_path), "--run-name",
                       "run"]) == 0
    gym.register("Edited-v0", entry_point=Sized, kwargs={"size": 4})
    capsys.readouterr()
    assert train.main(["--resume", str(run), "--total-timesteps", "400"]) == 2
    space = "Box(-1.0, 1.0, (4,), float32)"
    assert capsys.readouterr().err == (
        f"error: {run} was trained on observations of 3 entries, but Edited-v0's observation "
        f"space is now {space}; resume with the environment it was trained on\n")
    checkpoint = run / "checkpoints" / "step_000000000300.pt"
    with pytest.raises(EnvError) as info:
        evaluate(run, episodes=1, device="cpu", verbose=False)
    assert str(info.value) == (
        f"checkpoint {checkpoint} was trained on observations of 3 entries, but Edited-v0's "
        f"observation space is now {space}; evaluate with the environment it was trained on")


def test_truncation_final_observation_and_episode_statistics() -> None:
    envs = make_vec_env("Pendulum-v1", num_envs=2, seed=3)
    try:
        envs.reset(seed=3)
        rewards_sum = np.zeros(2)
        stats = EpisodeStatistics(2)
        for step in range(1, 201):
            next_obs, rewards, terminations, truncations, infos = envs.step(
                envs.action_space.sample()
            )
            rewards_sum += rewards
            episodes = stats.update(rewards, terminations, truncations)
            real_next = true_next_observations(next_obs, infos)
            if step < 200:
                # Mid-episode the returned observation is the real one and nothing finished.
                assert real_next is next_obs
                assert episodes == []
                assert not truncations.any()
        # Pendulum never terminates; its TimeLimit truncates both copies at step 200.
        assert not terminations.any()
        assert truncations.all()
        final = np.stack(infos["final_obs"])
        np.testing.assert_array_equal(real_next, final)
        assert real_next.dtype == next_obs.dtype
        # The vector env already reset: next_obs starts new episodes, unlike the final obs.
        assert not np.allclose(next_obs, final)
        # The final observation continues the trajectory: its angle (cos, sin) is unit-norm
        # and the reset one is what the buffer must NOT see.
        np.testing.assert_allclose(np.hypot(final[:, 0], final[:, 1]), 1.0, rtol=1e-5)
        assert [(env, length) for env, _, length in episodes] == [(0, 200), (1, 200)]
        np.testing.assert_allclose([ret for _, ret, _ in episodes], rewards_sum, rtol=1e-5)
        assert all(isinstance(r, float) and isinstance(n, int) for _, r, n in episodes)
    finally:
        envs.close()


def test_true_next_observations_only_replaces_finished_envs() -> None:
    next_obs = np.arange(6, dtype=np.float32).reshape(3, 2)
    final_obs = np.array([None, np.array([10.0, 11.0]), None], dtype=object)
    infos = {"final_obs": final_obs, "_final_obs": np.array([False, True, False])}
    real = true_next_observations(next_obs, infos)
    np.testing.assert_array_equal(real, [[0, 1], [10, 11], [4, 5]])
    assert real.dtype == np.float32
    # The env's own array is left untouched.
    np.testing.assert_array_equal(next_obs[1], [2, 3])
    assert true_next_observations(next_obs, {}) is next_obs


def test_seed_everything() -> None:
    seed_everything(5)
    first = (random.random(), np.random.rand(), torch.rand(1).item())
    seed_everything(5)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == first


def test_scale_actions() -> None:
    low = np.array([-2.0, 0.0, 10.0], dtype=np.float32)
    high = np.array([2.0, 1.0, 20.0], dtype=np.float32)
    policy = np.array([[-1.0, -1.0, -1.0], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0], [0.5, -0.5, 0.2]])
    env_actions = scale_action(policy, low, high)
    np.testing.assert_allclose(
        env_actions, [[-2, 0, 10], [0, 0.5, 15], [2, 1, 20], [1, 0.25, 16]], rtol=1e-6
    )
    assert scale_action(policy.astype(np.float32), low, high).dtype == np.float32
    # Never outside the bounds, even for inputs a hair outside [-1, 1].
    edge = scale_action(np.array([[-1.0000001, 1.0000001, 1.0]]), low, high)
    assert (edge >= low).all() and (edge <= high).all()


def test_episode_statistics_count_every_step_of_each_env() -> None:
    stats = EpisodeStatistics(2)
    no = np.array([False, False])
    assert stats.update(np.array([1.0, 2.0]), no, no) == []
    assert stats.update(np.array([1.0, 2.0]), np.array([True, False]), no) == [(0, 2.0, 2)]
    assert stats.update(np.array([5.0, 2.0]), no, np.array([False, True])) == [(1, 6.0, 3)]
    state = stats.state_dict()
    other = EpisodeStatistics(2)
    other.load_state_dict(state)
    assert other.update(np.array([1.0, 1.0]), np.array([True, True]), no) == [(0, 6.0, 2),
                                                                              (1, 1.0, 1)]


@pytest.mark.parametrize("kind", ["sync", "async", "shared"])
def test_stepper_steps_in_two_halves(kind: str) -> None:
    envs = make_vec_env("Pendulum-v1", num_envs=2, seed=4, kind=kind)
    reference = make_vec_env("Pendulum-v1", num_envs=2, seed=4)
    asynchronous = kind != "sync"
    try:
        stepper = EnvStepper(envs)
        assert stepper.asynchronous is asynchronous
        envs.reset(seed=4)
        reference.reset(seed=4)
        actions = np.full((2, 1), 0.5, np.float32)
        stepper.start(actions)
        observations, rewards, *_ = stepper.finish()
        expected, expected_rewards, *_ = reference.step(actions)
        np.testing.assert_allclose(observations, expected)
        np.testing.assert_allclose(rewards, expected_rewards)
        if not asynchronous:
            with pytest.raises(RuntimeError, match=r"finish\(\) without start\(\)"):
                stepper.finish()
    finally:
        envs.close()
        reference.close()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP],
                         ids=["int", "term", "hup"])
@pytest.mark.parametrize("kind", ["async", "shared"])
def test_env_workers_outlive_a_stop_sent_to_the_process_group(kind: str, signum: int) -> None:
    """A Ctrl-C, a closing terminal's SIGHUP or a batch system's SIGTERM reaches every process
    of the group; the workers
    must go on stepping, so the training loop can finish its step, save and close them."""
    envs = make_vec_env("Pendulum-v1", num_envs=2, seed=4, kind=kind, workers=2)
    try:
        envs.reset(seed=4)
        workers = envs.unwrapped.processes if kind == "async" else envs.unwrapped._processes
        for worker in workers:
            os.kill(worker.pid, signum)
        time.sleep(0.5)
        assert all(worker.is_alive() for worker in workers)
        observations, *_ = envs.step(np.zeros((2, 1), np.float32))
        assert observations.shape == (2, 3)
    finally:
        envs.close()


class FakeMujoco:
    """The two calls of MuJoCo's bindings that set its warning handler."""

    def __init__(self, handler: object = None) -> None:
        self.handler = handler

    def get_mju_user_warning(self) -> object:
        return self.handler

    def set_mju_user_warning(self, handler: object) -> None:
        self.handler = handler


SETTOTALMASS = ("compiler attribute 'settotalmass' is deprecated and will be removed in a "
                "future release: scale the masses and densities in the model, or call "
                "mj_setTotalmass and mj_setConst on the compiled model")
"""MuJoCo 3.17's warning on loading gymnasium's half_cheetah.xml."""


def test_mujocos_settotalmass_warning_is_dropped_and_its_others_still_show(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """MuJoCo prints it from C, in every process that loads the model: only a handler of
    MuJoCo's own can drop it. Set for gymnasium's MuJoCo envs alone, once per process."""
    from rl_graphstep.envs import make as envmake

    fake = FakeMujoco()
    monkeypatch.setitem(sys.modules, "mujoco", fake)
    monkeypatch.setattr(envmake, "_mujoco_warnings_set", False)
    envmake.quiet_mujoco_model_warning("fakes:Breaks_none")  # not gymnasium's: left alone
    assert fake.handler is None
    envmake.quiet_mujoco_model_warning("gymnasium.envs.mujoco.half_cheetah_v5:HalfCheetahEnv")
    assert callable(fake.handler)
    fake.handler(SETTOTALMASS)
    fake.handler("Nan, Inf or huge value in QACC at DOF 0. The simulation is unstable.")
    assert capsys.readouterr().err == ("WARNING: Nan, Inf or huge value in QACC at DOF 0. The "
                                       "simulation is unstable.\n")


def test_a_mujoco_warning_handler_the_user_set_stays(monkeypatch: pytest.MonkeyPatch) -> None:
    from rl_graphstep.envs import make as envmake

    def mine(message: str) -> None:
        pass

    fake = FakeMujoco(mine)
    monkeypatch.setitem(sys.modules, "mujoco", fake)
    monkeypatch.setattr(envmake, "_mujoco_warnings_set", False)
    envmake.quiet_mujoco_model_warning("gymnasium.envs.mujoco.ant_v5:AntEnv")
    assert fake.handler is mine


@pytest.mark.parametrize("kind", ["sync", "async", "shared"])
def test_halfcheetah_starts_without_the_settotalmass_warning(kind: str) -> None:
    """With MuJoCo installed: in this process, gymnasium's forked workers and the shared
    env's spawned ones, none prints it."""
    pytest.importorskip("mujoco")
    make = {"sync": "make_vec_env('HalfCheetah-v5', num_envs=2, seed=0, kind='sync')",
            "async": "make_vec_env('HalfCheetah-v5', num_envs=2, seed=0, kind='async')",
            "shared": "SharedMemoryVectorEnv('HalfCheetah-v5', 2, workers=2, context='spawn')"}
    code = ("from rl_graphstep.envs.vector import make_vec_env\n"
            "from rl_graphstep.envs.shared import SharedMemoryVectorEnv\n"
            f"envs = {make[kind]}\n"
            "envs.reset(seed=0)\n"
            "envs.close()\n"
            "print('made')\n")
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = run_python("-c", code, cwd=root, env=env, capture_output=True, text=True,
                      timeout=120)
    assert done.returncode == 0 and done.stdout == "made\n", done.stderr
    assert "settotalmass" not in done.stderr
