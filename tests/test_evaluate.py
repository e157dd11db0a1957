"""Evaluation from a checkpoint: deterministic returns, the summary line, and one clear line
for a missing run or a missing video dependency."""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from fakes import SpaceBreaker
from processtools import run

from rl_graphstep import train
from rl_graphstep.algorithms import OFF_POLICY_ALGORITHMS as ALGORITHMS
from rl_graphstep.core.errors import EnvError
from rl_graphstep.envs.make import make_env
from rl_graphstep.evaluate import EvaluationResult, evaluate, main
from rl_graphstep.run.checkpoint import FORMAT, save_checkpoint
from rl_graphstep.run.evaluation import evaluation_env
from rl_graphstep.run.flags import load_config
from rl_graphstep.run.netspec import make_networks
from rl_graphstep.settings.config import config_to_dict

ROOT = Path(__file__).resolve().parent.parent
STEP = 15000


def write_run(run_dir: Path, algo: str = "sac", hidden: tuple[str, ...] = ("32", "32"),
              weights_hidden: tuple[str, ...] | None = None) -> Path:
    """A run folder with one checkpoint of an untrained actor, in train's format (built here,
    not by train, so these tests do not depend on the training loop's checkpointing)."""
    torch.manual_seed(0)
    cfg = load_config(["--env", "Pendulum-v1", "--algo", algo, "--hidden-sizes", *hidden])
    weights_cfg = load_config(["--env", "Pendulum-v1", "--algo", algo, "--hidden-sizes",
                               *(weights_hidden or hidden)])
    env = gym.make("Pendulum-v1")
    actor, _ = make_networks(ALGORITHMS[algo], weights_cfg, env.observation_space,
                             env.action_space, torch.device("cpu"))
    env.close()
    state = {
        "format": FORMAT,
        "config": config_to_dict(cfg),
        "run_name": run_dir.name,
        "global_step": STEP,
        "episodes": 75,
        "recent_returns": [],
        "agent": {"actor": actor.state_dict()},
        "rng": {},
        "envs": None,
        "observations": np.zeros((1, 3), dtype=np.float32),
        "buffer": None,
    }
    save_checkpoint(run_dir, STEP, state, keep=1)
    return run_dir


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return write_run(tmp_path / "runs" / "pendulum")


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_returns_are_in_range_and_repeat_with_the_seed(tmp_path: Path, algo: str) -> None:
    run = write_run(tmp_path / algo, algo)
    result = evaluate(run, episodes=3, seed=0, device="cpu", verbose=False)
    assert isinstance(result, EvaluationResult)
    mean, std, returns = result
    assert len(returns) == 3
    assert all(-2000 <= r <= 0 for r in returns)  # Pendulum's 200 steps of cost in [0, 16.3]
    assert mean == pytest.approx(np.mean(returns)) and std == pytest.approx(np.std(returns))
    assert len(set(returns)) == 3  # seed + i: three different starts

    again = evaluate(run, episodes=3, seed=0, device="cpu", verbose=False)
    assert again.returns == returns and again.mean == mean
    other = evaluate(run, episodes=3, seed=1, device="cpu", verbose=False)
    assert other.returns[:2] == returns[1:]  # episode i of seed s is episode i+1 of seed s-1


def test_a_checkpoint_file_evaluates_too(run_dir: Path) -> None:
    file = run_dir / "checkpoints" / f"step_{STEP:012d}.pt"
    assert (evaluate(file, episodes=1, device="cpu", verbose=False)
            == evaluate(run_dir, episodes=1, device="cpu", verbose=False))


@pytest.mark.parametrize("old_settings", [
    {"async_envs": True, "env_worker": False, "overlap": True},
    {"async_envs": False, "env_worker": True, "overlap": False},
], ids=["async-envs", "env-worker"])
def test_a_checkpoint_saved_before_vec_env_evaluates(
        old_settings: dict[str, bool], run_dir: Path, tmp_path: Path,
        recwarn: pytest.WarningsRecorder) -> None:
    """A config that holds async_envs, env_worker and overlap (removed since) still loads,
    without a warning: evaluation steps one env of its own whatever the run stepped."""
    old = write_run(tmp_path / "old")
    file = old / "checkpoints" / f"step_{STEP:012d}.pt"
    state = torch.load(file, weights_only=False)
    del state["config"]["vec_env"]
    state["config"].update(old_settings)
    torch.save(state, file)
    assert (evaluate(old, episodes=1, device="cpu", verbose=False)
            == evaluate(run_dir, episodes=1, device="cpu", verbose=False))
    assert not [w for w in recwarn if "env worker" in str(w.message)]


