"""PPO with custom networks on the GPU: a captured run with the example's actor and a value
network of its own trains (one seed and two, Box and Discrete), evaluates, and resumed at a
rollout boundary goes on as the run straight through; a host sync in the captured
``log_prob_and_entropy`` is one line at start-up, where one in ``forward`` makes the run act
eagerly, with a warning."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from resumetools import straight_and_halves
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import Tensor

from rl_graphstep.core.errors import ConfigError
from rl_graphstep.core.ppocheck import check_ppo_actor
from rl_graphstep.evaluate import evaluate
from rl_graphstep.networks.policies import GaussianActor
from rl_graphstep.run.checkpoint import load_checkpoint
from rl_graphstep.run.flags import load_config
from rl_graphstep.train import train

pytestmark = pytest.mark.cuda

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `examples` is a folder of the repository
    sys.path.insert(0, str(ROOT))

# Rollouts of 4 envs x 32 steps, 4 minibatches of 32, 2 epochs: 8 rollouts.
BASE = ["--algo", "ppo", "--device", "cuda", "--graph", "on", "--compile", "off",
        "--num-envs", "4", "--num-steps", "32", "--num-minibatches", "4", "--update-epochs",
        "2", "--total-timesteps", "1024", "--log-interval", "128", "--no-progress",
        "--critic", "rl_graphstep.networks.policies:ValueNetwork", "--critic-kwargs",
        "{hidden_sizes: [32]}", "--actor-kwargs", "{width: 32, depth: 2}"]
ACTORS = {"Pendulum-v1": "examples.ppo_actor:LayerNormGaussianActor",
          "CartPole-v1": "examples.ppo_actor:LayerNormCategoricalActor"}


@pytest.mark.parametrize("env", ["CartPole-v1", "Pendulum-v1"])
@pytest.mark.parametrize("seeds", [1, 2])
def test_a_captured_ppo_run_with_a_custom_actor_trains(env: str, seeds: int,
                                                       tmp_path: Path) -> None:
    summary = train(load_config(["--env", env, *BASE, "--actor", ACTORS[env],
                                 "--num-seeds", str(seeds), "--log-dir", str(tmp_path),
                                 "--run-name", "run"]))
    assert summary["graph"] is True
    steps = 8 * 2 * 4 * seeds  # rollouts x epochs x minibatches, every seed
    assert summary["updates"] == {"critic": (0, steps), "actor": (0, steps)}
    state = load_checkpoint(tmp_path / "run")
    assert state["config"]["actor"] == ACTORS[env] and state["agent"]["updates"] == 8
    for tensor in state["agent"]["actor"].values():
        assert torch.isfinite(tensor).all()
    events = EventAccumulator(str(tmp_path / "run" / ("seed_1" if seeds > 1 else "")))
    events.Reload()
    kl = [e.value for e in events.Scalars("losses/approx_kl")]
    assert len(kl) == 8 and all(math.isfinite(v) and v >= 0 for v in kl)
    evaluate(tmp_path / "run", episodes=1, device="cuda", verbose=False)


def test_a_captured_run_with_a_custom_actor_resumes_as_it_went_on(tmp_path: Path) -> None:
    """As tests/test_train_ppo_cuda.py's resume (--no-anneal-lr, --vec-env sync)."""
    args = ["--env", "Pendulum-v1", *BASE, "--actor", ACTORS["Pendulum-v1"],
            "--no-anneal-lr", "--vec-env", "sync", "--log-dir", str(tmp_path)]
    straight, halves = straight_and_halves(tmp_path, args, 1024, 512)
    for role in ("actor", "critic"):
        for name, tensor in straight["agent"][role].items():
            assert torch.equal(tensor, halves["agent"][role][name]), name


class SyncingLogProb(GaussianActor):
    def log_prob_and_entropy(self, observations: Tensor, actions: Tensor
                             ) -> tuple[Tensor, Tensor]:
        log_probs, entropy = super().log_prob_and_entropy(observations, actions)
        if log_probs.max().item() > 1e9:  # HOST-SYNC
            log_probs = log_probs * 0
        return log_probs, entropy


class SyncingForward(GaussianActor):
    def forward(self, observations: Tensor) -> tuple[Tensor, Tensor]:
        actions, log_probs = super().forward(observations)
        if actions.max().item() > 1e9:  # acting runs eagerly: allowed
            actions = actions * 0
        return actions, log_probs


def test_a_host_sync_is_refused_where_the_step_captures_it() -> None:
    device = torch.device("cuda")
    spaces = (gym.spaces.Box(-1.0, 1.0, (5,), np.float32),
              gym.spaces.Box(-1.0, 1.0, (2,), np.float32))
    sizes = {"observation_size": 5, "action_size": 2, "num_actions": 0, "device": device}
    with pytest.raises(ConfigError, match=r"^SyncingLogProb.log_prob_and_entropy calls "
                       r"\.item\(\) at .*test_train_ppo_nets_cuda.py:\d+ "):
        check_ppo_actor(SyncingLogProb(*spaces).to(device), **sizes)
    check_ppo_actor(SyncingForward(*spaces).to(device), **sizes)


def test_an_actor_whose_forward_syncs_acts_eagerly_with_a_warning(tmp_path: Path) -> None:
    args = ["--algo", "ppo", "--device", "cuda", "--graph", "on", "--compile", "off",
            "--env", "Pendulum-v1", "--num-envs", "2", "--num-steps", "32",
            "--num-minibatches", "2", "--update-epochs", "1", "--total-timesteps", "128",
            "--no-progress", "--log-dir", str(tmp_path),
            "--actor", "test_train_ppo_nets_cuda:SyncingForward"]
    with pytest.warns(UserWarning, match="PPO's acting.*acting eagerly instead"):
        summary = train(load_config(args))
    assert summary["graph"] is True  # the updates are still captured
    assert summary["updates"] == {"critic": (0, 4), "actor": (0, 4)}  # 2 rollouts x 2 x 1
