"""PPO's networks for a run, refused before anything starts: from the command line each way a
custom actor or critic does not fit is one line (exit 2, no run folder); a group of seeds
refuses a built module and a network vmap cannot batch; the built-in networks of a group are
each seed's own."""

from __future__ import annotations

import sys
from pathlib import Path

import gymnasium as gym
import pytest
import torch
from torch import Tensor

from rl_graphstep.algorithms.ppo import PPO
from rl_graphstep.core.errors import ConfigError
from rl_graphstep.envs.vector import seed_everything
from rl_graphstep.networks.policies import CategoricalActor, GaussianActor
from rl_graphstep.run.flags import load_config
from rl_graphstep.run.pponets import make_ppo_networks
from rl_graphstep.train import main, train

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `examples` is a folder of the repository
    sys.path.insert(0, str(ROOT))

BASE = ["--algo", "ppo", "--device", "cpu", "--num-envs", "2", "--num-steps", "16",
        "--num-minibatches", "2", "--total-timesteps", "64", "--no-progress"]
PROTOCOL = ("a PPO actor has forward(observations) -> (actions, log_probs), "
            "log_prob_and_entropy(observations, actions) -> (log_probs, entropy) and "
            "deterministic_action(observations) -> actions (see "
            "rl_graphstep/networks/policies.py)")
PENDULUM_BOX = "Box(-2.0, 2.0, (1,), float32)"


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize(("args", "line"), [
    (["--env", "CartPole-v1", "--actor", "rl_graphstep.networks.policies:GaussianActor"],
     "actor: GaussianActor is a Gaussian actor, for a Box action space, but CartPole-v1's "
     "action space is Discrete(2): give a categorical actor (rl_graphstep.networks.policies:"
     "CategoricalActor or a subclass of it), or drop --actor for the built-in one"),
    (["--env", "Pendulum-v1", "--actor", "examples.ppo_actor:LayerNormCategoricalActor"],
     "actor: LayerNormCategoricalActor is a categorical actor (a CategoricalActor subclass), "
     f"for a Discrete action space, but Pendulum-v1's action space is {PENDULUM_BOX}: give a "
     "Gaussian actor (rl_graphstep.networks.policies:GaussianActor or a subclass of it), or "
     "drop --actor for the built-in one"),
    (["--env", "Pendulum-v1", "--actor", "examples.residual_actor:ResidualActor"],
     f"ResidualActor has no log_prob_and_entropy: {PROTOCOL}"),
    (["--env", "Pendulum-v1", "--critic", "examples.layernorm_critic:LayerNormCritic"],
     "LayerNormCritic.forward takes (observations, actions), as an off-policy Q critic's "
     "does: a PPO critic is a value network, forward(observations) -> values (B, 1)"),
    (["--env", "CartPole-v1", "--critic", "rl_graphstep.networks.policies:ValueNetwork",
      "--critic-kwargs", "{width: 3}"],
     "critic: cannot build ValueNetwork: its constructor must take (observation_space, "
     "action_space, **kwargs) (given critic_kwargs ['width']); TypeError: "
     "ValueNetwork.__init__() got an unexpected keyword argument 'width'"),
], ids=["gaussian-for-discrete", "categorical-for-box", "sac-actor", "q-critic", "kwargs"])
def test_a_network_that_does_not_fit_is_one_line_from_the_command_line(
        args: list[str], line: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(ROOT)  # `examples.` module specs import from the current folder
    assert main([*BASE, *args, "--log-dir", str(tmp_path / "runs")]) == 2
    assert one_error_line(capsys) == f"error: {line}"
    assert not (tmp_path / "runs").exists()


def test_a_wrong_file_network_is_named_by_the_check(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "nets.py").write_text(
        "from rl_graphstep.networks.policies import ValueNetwork\n\n\n"
        "class Flat(ValueNetwork):\n"
        "    def forward(self, observations):\n"
        "        return super().forward(observations)[:, 0]\n")
    assert main(["--env", "CartPole-v1", *BASE, "--critic", f"{tmp_path}/nets.py:Flat",
                 "--log-dir", str(tmp_path / "runs")]) == 2
    assert one_error_line(capsys) == (
        "error: Flat.forward returned shape (256,), expected (256, 1) (a PPO critic is a "
        "value network, forward(observations) -> values (B, 1))")
    assert not (tmp_path / "runs").exists()


def test_a_group_refuses_a_built_module(tmp_path: Path) -> None:
    env = gym.make("CartPole-v1")
    actor = CategoricalActor(env.observation_space, env.action_space)
    env.close()
    cfg = load_config(["--env", "CartPole-v1", *BASE, "--num-seeds", "2",
                       "--log-dir", str(tmp_path)])
    with pytest.raises(ConfigError, match=r"^a built actor module has one initialisation and "
                       r"a group of seeds needs one per seed: pass its class, or train with "
                       r"--num-seeds 1$"):
        train(cfg, actor=actor)


class ItemLogProb(GaussianActor):
    """Fine alone on the CPU; vmap cannot batch the ``.item()`` in log_prob_and_entropy."""

    def log_prob_and_entropy(self, observations: Tensor, actions: Tensor
                             ) -> tuple[Tensor, Tensor]:
        log_probs, entropy = super().log_prob_and_entropy(observations, actions)
        return log_probs + 0.0 * actions.sum().item(), entropy


def test_a_group_refuses_an_actor_vmap_cannot_batch_in_log_prob_and_entropy() -> None:
    env = gym.make("Pendulum-v1")
    cfg = load_config(["--env", "Pendulum-v1", *BASE, "--num-seeds", "2"])
    with pytest.raises(ConfigError, match=r"^actor ItemLogProb cannot be batched over seeds "
                       r"\(in log_prob_and_entropy: .*\); train with --num-seeds 1$"):
        make_ppo_networks(PPO, cfg, (1, 2), env.observation_space, env.action_space,
                          torch.device("cpu"), actor=ItemLogProb)
    env.close()


def test_the_built_in_networks_of_a_group_are_each_seeds_own() -> None:
    """Seed k's stacked networks are those a single run of seed k builds."""
    env = gym.make("CartPole-v1")
    spaces = (env.observation_space, env.action_space, torch.device("cpu"))
    env.close()
    cfg = load_config(["--env", "CartPole-v1", *BASE, "--hidden-sizes", "4"])
    actors, critics = make_ppo_networks(PPO, cfg, (3, 4), *spaces)
    for k, seed in enumerate((3, 4)):
        seed_everything(seed)
        actor, critic = make_ppo_networks(PPO, cfg, (seed,), *spaces)
        for name, tensor in actor.state_dict().items():
            assert torch.equal(actors.state_dict()[f"stacked.{name}"][k], tensor), name
        for name, tensor in critic.state_dict().items():
            assert torch.equal(critics.state_dict()[f"stacked.{name}"][k], tensor), name
