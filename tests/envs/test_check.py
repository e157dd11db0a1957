"""An env that breaks the spaces it declares is one line naming it, the method and what came
back, wherever it steps: in the process (one env or several), in async or shared workers."""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from fakes import SPACE_FAULTS
from processtools import run

from rl_graphstep import train
from rl_graphstep.core.errors import EnvError
from rl_graphstep.envs import check as envcheck
from rl_graphstep.envs.make import make_env
from rl_graphstep.run.checkpoint import load_checkpoint
from rl_graphstep.run.cli import suggested_command

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--device", "cpu", "--total-timesteps", "300", "--learning-starts", "100",
         "--batch-size", "32", "--buffer-size", "1000", "--hidden-sizes", "16", "16",
         "--no-progress"]


def run_until_refused(env_id: str) -> str:
    """Reset and step ``env_id`` (made as runs make it) until it raises; its message."""
    env = make_env(env_id)
    try:
        with pytest.raises(EnvError) as info:
            env.reset(seed=0)
            for _ in range(10):
                env.step(np.zeros(1, np.float32))
        return str(info.value)
    finally:
        env.close()


@pytest.mark.parametrize("fault", list(SPACE_FAULTS))
def test_each_broken_output_is_one_line(fault: str) -> None:
    env_id = f"Breaks_{fault}-v0"
    assert run_until_refused(env_id) == f"environment '{env_id}': {SPACE_FAULTS[fault]}"


def test_what_fits_the_space_passes_and_is_returned_as_is() -> None:
    env = make_env("Breaks_none-v0")
    try:
        observation, info = env.reset(seed=0)
        assert observation.shape == (3,) and info == {}
        for t in range(1, 21):
            observation, reward, terminated, truncated, info = env.step(np.ones(1, np.float32))
            assert reward == -1.0 and terminated == (t == 20) and truncated is False
    finally:
        env.close()


class LooseTypes(gym.Env):
    """Returns what gymnasium's vector envs take though it is not the space's own dtype or
    type: a list, float64 for float32, int rewards and flags, a 0-d reward."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
        return [0.0, 0.5], {}

    def step(self, action: np.ndarray) -> tuple:
        return np.zeros(2), np.array(1.5), 0, np.int64(1), {}


@pytest.mark.filterwarnings("ignore::UserWarning")  # gymnasium's checker warns about each
def test_values_the_vector_envs_can_hold_are_not_refused() -> None:
    gym.register("LooseTypes-v0", entry_point=LooseTypes)
    env = make_env("LooseTypes-v0")
    try:
        assert env.reset()[0] == [0.0, 0.5]
        for _ in range(3):  # the first full check learns the types, then the fast path
            assert env.step(np.zeros(1, np.float32))[1:4] == (1.5, 0, 1)
    finally:
        env.close()


def test_the_registration_still_wraps_as_it_says() -> None:
    """The check sits below gymnasium's wrappers and adds none to the spec: the time limit
    and the registered additional wrappers still apply."""
    gym.register("ClippedBreaks-v0", entry_point=type(gym.make("Breaks_none-v0").unwrapped),
                 max_episode_steps=7, additional_wrappers=(
                     gym.wrappers.ClipReward.wrapper_spec(min_reward=-0.5, max_reward=0.5),))
    env = make_env("ClippedBreaks-v0")
    try:
        env.reset(seed=0)
        results = [env.step(np.ones(1, np.float32)) for _ in range(7)]
        assert [r[1] for r in results] == [-0.5] * 7  # -1 clipped
        assert [r[3] for r in results] == [False] * 6 + [True]  # truncated at step 7
    finally:
        env.close()


@pytest.mark.parametrize(("vec_env", "num_envs"),
                         [("sync", 1), ("sync", 2), ("async", 2), ("shared", 2)])
@pytest.mark.parametrize("fault", ["reset_not_tuple", "reward_vector"])
def test_a_run_of_a_broken_env_is_one_line_in_every_vector_env(
        fault: str, vec_env: str, num_envs: int, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    env_id = f"Breaks_{fault}-v0"
    code = train.main([*SMALL, "--env", env_id, "--vec-env", vec_env, "--num-envs",
                       str(num_envs), "--log-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert (code, err) == (2, f"error: environment '{env_id}': {SPACE_FAULTS[fault]}\n")


@pytest.mark.parametrize("vec_env", ["sync", "async", "shared"])
def test_an_error_the_env_raises_in_a_worker_is_one_line(
        vec_env: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """gymnasium's async env logged the worker's traceback and raised without a line."""
    code = train.main([*SMALL, "--env", "Breaks_step_raises-v0", "--vec-env", vec_env,
                       "--num-envs", "2", "--log-dir", str(tmp_path)])
    err = capfd.readouterr().err
    assert code == 2
    assert re.fullmatch(r"error: the environment's step raised ValueError: the simulator blew "
                        r"up \(at tests/fakes\.py:\d+\)\n", err), err


@pytest.mark.parametrize("vec_env", ["sync", "async"])
def test_a_fault_that_comes_late_keeps_what_the_run_learned(
        vec_env: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Caught where it comes (step 151), after a checkpoint of the updates made since
    learning started: they were lost with every step since the last --checkpoint-every. The
    env, fixed, resumes from there with fresh episodes."""
    env_id = "BreaksLate_step_shape-v0"
    run_dir = tmp_path / "r"
    code = train.main([*SMALL, "--env", env_id, "--vec-env", vec_env, "--log-dir",
                       str(tmp_path), "--run-name", "r"])
    err = capsys.readouterr().err
    saved = run_dir / "checkpoints" / "step_000000000150.pt"
    resume = suggested_command("train", "--resume", str(run_dir))
    assert (code, err) == (2, f"error: environment '{env_id}': {SPACE_FAULTS['step_shape']}; "
                              f"checkpoint {saved} saved: fix the environment, then continue "
                              f"with: {resume}\n")
    state = load_checkpoint(run_dir)
    assert (state["global_step"], state["envs"]) == (150, None)
    # Steps 101-150 updated once each, and the failed step's update was made before it failed.
    assert int(state["agent"]["updates"]) == 51
    monkeypatch.setitem(gym.envs.registry[env_id].kwargs, "after", 10**9)  # fixed
    with pytest.warns(UserWarning, match="their episodes restart on resume"):
        assert train.main(["--resume", str(run_dir), "--total-timesteps", "400"]) == 0
    assert load_checkpoint(run_dir)["global_step"] == 400


