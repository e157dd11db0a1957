"""Config: defaults, typed values and their checks (from Python, YAML and a saved run), the
plain-value form and the tensorboard table."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import pytest
from configtools import one_line_error, write
from processtools import run_python

from rl_graphstep import algorithms
from rl_graphstep.algorithms import OFF_POLICY_ALGORITHMS as ALGORITHMS
from rl_graphstep.core.errors import ConfigError
from rl_graphstep.run.flags import load_config
from rl_graphstep.settings.config import (
    REMOVED,
    Config,
    config_from_dict,
    config_to_dict,
    saved_config_values,
)


def test_defaults_follow_cleanrl() -> None:
    cfg = Config()
    assert (cfg.env_id, cfg.algo, cfg.seed, cfg.total_timesteps) == ("Pendulum-v1", "sac", 1, 10**6)
    assert (cfg.batch_size, cfg.buffer_size, cfg.learning_starts) == (256, 10**6, 5000)
    assert (cfg.gamma, cfg.tau, cfg.policy_lr, cfg.q_lr) == (0.99, 0.005, 3e-4, 1e-3)
    assert (cfg.policy_frequency, cfg.target_network_frequency) == (2, 1)
    assert (cfg.alpha, cfg.autotune, cfg.hidden_sizes) == (0.2, True, (256, 256))
    assert (cfg.device, cfg.graph, cfg.run_name) == ("auto", "auto", None)
    assert all(f.metadata["help"] for f in dataclasses.fields(Config))


def test_yaml_1_1_exponents_are_numbers(tmp_path: Path) -> None:
    # PyYAML reads 3e-4 and 1e6 as strings; they must still work.
    cfg = load_config(["--config", write(tmp_path, "policy_lr: 3e-4\nbuffer_size: 1e6\n")])
    assert (cfg.policy_lr, cfg.buffer_size) == (3e-4, 1_000_000)


def test_on_off_switches_read_yaml_1_1_booleans(tmp_path: Path) -> None:
    # PyYAML reads a bare `off` as False, and configs saved when --action-stream was a bool
    # switch hold true/false: both mean on/off, and `auto` stays a string.
    path = write(tmp_path, "graph: off\ncompile: on\naction_stream: false\n")
    cfg = load_config(["--config", path])
    assert (cfg.graph, cfg.compile, cfg.action_stream) == ("off", "on", "off")
    assert Config(action_stream=True).action_stream == "on"
    one_line_error(["--config", write(tmp_path, "action_stream: 1\n")],
                   r"action_stream must be a string, got 1")


def test_unknown_key_suggests_the_close_one(tmp_path: Path) -> None:
    path = write(tmp_path, "batchsize: 128\n")
    message = one_line_error(["--config", path], "unknown config key 'batchsize'")
    assert f"in {path}" in message
    assert "did you mean 'batch_size'?" in message
    assert "valid keys: env_id, algo" in message


def test_unknown_key_without_close_match(tmp_path: Path) -> None:
    message = one_line_error(["--config", write(tmp_path, "zzz: 1\n")], "unknown config key 'zzz'")
    assert "did you mean" not in message


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("batch_size: abc\n", r"batch_size must be an int, got 'abc'"),
        ("batch_size: 12.5\n", r"batch_size must be an int, got 12.5"),
        ("autotune: 1\n", r"autotune must be true or false, got 1"),
        ("tau: fast\n", r"tau must be a number, got 'fast'"),
        ("hidden_sizes: 64\n", r"hidden_sizes must be a list of ints, got 64"),
        ("env_id: 3\n", r"env_id must be a string, got 3"),
    ],
)
def test_wrong_type_in_yaml(tmp_path: Path, text: str, match: str) -> None:
    one_line_error(["--config", write(tmp_path, text)], match)


def test_bad_value_in_yaml_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "tau: 2.0\n")
    one_line_error(["--config", path], rf"tau must be in \(0, 1\], got 2.0 in {path}")


def test_new_field_defaults() -> None:
    cfg = Config()
    assert (cfg.policy_noise, cfg.noise_clip, cfg.exploration_noise) == (0.2, 0.5, 0.1)
    assert (cfg.actor, cfg.critic, cfg.actor_kwargs, cfg.critic_kwargs) == (None, None, {}, {})
    # Each Config gets its own dict.
    assert Config().actor_kwargs is not cfg.actor_kwargs
    # Plain MLPs and Adam, as CleanRL's.
    assert (cfg.layer_norm, cfg.weight_decay) == (False, 0.0)
    flagged = load_config(["--layer-norm", "--weight-decay", "0.01"])
    assert (flagged.layer_norm, flagged.weight_decay) == (True, 0.01)


def test_negative_noise_in_yaml_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "noise_clip: -1\n")
    one_line_error(
        ["--config", path], rf"noise_clip must be a finite number >= 0, got -1.0 in {path}"
    )


@pytest.mark.parametrize("text", ["actor_kwargs: 3\n", "actor_kwargs: [width]\n"])
def test_yaml_kwargs_must_be_a_mapping(tmp_path: Path, text: str) -> None:
    one_line_error(["--config", write(tmp_path, text)], "actor_kwargs must be a mapping")


def test_config_with_kwargs_is_hashable_and_owns_its_dicts() -> None:
    kwargs = {"width": 64, "sizes": [1, 2]}
    cfg = Config(actor_kwargs=kwargs)
    kwargs["width"] = 1
    assert cfg.actor_kwargs["width"] == 64
    same = Config(actor_kwargs={"sizes": [1, 2], "width": 64})
    assert cfg == same and hash(cfg) == hash(same)
    assert hash(Config()) == hash(Config())
    assert len({cfg, same, Config()}) == 2


def test_dict_round_trip() -> None:
    cfg = Config(
        batch_size=64, hidden_sizes=(32, 32), run_name="a|b", critic_kwargs={"sizes": (4, 4)}
    )
    data = config_to_dict(cfg)
    assert data["hidden_sizes"] == [32, 32]
    # Tuples inside the kwargs come out as YAML lists too (and stay as given in the Config).
    assert data["critic_kwargs"] == {"sizes": [4, 4]}
    assert cfg.critic_kwargs == {"sizes": (4, 4)}
    assert config_from_dict(data) == dataclasses.replace(cfg, critic_kwargs={"sizes": [4, 4]})


def test_config_is_frozen_and_checked_on_construction() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Config().seed = 2  # type: ignore[misc]
    with pytest.raises(ConfigError, match="batch_size must be an int, got 'x'"):
        Config(batch_size="x")  # type: ignore[arg-type]


def test_a_run_that_could_never_update_is_refused_from_yaml_and_python(tmp_path: Path) -> None:
    path = write(tmp_path, "total_timesteps: 500\nlearning_starts: 1000\n")
    assert one_line_error(["--config", path], "first update").startswith(
        "--learning-starts 1000 is not below --total-timesteps 500")
    with pytest.raises(ConfigError, match="--batch-size 64 is above --buffer-size 32"):
        config_from_dict({"batch_size": 64, "buffer_size": 32})
    with pytest.raises(ConfigError, match="--learning-starts 5000 is not below"):
        Config(total_timesteps=5000)  # the default learning_starts is 5000


@pytest.mark.parametrize(("key", "line"), [
    ("async_envs", "was replaced by vec_env: async (vec_env: auto is the default)"),
    ("env_worker", "was removed: it never measured faster than the default; use vec_env: "
                   "async to step the environments in subprocesses"),
    ("overlap", "was removed: the loop always steps the environments while the GPU updates"),
], ids=lambda value: value if "_" in value or value == "overlap" else "")
def test_a_removed_yaml_key_names_its_replacement(tmp_path: Path, key: str, line: str) -> None:
    path = write(tmp_path, f"batch_size: 64\n{key}: true\n")
    assert one_line_error(["--config", path], "^config key") == (
        f"config key {key!r} in {path} {line}")


def old_saved_config(**old: bool) -> dict[str, object]:
    """A config as checkpoints saved it before --vec-env: the three bools, no vec_env."""
    saved = config_to_dict(Config(num_envs=2))
    del saved["vec_env"]
    return {**saved, "async_envs": False, "env_worker": False, "overlap": True, **old}


def test_a_checkpoint_config_from_before_vec_env_resumes() -> None:
    resume = ["--resume", "runs/x"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning but for the env worker
        cfg = load_config(resume, base=old_saved_config(async_envs=True))
        assert cfg == Config(num_envs=2, vec_env="async", resume="runs/x")
        assert load_config([*resume, "--vec-env", "sync"],
                           base=old_saved_config(async_envs=True)).vec_env == "sync"
        assert load_config(resume, base=old_saved_config(overlap=False)) == dataclasses.replace(
            cfg, vec_env="sync")
    with pytest.warns(UserWarning, match=r"^this run stepped its environments in the env "
                      r"worker, which was removed; they now step in this process "
                      r"\(--vec-env sync\)$"):
        cfg = load_config(resume, base=old_saved_config(env_worker=True))
    assert cfg.vec_env == "sync"


def test_a_checkpoint_config_from_before_vec_env_evaluates() -> None:
    """evaluate's path: saved_config_values then config_from_dict, without warnings."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for old, vec_env in (({"async_envs": True}, "async"), ({"env_worker": True}, "sync")):
            values = saved_config_values(old_saved_config(**old))
            assert not set(REMOVED) & set(values)
            assert config_from_dict(values) == Config(num_envs=2, vec_env=vec_env)