def test_the_cli_prints_one_summary_line(run_dir: Path, capsys: pytest.CaptureFixture[str]
                                         ) -> None:
    expected = evaluate(run_dir, episodes=2, seed=0, device="cpu", verbose=False)
    assert main([str(run_dir), "--episodes", "2", "--device", "cpu"]) == 0
    out, err = capsys.readouterr()
    assert out == (f"Pendulum-v1, sac, step {STEP}: mean return {expected.mean:.1f} ± "
                   f"{expected.std:.1f} over 2 episodes\n")
    assert err == ""
    assert re.fullmatch(r"Pendulum-v1, sac, step 15000: mean return -\d+\.\d ± \d+\.\d "
                        r"over 2 episodes\n", out)


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("error: ")
    return err.strip()


def test_cli_missing_run_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["runs/nope"]) == 2
    assert one_error_line(capsys) == ("error: run folder runs/nope does not exist; give a run "
                                      "folder (such as runs/<run name>) or a .pt checkpoint")


def test_cli_bad_arguments(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(run_dir), "--episodes", "0"]) == 2
    assert one_error_line(capsys) == "error: --episodes must be a positive int, got 0"
    assert main([str(run_dir), "--device", "tpu"]) == 2
    assert one_error_line(capsys) == ("error: --device must be one of auto, cpu, cuda, "
                                      "got 'tpu'")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message without a GPU")
def test_cli_cuda_without_a_gpu(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(run_dir), "--device", "cuda"]) == 2
    assert one_error_line(capsys).startswith("error: --device cuda was asked for, but no CUDA")


def test_an_actor_that_does_not_fit_its_config(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    run = write_run(tmp_path / "run", hidden=("32", "32"), weights_hidden=("16",))
    assert main([str(run), "--device", "cpu"]) == 2
    assert one_error_line(capsys).startswith(
        f"error: checkpoint {run}/checkpoints/step_{STEP:012d}.pt: the saved actor does not "
        "fit the actor its config builds (Error(s) in loading state_dict")


def test_video_without_moviepy(run_dir: Path, capsys: pytest.CaptureFixture[str],
                               monkeypatch: pytest.MonkeyPatch) -> None:
    # Not installed, as far as evaluate can tell, whether or not the video extra is here.
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None
                        if name == "moviepy" else find_spec(name, *args))
    assert main([str(run_dir), "--video", "--device", "cpu"]) == 2
    assert one_error_line(capsys) == ('error: --video needs moviepy, which is not installed; '
                                      'run pip install "rl_graphstep[video]"')
    assert not (run_dir / "videos").exists()


@pytest.mark.skipif(importlib.util.find_spec("moviepy") is None
                    or importlib.util.find_spec("pygame") is None,
                    reason='needs the video extra: pip install "rl_graphstep[video]"')