def test_a_fault_before_learning_saves_nothing(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Random actions teach nothing: no checkpoint, the line as it was."""
    code = train.main([*SMALL, "--env", "BreaksLate_step_shape-v0", "--learning-starts", "200",
                       "--log-dir", str(tmp_path), "--run-name", "r"])
    assert (code, capsys.readouterr().err) == (
        2, f"error: environment 'BreaksLate_step_shape-v0': {SPACE_FAULTS['step_shape']}\n")
    assert not (tmp_path / "r" / "checkpoints").exists()


def test_the_command_line_names_the_env_and_what_it_returned(tmp_path: Path) -> None:
    """The process as a user runs it, with the env from a module: one line, exit 2."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    done = run([sys.executable, "-m", "rl_graphstep.train", *SMALL, "--env",
                "fakes:Breaks_step_4-v0", "--log-dir", str(tmp_path)], cwd=tmp_path, env=env,
               capture_output=True, text=True, timeout=120)
    process, err = done, done.stderr
    assert process.returncode == 2
    assert err == (f"error: environment 'fakes:Breaks_step_4-v0': {SPACE_FAULTS['step_4']}\n")


def test_an_env_whose_close_raises_is_a_warning_after_a_finished_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The run's work is saved by then: it ends as done, exit 0 (it was a traceback, exit 1;
    an async env's start, which closes a first copy, said the env 'could not be made')."""
    with pytest.warns(UserWarning) as caught:
        code = train.main([*SMALL, "--env", "Breaks_close_raises-v0", "--log-dir",
                           str(tmp_path), "--run-name", "r"])
    assert code == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("done: 300 steps")
    closes = [str(w.message) for w in caught if "close" in str(w.message)]
    assert len(closes) == 1
    assert re.fullmatch(r"the environment's close raised RuntimeError: close boom \(at "
                        r"tests/fakes\.py:\d+\); ignored", closes[0])


def test_an_env_whose_close_hangs_is_left_after_a_finished_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """It held the finished run forever, Ctrl-C and SIGTERM only noted (evaluate never printed
    its result): now a warning at the env's line once CLOSE_SECONDS have passed."""
    monkeypatch.setattr(envcheck, "CLOSE_SECONDS", 0.5)
    began = time.monotonic()
    with pytest.warns(UserWarning) as caught:
        code = train.main([*SMALL, "--env", "Breaks_close_hangs-v0", "--log-dir",
                           str(tmp_path), "--run-name", "r"])
    assert code == 0 and time.monotonic() - began < 60
    assert capsys.readouterr().out.splitlines()[-1].startswith("done: 300 steps")
    closes = [str(w.message) for w in caught if "close" in str(w.message)]
    assert len(closes) == 1
    assert re.fullmatch(r"the environment's close had not returned after 0\.5 s \(at "
                        r"tests/fakes\.py:\d+\); left unclosed", closes[0]), closes
    assert signal.getsignal(signal.SIGALRM) is signal.SIG_DFL  # the timer's handler is gone
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


class BadBounds(gym.Env):
    """Declares an action space gymnasium refuses: low above high."""

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
        self.action_space = gym.spaces.Box(np.ones(1, np.float32), -np.ones(1, np.float32))


def test_a_constructor_that_gymnasium_refuses_is_named_at_the_users_line() -> None:
    """The line named gymnasium/spaces/box.py, not the env's own line that made the Box."""
    gym.register("BadBounds-v0", entry_point=BadBounds)
    try:
        with pytest.raises(EnvError) as info:
            make_env("BadBounds-v0")
    finally:
        del gym.envs.registry["BadBounds-v0"]
    line = BadBounds.__init__.__code__.co_firstlineno + 2
    assert re.fullmatch(r"environment 'BadBounds-v0' could not be made: ValueError: Box all "
                        r"low values must be less than or equal to high .* \(at "
                        rf"tests/envs/test_check\.py:{line}\)", str(info.value)), str(info.value)
