"""Config files: the shipped YAML an env and algo pick, and the one line for a file that
cannot be read."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import pytest
from configtools import one_line_error, write

from rl_graphstep.algorithms import OFF_POLICY_ALGORITHMS as ALGORITHMS
from rl_graphstep.core.errors import ConfigError
from rl_graphstep.run.flags import load_config
from rl_graphstep.settings import configfile
from rl_graphstep.settings.config import config_from_dict
from rl_graphstep.settings.configfile import (
    DuplicateKeyError,
    default_config_file,
    load_yaml,
    read_config_file,
)
from rl_graphstep.settings.sweepfile import read_sweep_file


def test_no_arguments_use_the_pendulum_file() -> None:
    cfg = load_config([])
    assert cfg.env_id == "Pendulum-v1"
    assert (cfg.total_timesteps, cfg.learning_starts, cfg.buffer_size) == (15000, 1000, 100_000)


def test_env_picks_its_default_file() -> None:
    pendulum = default_config_file("Pendulum-v1", "sac")
    mujoco = default_config_file("HalfCheetah-v5", "sac")
    assert pendulum is not None and pendulum.name == "sac_pendulum.yaml"
    assert mujoco is not None and mujoco.name == "sac_mujoco.yaml"
    assert default_config_file("Walker2d-v4").name == "sac_mujoco.yaml"
    assert default_config_file("CartPole-v1", "sac") is None
    assert default_config_file("MyCustomEnv-v0", "sac") is None
    cfg = load_config(["--env-id", "HalfCheetah-v5"])
    assert (cfg.env_id, cfg.learning_starts, cfg.total_timesteps) == ("HalfCheetah-v5", 5000, 10**6)


def test_missing_file() -> None:
    one_line_error(
        ["--config", "nope/missing.yaml"], "config file 'nope/missing.yaml' does not exist"
    )


def test_bad_yaml_names_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, "batch_size: 128\ngamma: [0.9\ntau: 0.1\n")
    one_line_error(["--config", path], r"is not valid YAML at line \d+, column \d+")


def test_non_mapping_yaml(tmp_path: Path) -> None:
    path = write(tmp_path, "- batch_size\n- 128\n")
    one_line_error(["--config", path], "must be a mapping of key: value lines, got a YAML list")


CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.mark.parametrize(
    ("algo", "env_id"), list(itertools.product(ALGORITHMS, ["Pendulum-v1", "HalfCheetah-v5"]))
)
def test_shipped_files_load_and_validate(algo: str, env_id: str) -> None:
    path = default_config_file(env_id, algo)
    assert path is not None
    family = "pendulum" if env_id == "Pendulum-v1" else "mujoco"
    assert path.name == f"{algo}_{family}.yaml"
    values = read_config_file(path)
    assert values["algo"] == algo
    cfg = config_from_dict(values, source=str(path))
    # CrossQ's actor waits three critic steps (the paper's policy delay), the others two.
    assert (cfg.batch_size, cfg.gamma, cfg.tau, cfg.policy_frequency) == (
        256, 0.99, 0.005, 3 if algo == "crossq" else 2)
    # And through the command line, as a run would get it.
    assert load_config(["--algo", algo, "--env", env_id]) == dataclasses.replace(cfg, env_id=env_id)


def test_every_shipped_file_is_picked_by_some_algo_and_env() -> None:
    shipped = {p.name for p in CONFIGS.glob("*.yaml")}
    expected = {f"{a}_{fam}.yaml" for a in ALGORITHMS for fam in ("pendulum", "mujoco")}
    # Chosen by name (--config sac_mujoco_parallel), never picked by an env.
    assert shipped == expected | {"ppo_mujoco.yaml", "ppo_classic.yaml",
                                  "sac_mujoco_parallel.yaml"}


def test_the_parallel_file_is_the_mujoco_file_in_the_many_env_regime() -> None:
    """sac_mujoco_parallel.yaml is sac_mujoco.yaml with the regime's six settings, so the two
    compare the regime alone; --config takes it by name, with or without .yaml."""
    plain = read_config_file(default_config_file("Humanoid-v5"))
    parallel = read_config_file("sac_mujoco_parallel")
    regime = {"num_envs": 32, "vec_env": "shared", "batch_size": 2048, "updates_per_step": 4,
              "tf32": True}
    assert parallel == {**plain, **regime}
    cfg = load_config(["--config", "sac_mujoco_parallel.yaml", "--env", "Humanoid-v5"])
    assert cfg == config_from_dict({**parallel, "env_id": "Humanoid-v5"})
    assert cfg.learning_starts < cfg.total_timesteps and cfg.batch_size <= cfg.buffer_size


def test_a_config_name_is_a_file_here_before_a_shipped_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "batch_size: 64\n", name="sac_mujoco_parallel")
    assert load_config(["--config", "sac_mujoco_parallel"]).batch_size == 64


def test_an_unknown_config_name_lists_the_shipped_ones() -> None:
    message = one_line_error(["--config", "sac_mujoco_paralel"], "does not exist")
    assert message.startswith("config file 'sac_mujoco_paralel' does not exist, and no shipped "
                              "config has that name (shipped: crossq_mujoco, ")
    assert "sac_mujoco_parallel," in message


def test_a_folder_given_as_the_config_is_not_a_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sac_mujoco").mkdir()  # a folder here, not the shipped file of that name
    one_line_error(["--config", "sac_mujoco"], r"^config file 'sac_mujoco' is not a file$")


def test_mujoco_file_values() -> None:
    cfg = config_from_dict(read_config_file(default_config_file("Hopper-v5")))
    assert (cfg.buffer_size, cfg.learning_starts, cfg.total_timesteps) == (10**6, 5000, 10**6)
    assert (cfg.policy_lr, cfg.q_lr) == (3e-4, 1e-3)


def test_td3_flags_pick_the_td3_pendulum_file() -> None:
    cfg = load_config(["--algo", "td3", "--env", "Pendulum-v1"])
    assert (cfg.algo, cfg.total_timesteps, cfg.learning_starts) == ("td3", 15000, 1000)
    assert (cfg.policy_noise, cfg.noise_clip, cfg.exploration_noise) == (0.2, 0.5, 0.1)
    assert (cfg.policy_frequency, cfg.buffer_size, cfg.policy_lr) == (2, 100_000, 3e-4)
    # The algo still decides the file when only --algo is given (Pendulum-v1 is the default env).
    assert load_config(["--algo", "td3"]).total_timesteps == 15000
    assert load_config(["--algo", "ddpg"]).total_timesteps == 20000


def test_ddpg_flags_pick_the_ddpg_mujoco_file() -> None:
    cfg = load_config(["--algo", "ddpg", "--env", "HalfCheetah-v5"])
    assert (cfg.algo, cfg.env_id) == ("ddpg", "HalfCheetah-v5")
    assert (cfg.learning_starts, cfg.total_timesteps, cfg.buffer_size) == (25000, 10**6, 10**6)
    assert (cfg.policy_lr, cfg.q_lr, cfg.exploration_noise) == (3e-4, 3e-4, 0.1)
    assert default_config_file("Walker2d-v4", "td3").name == "td3_mujoco.yaml"


def test_unknown_algo_picks_no_file() -> None:
    assert default_config_file("Pendulum-v1", "a2c") is None
    assert default_config_file("Pendulum-v1", "../configs/sac") is None


def test_a_source_tree_not_installed_finds_its_configs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run straight from a checkout (PYTHONPATH, no install), the tuned files are the
    checkout's `configs/`: a wrong path there trained Pendulum with the bare defaults."""
    def not_installed(name: str) -> None:
        raise ModuleNotFoundError(name)
    monkeypatch.setattr(configfile.importlib.resources, "files", not_installed)
    assert Path(str(configfile.configs_dir())) == Path(__file__).resolve().parents[2] / "configs"
    cfg = load_config(["--env", "Pendulum-v1"])
    assert (cfg.total_timesteps, cfg.buffer_size) == (15000, 100000)


