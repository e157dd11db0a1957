"""PPO with custom networks through the training loop on the CPU: a custom actor (the example's
torso under the built-in heads) and a custom value network train a few rollouts on
Pendulum-v1 (Box) and CartPole-v1 (Discrete), two seeds stacked, are recorded in the
checkpoint, resume and evaluate; given from Python, a class resumes bit for bit."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from fakes import assert_same_state
from torch import Tensor, nn

from rl_graphstep.evaluate import evaluate
from rl_graphstep.networks.policies import ppo_mlp
from rl_graphstep.run.checkpoint import load_checkpoint
from rl_graphstep.run.flags import load_config
from rl_graphstep.train import main, train

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `examples` is a folder of the repository
    sys.path.insert(0, str(ROOT))

from examples.ppo_actor import LayerNormGaussianActor  # noqa: E402

# 2 envs x 16 steps = rollouts of 32 steps per seed; 2 minibatches of 16, 2 epochs.
SMALL = ["--algo", "ppo", "--device", "cpu", "--num-envs", "2", "--num-steps", "16",
         "--num-minibatches", "2", "--update-epochs", "2", "--hidden-sizes", "8", "8",
         "--no-progress", "--log-interval", "32"]

VALUE_FILE = '''
from torch import nn


class TwoLayerValue(nn.Module):
    """A value network of its own: ReLU, one hidden layer of ``width``."""

    def __init__(self, observation_space, action_space, width=4):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(observation_space.shape[0], width), nn.ReLU(),
                                 nn.Linear(width, 1))

    def forward(self, observations):
        return self.net(observations)
'''

ACTORS = {"Pendulum-v1": "examples.ppo_actor:LayerNormGaussianActor",
          "CartPole-v1": "examples.ppo_actor:LayerNormCategoricalActor"}


@pytest.mark.parametrize(("env", "head"), [("Pendulum-v1", "mean"), ("CartPole-v1", "logits")])
def test_custom_networks_train_two_seeds_resume_and_evaluate(
        env: str, head: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    Path("value.py").write_text(VALUE_FILE)
    assert main(["--env", env, *SMALL, "--num-seeds", "2", "--total-timesteps", "64",
                 "--actor", ACTORS[env], "--actor-kwargs", "{width: 6, depth: 1}",
                 "--critic", "value.py:TwoLayerValue", "--critic-kwargs", "{width: 5}",
                 "--log-dir", "runs", "--run-name", "g"]) == 0
    start = capsys.readouterr().out.splitlines()[0]
    actor_class = ACTORS[env].rpartition(":")[2]
    assert start.endswith(f"; actor {actor_class} (examples.ppo_actor), critic TwoLayerValue "
                          "(value.py)")
    state = load_checkpoint("runs/g")
    assert state["config"]["actor"] == ACTORS[env]
    assert state["config"]["critic"] == "networks/value.py:TwoLayerValue"  # the run's copy
    assert Path("runs/g/networks/value.py").read_text() == VALUE_FILE
    # 2 rollouts; two seeds stacked. The torso's kwargs: observation -> 6 (LayerNorm, SiLU),
    # then the built-in head to 1 action (Pendulum) or 2 logits (CartPole); the value
    # network's width 5.
    actor, critic = state["agent"]["actor"], state["agent"]["critic"]
    observation_size, outputs = (3, 1) if env == "Pendulum-v1" else (4, 2)
    assert actor[f"stacked.{head}.0.weight"].shape == (2, 6, observation_size)
    assert actor[f"stacked.{head}.1.weight"].shape == (2, 6)  # the LayerNorm
    assert actor[f"stacked.{head}.3.weight"].shape == (2, outputs, 6)
    assert critic["stacked.net.0.weight"].shape == (2, 5, observation_size)
    assert state["agent"]["updates"] == 2
    # The seeds' networks are their own: each built after its own seed.
    assert not torch.equal(actor[f"stacked.{head}.0.weight"][0],
                           actor[f"stacked.{head}.0.weight"][1])

    group = evaluate(Path("runs/g"), episodes=1, device="cpu", verbose=False)
    assert group.seeds == (1, 2) and [len(r.returns) for r in group.results] == [1, 1]
    assert main(["--resume", "runs/g", "--total-timesteps", "128"]) == 0
    resumed = load_checkpoint("runs/g")
    assert (resumed["global_step"], resumed["agent"]["updates"]) == (128, 4)
    assert resumed["config"]["critic"] == "networks/value.py:TwoLayerValue"


class WideValue(nn.Module):
    """A value network given from Python as a class (``test_train_ppo_nets:WideValue``)."""

    def __init__(self, observation_space: object, action_space: object,
                 hidden_sizes: tuple[int, ...] = (16,)) -> None:
        super().__init__()
        self.net = ppo_mlp([observation_space.shape[0], *hidden_sizes, 1], 1.0)  # type: ignore[attr-defined]

    def forward(self, observations: Tensor) -> Tensor:
        return self.net(observations)


def test_classes_from_python_resume_at_a_rollout_boundary_bit_for_bit(tmp_path: Path) -> None:
    """As the built-in networks do (tests/test_train_ppo.py): stopped at 64 and resumed to 128
    from the command line, which rebuilds the recorded classes, the run ends as the run
    straight to 128 does."""
    args = ["--env", "Pendulum-v1", *SMALL, "--no-anneal-lr", "--log-dir", str(tmp_path),
            "--actor-kwargs", "{width: 8}"]
    train(load_config([*args, "--total-timesteps", "128", "--run-name", "straight"]),
          actor=LayerNormGaussianActor, critic=WideValue)
    train(load_config([*args, "--total-timesteps", "64", "--run-name", "halves"]),
          actor=LayerNormGaussianActor, critic=WideValue)
    recorded = load_checkpoint(tmp_path / "halves")["config"]
    assert recorded["actor"] == "examples.ppo_actor:LayerNormGaussianActor"
    assert recorded["critic"].endswith(":WideValue")
    assert main(["--resume", str(tmp_path / "halves"), "--total-timesteps", "128"]) == 0
    straight, halves = (load_checkpoint(tmp_path / name) for name in ("straight", "halves"))
    assert straight["agent"]["updates"] == halves["agent"]["updates"] == 4
    assert_same_state(straight["agent"], halves["agent"])
    assert_same_state(straight["observations"].tolist(), halves["observations"].tolist())
    # Deterministic actions: the mean of the custom torso, the same episode twice.
    assert evaluate(tmp_path / "halves", episodes=1, verbose=False) == evaluate(
        tmp_path / "halves", episodes=1, verbose=False)


def test_a_built_module_trains_one_seed_and_its_class_rebuilds_it(tmp_path: Path) -> None:
    """A built actor is trained in place, recorded by its class; evaluate builds
    ``Class(observation_space, action_space)`` and loads the saved weights into it."""
    import gymnasium as gym

    env = gym.make("Pendulum-v1")
    actor = LayerNormGaussianActor(env.observation_space, env.action_space)
    env.close()
    before = actor.mean[0].weight.detach().clone()
    cfg = load_config(["--env", "Pendulum-v1", *SMALL, "--total-timesteps", "64",
                       "--log-dir", str(tmp_path), "--run-name", "built"])
    assert train(cfg, actor=actor)["updates"] == {"critic": (0, 8), "actor": (0, 8)}
    saved = load_checkpoint(tmp_path / "built")["agent"]["actor"]
    assert torch.equal(saved["mean.0.weight"], actor.mean[0].weight)  # trained in place
    assert not torch.equal(before, actor.mean[0].weight)
    assert len(evaluate(tmp_path / "built", episodes=1, verbose=False).returns) == 1


def test_a_yaml_config_names_ppo_networks_as_the_command_line_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # `examples.` module specs import from the current folder
    config = tmp_path / "ppo.yaml"
    config.write_text("env_id: CartPole-v1\nalgo: ppo\n"
                      "actor: examples.ppo_actor:LayerNormCategoricalActor\n"
                      "actor_kwargs: {width: 4, depth: 1}\n"
                      "critic: rl_graphstep.networks.policies:ValueNetwork\n"
                      "critic_kwargs: {hidden_sizes: [3]}\n")
    assert main(["--config", str(config), "--device", "cpu", "--num-envs", "2", "--num-steps",
                 "16", "--num-minibatches", "2", "--total-timesteps", "32", "--no-progress",
                 "--log-dir", str(tmp_path / "runs"), "--run-name", "y"]) == 0
    state = load_checkpoint(tmp_path / "runs" / "y")
    # CartPole: 4 observations -> 4 (LayerNorm, SiLU) -> 2 logits; the value 4 -> 3 -> 1.
    assert state["agent"]["actor"]["logits.3.weight"].shape == (2, 4)
    assert state["agent"]["critic"]["net.0.weight"].shape == (3, 4)
    assert state["agent"]["critic"]["net.2.weight"].shape == (1, 3)
