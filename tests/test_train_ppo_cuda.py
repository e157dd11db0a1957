"""PPO through the training loop on the GPU: a short captured run on CartPole-v1 (discrete)
and Pendulum-v1 (continuous), one seed and two, makes every update finite, logs CleanRL's
diagnostics, checkpoints and evaluates; and the captured run resumed at a rollout boundary
goes on as the run straight through; compiled, the acting is too, with no fallback."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import pytest
import torch
from resumetools import straight_and_halves
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rl_graphstep.evaluate import evaluate
from rl_graphstep.run.checkpoint import load_checkpoint
from rl_graphstep.run.flags import load_config
from rl_graphstep.train import main, train

pytestmark = pytest.mark.cuda

# Rollouts of 4 envs x 32 steps, 4 minibatches of 32, 2 epochs: 8 rollouts.
BASE = ["--algo", "ppo", "--device", "cuda", "--graph", "on", "--compile", "off",
        "--num-envs", "4", "--num-steps", "32", "--num-minibatches", "4", "--update-epochs",
        "2", "--hidden-sizes", "64", "64", "--total-timesteps", "1024", "--log-interval",
        "128", "--no-progress"]


@pytest.mark.parametrize("env", ["CartPole-v1", "Pendulum-v1"])
@pytest.mark.parametrize("seeds", [1, 2])
def test_a_captured_ppo_run_trains_logs_and_evaluates(env: str, seeds: int,
                                                      tmp_path: Path) -> None:
    summary = train(load_config(["--env", env, *BASE, "--num-seeds", str(seeds),
                                 "--log-dir", str(tmp_path), "--run-name", "run"]))
    assert summary["graph"] is True and summary["action_stream"] is False
    steps = 8 * 2 * 4 * seeds  # rollouts x epochs x minibatches, every seed
    assert summary["updates"] == {"critic": (0, steps), "actor": (0, steps)}
    state = load_checkpoint(tmp_path / "run")
    assert state["agent"]["updates"] == 8
    for tensor in state["agent"]["actor"].values():
        assert torch.isfinite(tensor).all()
    folder = tmp_path / "run" / ("seed_1" if seeds > 1 else "")
    events = EventAccumulator(str(folder))
    events.Reload()
    kl = [e.value for e in events.Scalars("losses/approx_kl")]
    assert len(kl) == 8 and all(math.isfinite(v) and v >= 0 for v in kl)
    evaluate(tmp_path / "run", episodes=1, device="cuda", verbose=False)


@pytest.mark.parametrize("env", ["CartPole-v1", "Pendulum-v1"])
def test_a_captured_run_resumes_at_a_rollout_boundary_as_it_went_on(env: str,
                                                                     tmp_path: Path) -> None:
    """The graphs replay the same kernels from the restored state: the two halves end where
    the straight run does (--no-anneal-lr: see the CPU test; --vec-env sync: the envs are
    saved with the checkpoint, where shared workers' episodes would restart)."""
    args = ["--env", env, *BASE, "--no-anneal-lr", "--vec-env", "sync", "--log-dir",
            str(tmp_path)]
    straight, halves = straight_and_halves(tmp_path, args, 1024, 512)
    for name, tensor in straight["agent"]["actor"].items():
        assert torch.equal(tensor, halves["agent"]["actor"][name]), name


@pytest.mark.parametrize(("env", "seeds"), [("Pendulum-v1", 1), ("CartPole-v1", 2)])
def test_a_captured_run_with_both_normalisers_trains_and_resumes_as_it_went_on(
        env: str, seeds: int, tmp_path: Path) -> None:
    """--obs-norm and --reward-norm with the minibatch graph: the statistics are uploaded
    in stream order before each action (the rollout stores normalised observations, so the
    graph reads none); every update is finite, and the halves end where the straight run
    does, statistics included (--vec-env sync: the envs are saved with the checkpoint)."""
    args = ["--env", env, *BASE, "--obs-norm", "--reward-norm", "--num-seeds", str(seeds),
            "--no-anneal-lr", "--vec-env", "sync", "--log-dir", str(tmp_path)]
    summary = train(load_config([*args, "--total-timesteps", "1024", "--run-name",
                                 "straight"]))
    steps = 8 * 2 * 4 * seeds
    assert summary["graph"] is True
    assert summary["updates"] == {"critic": (0, steps), "actor": (0, steps)}
    train(load_config([*args, "--total-timesteps", "512", "--run-name", "halves"]))
    assert main(["--resume", str(tmp_path / "halves"), "--total-timesteps", "1024"]) == 0
    straight, halves = (load_checkpoint(tmp_path / n) for n in ("straight", "halves"))
    assert straight["obs_normalizer"]["count"].tolist() == [1024] * seeds
    for key in ("obs_normalizer", "reward_normalizer"):
        for name, tensor in straight[key].items():
            assert torch.equal(tensor, halves[key][name]), (key, name)
    for name, tensor in straight["agent"]["actor"].items():
        assert torch.isfinite(tensor).all(), name
        assert torch.equal(tensor, halves["agent"]["actor"][name]), name
    evaluate(tmp_path / "straight", episodes=1, device="cuda", verbose=False)



def test_a_compiled_captured_run_compiles_its_acting_with_no_fallback(tmp_path: Path) -> None:
    """--compile on compiles the acting's kernels before capturing them, as the updates':
    two seeds with the statistics staged in train with no warning of a fallback."""
    args = ["--env", "Pendulum-v1", *BASE, "--compile", "on", "--obs-norm", "--num-seeds", "2",
            "--log-dir", str(tmp_path), "--run-name", "run"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary = train(load_config(args))
    fallbacks = [str(w.message) for w in caught if "uncompiled" in str(w.message)
                 or "eagerly" in str(w.message) or "PPO's acting" in str(w.message)]
    assert fallbacks == []
    assert summary["graph"] is True and summary["compile"] is True
    for tensor in load_checkpoint(tmp_path / "run")["agent"]["actor"].values():
        assert torch.isfinite(tensor).all()