def test_missing_configs_are_an_error_not_the_bare_defaults(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def not_installed(name: str) -> None:
        raise ModuleNotFoundError(name)
    monkeypatch.setattr(configfile.importlib.resources, "files", not_installed)
    monkeypatch.setattr(configfile, "__file__", str(tmp_path / "a" / "settings" / "configfile.py"))
    with pytest.raises(FileNotFoundError, match="the shipped configs are missing"):
        load_config(["--env", "Pendulum-v1"])


def test_the_shipped_configs_could_all_update() -> None:
    for algo, env_id in itertools.product(ALGORITHMS, ("Pendulum-v1", "HalfCheetah-v5")):
        cfg = load_config(["--algo", algo, "--env", env_id])
        assert cfg.learning_starts < cfg.total_timesteps
        assert cfg.batch_size <= min(cfg.buffer_size, cfg.total_timesteps - 1)


# ------------------------------------------------------------------ a key given twice


@pytest.mark.parametrize(("text", "where"), [
    ("batch_size: 64\ngamma: 0.9\nbatch_size: 128\n", "key 'batch_size' appears twice (lines 1 "
                                                      "and 3)"),
    ("actor_kwargs:\n  width: 3\n  depth: 2\n  width: 4\n", "key 'width' appears twice (lines 2 "
                                                           "and 4)"),
    ("critic_kwargs: {depth: 2, depth: 3}\n", "key 'depth' appears twice (line 1, columns 17 "
                                              "and 27)"),
])
def test_a_key_given_twice_in_a_config_file_names_both_lines(tmp_path: Path, text: str,
                                                              where: str) -> None:
    """YAML keeps a repeated key's last value; the line a user edited may be the first."""
    path = write(tmp_path, text)
    assert one_line_error(["--config", path], "appears twice") == (
        f"config file {path!r}: {where}; keep one of them")


def test_a_key_given_twice_in_a_sweep_file_names_both_lines(tmp_path: Path) -> None:
    path = write(tmp_path, "num_samples: 1\nbase:\n  q_lr: 0.001\n  batch_size: 64\n"
                           "  q_lr: 0.01\n", name="sweep.yaml")
    with pytest.raises(ConfigError) as info:
        read_sweep_file(path)
    assert str(info.value) == (f"sweep file {path!r}: key 'q_lr' appears twice (lines 3 and 5); "
                               "keep one of them")
    path = write(tmp_path, "search:\n  q_lr: [0.1, 0.01]\nsearch:\n  tau: [0.1]\n",
                 name="sweep.yaml")
    with pytest.raises(ConfigError, match=r"key 'search' appears twice \(lines 1 and 3\)"):
        read_sweep_file(path)


def test_the_loader_keeps_merges_and_distinct_keys() -> None:
    """A ``<<`` merge's keys may be overridden (that is what merging is for)."""
    assert load_yaml("a: &a {width: 1, depth: 2}\nb:\n  <<: *a\n  width: 3\n") == {
        "a": {"width": 1, "depth": 2}, "b": {"width": 3, "depth": 2}}
    assert load_yaml("x: 1\ny: {x: 2}\n") == {"x": 1, "y": {"x": 2}}
    with pytest.raises(DuplicateKeyError, match=r"^key 'x' appears twice \(lines 3 and 4\)$"):
        load_yaml("y:\n  - {x: 1}\n  - {x: 2,\n     x: 3}\n")


def test_ppo_picks_its_classic_and_mujoco_files(monkeypatch: pytest.MonkeyPatch) -> None:
    """CleanRL's ppo.py settings for CartPole/Acrobot, ppo_continuous_action.py's for MuJoCo;
    the checkout's configs/ (the installed package may be another checkout's)."""
    def not_installed(name: str) -> None:
        raise ModuleNotFoundError(name)
    monkeypatch.setattr(configfile.importlib.resources, "files", not_installed)
    assert configfile.env_family("Acrobot-v1") == "classic"
    assert configfile.env_family("MountainCarContinuous-v0") == "classic"
    assert default_config_file("CartPole-v1", "sac") is None  # no SAC file for the family
    cfg = load_config(["--env", "CartPole-v1", "--algo", "ppo"])
    assert (cfg.num_envs, cfg.num_steps, cfg.num_minibatches, cfg.update_epochs) == (4, 128, 4, 4)
    assert (cfg.learning_rate, cfg.ent_coef, cfg.total_timesteps) == (2.5e-4, 0.01, 500_000)
    assert (cfg.max_grad_norm, cfg.hidden_sizes) == (0.5, (64, 64))
    assert (cfg.obs_norm, cfg.reward_norm) == (False, False)  # CleanRL's ppo.py has neither
    cfg = load_config(["--env", "HalfCheetah-v5", "--algo", "ppo"])
    rollout = (cfg.num_envs, cfg.num_steps, cfg.num_minibatches, cfg.update_epochs)
    assert rollout == (1, 2048, 32, 10)
    assert (cfg.learning_rate, cfg.ent_coef, cfg.total_timesteps) == (3e-4, 0.0, 1_000_000)
    assert (cfg.gae_lambda, cfg.clip_coef, cfg.vf_coef) == (0.95, 0.2, 0.5)
    assert cfg.hidden_sizes == (64, 64)
    # ppo_continuous_action.py's NormalizeObservation and NormalizeReward wrappers.
    assert (cfg.obs_norm, cfg.reward_norm) == (True, True)