def test_settings_import_no_algorithm_and_the_command_line_lists_the_names() -> None:
    """Settings sit below the algorithms that read them; the registry's names come to the
    command line without importing an algorithm's module."""
    code = ("import sys, rl_graphstep.settings.config, rl_graphstep.settings.configfile\n"
            "print(sorted(m for m in sys.modules if m.startswith('rl_graphstep.algorithms')))\n"
            "import rl_graphstep.run.flags as f\n"
            "algo = next(a for a in f.build_parser()._actions if a.dest == 'algo')\n"
            "print(algo.metavar, [m for m in sys.modules "
            "if m.startswith('rl_graphstep.algorithms.')])")
    out = run_python("-c", code, capture_output=True, text=True, check=True).stdout
    assert out == "[]\n{sac,td3,ddpg,crossq,ppo} []\n"
    assert {name: cls.name for name, cls in ALGORITHMS.items()} == {n: n for n in ALGORITHMS}
    # ALGORITHMS here is the off-policy registry; the whole one adds PPO.
    assert "ppo" not in ALGORITHMS and len(ALGORITHMS) == 4
    assert list(algorithms.ALGORITHMS) == ["sac", "td3", "ddpg", "crossq", "ppo"]
    assert algorithms.ALGORITHMS["ppo"].name == "ppo" and algorithms.is_on_policy("ppo")