def test_video_records_one_file_per_episode(run_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SDL_VIDEODRIVER", "dummy")
    assert main([str(run_dir), "--video", "--episodes", "2", "--device", "cpu"]) == 0
    videos = sorted((run_dir / "videos").glob("*.mp4"))
    assert [v.name.rsplit("-", 1)[-1] for v in videos] == ["0.mp4", "1.mp4"]
    assert all(v.stat().st_size > 1000 for v in videos)


# A user's own env, registered by its module, whose constructor takes no render_mode (as
# gymnasium's examples write one); trained with `--env plain_envs:Plain-v0` from its folder.
PLAIN_ENVS = """\
import gymnasium as gym
import numpy as np


class Plain(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def __init__(self):
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(3, np.float32), {}

    def step(self, action):
        self.t += 1
        return (np.full(3, 0.1, np.float32), -float(np.square(action).sum()), False,
                self.t >= 50, {})


gym.register("Plain-v0", entry_point="plain_envs:Plain")
"""
PLAIN = "plain_envs:Plain-v0"
NOT_IMPORTED = (f"error: cannot import module 'plain_envs' of environment '{PLAIN}': "
                "ModuleNotFoundError: No module named 'plain_envs'; run from the folder that "
                "holds it, or add that folder to PYTHONPATH\n")


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of plain_envs.py, holding runs/plain: 300 steps of SAC on Plain-v0."""
    folder = tmp_path_factory.mktemp("user")
    (folder / "plain_envs.py").write_text(PLAIN_ENVS)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        patch.syspath_prepend(str(folder))
        assert train.main(["--env", PLAIN, "--device", "cpu", "--total-timesteps", "300",
                           "--learning-starts", "100", "--batch-size", "32", "--buffer-size",
                           "1000", "--hidden-sizes", "16", "16", "--no-progress", "--log-dir",
                           "runs", "--run-name", "plain"]) == 0
    return folder


def test_an_env_without_render_mode_evaluates(plain_run: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """render_mode is passed only to render (it was always passed, None or not: a
    TypeError traceback)."""
    monkeypatch.chdir(plain_run)
    capsys.readouterr()
    assert main(["runs/plain", "--episodes", "2", "--device", "cpu"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert re.fullmatch(rf"{PLAIN}, sac, step 300: mean return -\d+\.\d ± \d+\.\d over 2 "
                        r"episodes\n", out)


def test_video_of_an_env_without_rendering_is_one_line(plain_run: Path,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    """Said before the missing moviepy (if it is): installing it would not help."""
    monkeypatch.chdir(plain_run)
    capsys.readouterr()
    assert main(["runs/plain", "--video", "--device", "cpu"]) == 2
    assert capsys.readouterr() == ("", f"error: {PLAIN} has no rgb_array rendering, so --video "
                                       "cannot record it; evaluate without --video\n")
    assert not (plain_run / "runs" / "plain" / "videos").exists()


def test_an_entry_point_that_takes_no_render_mode_cannot_record() -> None:
    """A function entry point declares no render modes: asking it to render is what tells."""
    gym.register("NoKwargs-v0", entry_point=lambda: SpaceBreaker())
    with pytest.raises(EnvError) as info:
        evaluation_env("NoKwargs-v0", 0, render=True)
    assert str(info.value) == ("NoKwargs-v0 has no rgb_array rendering, so --video cannot "
                               "record it; evaluate without --video")
    evaluation_env("NoKwargs-v0", 0, render=False).close()


def test_evaluate_and_resume_from_another_folder_say_the_same_line(plain_run: Path,
                                                                   tmp_path: Path) -> None:
    """One env-making path for both: evaluate's was a ModuleNotFoundError traceback. The
    processes as a user runs them, from a folder that does not hold plain_envs.py."""
    run_dir = plain_run / "runs" / "plain"
    before = {p.name: p.read_bytes() for p in (run_dir / "checkpoints").iterdir()}
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for command in (["rl_graphstep.evaluate", str(run_dir), "--device", "cpu"],
                    ["rl_graphstep.train", "--resume", str(run_dir), "--total-timesteps", "400"]):
        done = run([sys.executable, "-m", *command], cwd=tmp_path, env=env,
                   capture_output=True, text=True, timeout=120)
        process, err = done, done.stderr
        assert (process.returncode, err) == (2, NOT_IMPORTED), command
    assert {p.name: p.read_bytes() for p in (run_dir / "checkpoints").iterdir()} == before


@pytest.mark.filterwarnings("ignore:.*Overriding environment Plain-v0")  # imported again
def test_a_module_env_imports_from_the_current_folder_without_python_m(
        plain_run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rl-graphstep-train command does not put the current folder on sys.path, as
    ``python -m`` does; the env's module is found there all the same, as networks are."""
    monkeypatch.chdir(plain_run)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(plain_run))])
    monkeypatch.delitem(sys.modules, "plain_envs", raising=False)
    make_env(PLAIN).close()
    assert str(plain_run) in sys.path


def test_an_obs_norm_run_evaluates_through_its_saved_statistics(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The actor of a --obs-norm run sees (x - mean) / (std + 0.01) with the checkpoint's
    statistics (frozen: evaluating twice gives the same returns)."""
    from rl_graphstep.run import evaluation

    assert train.main(["--env", "Pendulum-v1", "--log-dir", str(tmp_path), "--run-name", "n",
                       "--total-timesteps", "300", "--learning-starts", "100",
                       "--batch-size", "32", "--hidden-sizes", "16", "16", "--no-progress",
                       "--device", "cpu", "--obs-norm"]) == 0
    seen: list[torch.Tensor] = []
    act = evaluation.evaluation_action
    monkeypatch.setattr(evaluation, "evaluation_action",
                        lambda actor, kind, obs: seen.append(obs.clone()) or act(actor, kind, obs))
    first = evaluate(tmp_path / "n", episodes=1, seed=5, device="cpu", verbose=False)
    stats = torch.load(next((tmp_path / "n" / "checkpoints").glob("*.pt")),
                       weights_only=False)["obs_normalizer"]
    env = make_env("Pendulum-v1")
    observation, _ = env.reset(seed=5)
    env.close()
    mean, std = stats["mean"][0].numpy(), np.sqrt(stats["var"][0].numpy())
    expected = (observation.astype(np.float64) - mean) / (std + 0.01)
    np.testing.assert_allclose(seen[0][0].numpy(), expected, rtol=1e-5, atol=1e-6)
    assert not np.allclose(seen[0][0].numpy(), observation, atol=1e-3)
    assert len(seen) == 200
    assert evaluate(tmp_path / "n", episodes=1, seed=5, device="cpu",
                    verbose=False).returns == first.returns
