"""The --algo registry's checks of a config: a setting only other algorithms read is refused
in one line wherever it comes from (flag, YAML, Python, sweep file), and --help lists only the
settings of the algorithms that are here."""

from __future__ import annotations

from pathlib import Path

import pytest
from configtools import write

from rl_graphstep import algorithms
from rl_graphstep.core.errors import ConfigError
from rl_graphstep.run.flags import build_parser, load_config
from rl_graphstep.settings.config import Config
from rl_graphstep.settings.sweepfile import read_sweep_file
from rl_graphstep.sweeps.trials import check_algorithms
from rl_graphstep.train import train

REFUSED = "--learning-rate is a setting of PPO alone, which --algo sac does not read: leave it out"


def test_a_yaml_setting_of_another_algorithm_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "algo: sac\nlearning_rate: 0.001\n")
    with pytest.raises(ConfigError) as info:
        load_config(["--config", path, "--env", "Pendulum-v1"])
    assert str(info.value) == REFUSED


def test_its_default_value_is_no_setting() -> None:
    cfg = load_config(["--env", "Pendulum-v1", "--algo", "td3"])
    algorithms.check_settings(cfg)  # every PPO field at its default: nothing set
    assert cfg.learning_rate == 3e-4


def test_a_python_config_setting_another_algorithms_field_trains_nothing(tmp_path: Path
                                                                         ) -> None:
    cfg = Config(env_id="Pendulum-v1", device="cpu", num_minibatches=4, log_dir=str(tmp_path))
    with pytest.raises(ConfigError, match="--num-minibatches is a setting of PPO alone"):
        train(cfg)
    assert not any(tmp_path.iterdir())  # refused before a run folder was made


def test_a_sweep_that_sets_one_is_refused_before_it_starts(tmp_path: Path) -> None:
    spec = read_sweep_file(write(tmp_path, """\
name: lr
base:
  env_id: Pendulum-v1
  total_timesteps: 6000
search:
  learning_rate: [0.001, 0.0003]
""", name="lr.yaml"))
    with pytest.raises(ConfigError) as info:
        check_algorithms(spec)
    assert str(info.value).startswith(REFUSED + " (in ")


def test_help_lists_the_settings_of_the_algorithms_here(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    def flags() -> set[str]:
        return {flag for action in build_parser()._actions for flag in action.option_strings}

    assert {"--learning-starts", "--learning-rate", "--num-minibatches"} <= flags()
    # The registry replaced, not edited: its order is the --algo choices' order.
    everything = dict(algorithms._CLASSES)
    monkeypatch.setattr(algorithms, "_CLASSES",
                        {k: v for k, v in everything.items() if k != "ppo"})
    assert "--learning-starts" in flags() and "--learning-rate" not in flags()
    monkeypatch.setattr(algorithms, "_CLASSES", {"ppo": everything["ppo"]})
    assert "--learning-rate" in flags() and "--learning-starts" not in flags()


OFF_POLICY_REFUSED = ("{flag} is a setting of SAC, TD3, DDPG and CrossQ alone, which "
                      "--algo ppo does not read: leave it out")


@pytest.mark.parametrize(("argv", "flag"), [
    (["--learning-starts", "100"], "--learning-starts"),
    (["--batch-size", "64"], "--batch-size"),
    (["--buffer-size", "1000"], "--buffer-size"),
    (["--policy-lr", "0.001"], "--policy-lr"),
    (["--q-lr", "0.01"], "--q-lr"),
    (["--save-buffer"], "--save-buffer"),
    (["--n-step", "3"], "--n-step"),
    (["--action-stream", "off"], "--action-stream"),
    (["--critic-max-grad-norm", "1"], "--critic-max-grad-norm"),
])
def test_an_off_policy_setting_is_refused_by_ppo(argv: list[str], flag: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(["--env", "CartPole-v1", "--algo", "ppo", *argv])
    assert str(info.value) == OFF_POLICY_REFUSED.format(flag=flag)


def test_ppo_reads_gamma_and_the_shared_settings() -> None:
    cfg = load_config(["--env", "CartPole-v1", "--algo", "ppo", "--gamma", "0.9",
                       "--hidden-sizes", "8", "8", "--num-envs", "2", "--seed", "4",
                       "--obs-norm"])
    algorithms.check_settings(cfg)
    assert (cfg.gamma, cfg.hidden_sizes, cfg.num_envs, cfg.seed) == (0.9, (8, 8), 2, 4)
    assert cfg.obs_norm  # every algorithm reads it (PPO in CleanRL's form)


def test_ppo_loads_custom_networks_as_the_off_policy_algorithms_do(tmp_path: Path) -> None:
    """Custom networks reach PPO (tests/test_train_ppo_nets.py): a spec that names nothing
    is the loader's one line, before any run folder."""
    cfg = load_config(["--env", "CartPole-v1", "--algo", "ppo", "--device", "cpu",
                       "--log-dir", str(tmp_path), "--actor", "examples.residual_actor:X"])
    with pytest.raises(ConfigError) as info:
        train(cfg)
    assert str(info.value) == ("actor: examples.residual_actor has no class 'X'; it defines "
                               "the classes ResidualBlock, ResidualActor")
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(("argv", "line"), [
    (["--algo", "td3", "--alpha", "0.1"],
     "--alpha is a setting of SAC and CrossQ alone, which --algo td3 does not read"),
    (["--algo", "ddpg", "--policy-noise", "0.1"],
     "--policy-noise is a setting of TD3 alone, which --algo ddpg does not read"),
    (["--algo", "sac", "--exploration-noise", "0.3"],
     "--exploration-noise is a setting of TD3 and DDPG alone, which --algo sac does not read"),
])
def test_a_setting_of_some_off_policy_algorithms_is_refused_by_the_others(
        argv: list[str], line: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(["--env", "Pendulum-v1", *argv])
    assert str(info.value) == line + ": leave it out"
    assert load_config(["--env", "Pendulum-v1", *argv[:2]])  # the algorithm alone is fine