@pytest.mark.parametrize(("argv", "message"), [
    (["--updates-per-step", "0"], "--updates-per-step must be a positive int, got 0"),
    (["--compile", "maybe"], "--compile must be one of auto, on, off, got 'maybe'"),
    (["--weight-decay", "-0.1"], r"^--weight-decay must be a finite number >= 0, got -0.1$"),
    (["--weight-decay", "inf"], r"^--weight-decay must be a finite number >= 0, got inf$"),
])
def test_new_flags_are_checked(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(argv)


# ------------------------------------------------------------- the distributional critic


def test_critic_atoms_and_the_support_from_flags_and_yaml(tmp_path: Path) -> None:
    assert (Config().critic_atoms, Config().v_min, Config().v_max) == (0, None, None)
    # A negative bound is a value, not a flag.
    cfg = load_config(["--critic-atoms", "51", "--v-min", "-1700", "--v-max", "0"])
    assert (cfg.critic_atoms, cfg.v_min, cfg.v_max) == (51, -1700.0, 0.0)
    path = write(tmp_path, "critic_atoms: 101\nv_min: -2.5e2\nv_max: 250\n")
    cfg = load_config(["--config", path])
    assert (cfg.critic_atoms, cfg.v_min, cfg.v_max) == (101, -250.0, 250.0)
    assert config_from_dict(config_to_dict(cfg)) == cfg


@pytest.mark.parametrize(("argv", "message"), [
    (["--critic-atoms", "1"], r"^--critic-atoms must be 0 \(the scalar critic\) or at least 2 "
                              r"atoms \(51 and 101 are typical\), got 1$"),
    (["--critic-atoms", "-5"], r"^--critic-atoms must be 0 .* got -5$"),
    (["--critic-atoms", "5001"], r"^--critic-atoms must be at most 1024, got 5001$"),
    (["--critic-atoms", "51"], r"^--critic-atoms 51 needs the support's bounds --v-min and "
                               r"--v-max \(e.g. --v-min -1700 --v-max 0 for Pendulum-v1; \|Q\| is "
                               r"at most about max\|r\| / \(1 - gamma\) = max\|r\| x 100\)$"),
    (["--critic-atoms", "51", "--v-max", "10"], r"^--critic-atoms 51 needs the support's bounds"),
    (["--critic-atoms", "51", "--v-min", "10", "--v-max", "-10"],
     r"^--v-min 10 must be below --v-max -10: they are the lowest and highest values of the "
     r"critic's support \(\|Q\| is at most about max\|r\| / \(1 - gamma\) = max\|r\| x 100\)$"),
    (["--critic-atoms", "51", "--v-min", "3", "--v-max", "3", "--gamma", "0.9"],
     r"^--v-min 3 must be below --v-max 3: .* = max\|r\| x 10\)$"),
    (["--critic-atoms", "51", "--v-min=-inf", "--v-max", "0"],
     r"^--v-min must be a finite number, got -inf$"),
    (["--v-min", "-10"], r"^--v-min is a bound of a distributional critic's support, but "
                         r"--critic-atoms is 0 \(the scalar critic\); give --critic-atoms 51 "
                         r"\(or 101\) too, or drop --v-min$"),
    (["--v-min", "-10", "--v-max", "10"], r"^--v-min and --v-max are the bounds of a "
                                          r"distributional critic's support, but .* or drop "
                                          r"--v-min and --v-max$"),
])
def test_critic_atoms_and_bounds_are_checked_in_one_line(argv: list[str], message: str) -> None:
    one_line_error(argv, message)


def test_a_bad_bound_in_yaml_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "critic_atoms: 51\nv_min: low\nv_max: 0\n")
    one_line_error(["--config", path], r"^v_min must be a number or null, got 'low' in ")


# ----------------------------------------------------------------------------- seed groups


def test_the_seed_list_of_a_single_run_a_count_and_a_list() -> None:
    assert Config(seed=4).seed_list == (4,)
    assert Config(seed=4, num_seeds=3).seed_list == (4, 5, 6)
    listed = Config(seeds=[3, 5, 7])
    # num_seeds is the group's size however it was given; the list keeps its order.
    assert (listed.seed_list, listed.num_seeds, listed.seeds) == ((3, 5, 7), 3, (3, 5, 7))
    assert Config(seeds=[7, 3]).seed_list == (7, 3)


def test_a_seed_group_round_trips_and_stays_hashable() -> None:
    cfg = Config(seeds=[3, 5, 7])
    assert config_from_dict(config_to_dict(cfg)) == cfg
    assert config_to_dict(cfg)["seeds"] == [3, 5, 7]
    assert hash(cfg) == hash(Config(seeds=(3, 5, 7)))
    # A saved run from before the seed group has neither key: a single run.
    old = {k: v for k, v in config_to_dict(Config()).items() if k not in ("num_seeds", "seeds")}
    assert config_from_dict(old).seed_list == (1,)


@pytest.mark.parametrize(("values", "message"), [
    ({"num_seeds": 0}, "--num-seeds must be a positive int, got 0"),
    ({"num_seeds": -2}, "--num-seeds must be a positive int, got -2"),
    ({"num_seeds": 65}, "--num-seeds must be at most 64, got 65: past that one batched update"),
    ({"seeds": []}, "--seeds must be one or more seeds, got none"),
    ({"seeds": [3, 5, 3]}, "--seeds must differ from each other, got 3 twice in 3 5 3"),
    ({"seeds": [1, -1]}, "--seeds must each be in [0, 4294967295] (numpy's seed range), got -1"),
    ({"seeds": [2**32]}, "--seeds must each be in [0, 4294967295] (numpy's seed range), got "
                         "4294967296"),
    ({"seeds": list(range(65))}, "--seeds must be at most 64 seeds, got 65"),
    ({"seeds": [3, 5], "num_seeds": 3}, "--seeds 3 5 and --num-seeds 3 cannot both be given"),
    ({"seed": 2**32 - 2, "num_seeds": 3},
     "--num-seeds 3 from --seed 4294967294 runs seeds up to 4294967296, above 4294967295"),
])
def test_bad_seed_groups_are_one_line(values: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        Config(**values)  # type: ignore[arg-type]
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


def test_the_largest_groups_and_seeds_are_allowed() -> None:
    assert Config(seed=2**32 - 2, num_seeds=2).seed_list == (2**32 - 2, 2**32 - 1)
    assert len(Config(num_seeds=64).seed_list) == 64
    assert Config(seeds=[0, 2**32 - 1]).num_seeds == 2
    assert Config(seeds=[3, 5, 7], num_seeds=3).seed_list == (3, 5, 7)  # they agree


def test_seed_groups_from_yaml(tmp_path: Path) -> None:
    assert load_config(["--config", write(tmp_path, "seeds: [3, 5, 7]\n")]).seed_list == (3, 5, 7)
    assert load_config(["--config", write(tmp_path, "num_seeds: 2\nseed: 4\n")]).seed_list == (
        4, 5)
    with pytest.raises(ConfigError, match=r"seeds must be a list of ints or null, got 3 in"):
        load_config(["--config", write(tmp_path, "seeds: 3\n")])
    with pytest.raises(ConfigError, match=r"^seeds must differ from each other, got 1 twice in "
                                          r"1 1 in .*x\.yaml$"):
        load_config(["--config", write(tmp_path, "seeds: [1, 1]\n")])
