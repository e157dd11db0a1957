"""Config: defaults, YAML and flag precedence, env-picked files, help text and one-line errors."""

from __future__ import annotations

import dataclasses
import itertools
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from rl_graphstep.algorithms import ALGORITHMS
from rl_graphstep.config import (
    FIELDS,
    REMOVED,
    Config,
    build_parser,
    config_from_dict,
    config_to_dict,
    default_config_file,
    load_config,
    read_config_file,
    removed_flags,
    saved_config_values,
    to_markdown_table,
)
from rl_graphstep.errors import ConfigError


def write(tmp_path: Path, text: str, name: str = "x.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def one_line_error(argv: list[str], match: str) -> str:
    with pytest.raises(ConfigError, match=match) as info:
        load_config(argv)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_defaults_follow_cleanrl() -> None:
    cfg = Config()
    assert (cfg.env_id, cfg.algo, cfg.seed, cfg.total_timesteps) == ("Pendulum-v1", "sac", 1, 10**6)
    assert (cfg.batch_size, cfg.buffer_size, cfg.learning_starts) == (256, 10**6, 5000)
    assert (cfg.gamma, cfg.tau, cfg.policy_lr, cfg.q_lr) == (0.99, 0.005, 3e-4, 1e-3)
    assert (cfg.policy_frequency, cfg.target_network_frequency) == (2, 1)
    assert (cfg.alpha, cfg.autotune, cfg.hidden_sizes) == (0.2, True, (256, 256))
    assert (cfg.device, cfg.graph, cfg.run_name) == ("auto", "auto", None)
    assert all(f.metadata["help"] for f in dataclasses.fields(Config))


def test_no_arguments_use_the_pendulum_file() -> None:
    cfg = load_config([])
    assert cfg.env_id == "Pendulum-v1"
    assert (cfg.total_timesteps, cfg.learning_starts, cfg.buffer_size) == (15000, 1000, 100_000)


def test_yaml_overrides_defaults(tmp_path: Path) -> None:
    path = write(tmp_path, "batch_size: 128\ngamma: 0.9\nhidden_sizes: [64, 32]\nautotune: no\n")
    cfg = load_config(["--config", path])
    assert (cfg.batch_size, cfg.gamma, cfg.hidden_sizes, cfg.autotune) == (
        128,
        0.9,
        (64, 32),
        False,
    )
    # A --config file replaces the env's shipped file: untouched keys keep dataclass defaults.
    assert cfg.total_timesteps == 1_000_000


def test_yaml_1_1_exponents_are_numbers(tmp_path: Path) -> None:
    # PyYAML reads 3e-4 and 1e6 as strings; they must still work.
    cfg = load_config(["--config", write(tmp_path, "policy_lr: 3e-4\nbuffer_size: 1e6\n")])
    assert (cfg.policy_lr, cfg.buffer_size) == (3e-4, 1_000_000)


@pytest.mark.parametrize(("argv", "expected"), [
    ([], "auto"),
    (["--action-stream"], "on"),  # the bare flag of the former bool switch
    (["--action-stream", "off"], "off"),
    (["--no-action-stream"], "off"),
    (["--action-stream", "auto"], "auto"),
])
def test_action_stream_flags(argv: list[str], expected: str) -> None:
    assert load_config(argv).action_stream == expected


def test_every_on_off_switch_has_both_bare_flags() -> None:
    assert (load_config(["--no-graph"]).graph, load_config(["--compile"]).compile) == ("off", "on")
    assert load_config(["--no-compile", "--graph", "auto"]).compile == "off"


def test_on_off_switches_read_yaml_1_1_booleans(tmp_path: Path) -> None:
    # PyYAML reads a bare `off` as False, and configs saved when --action-stream was a bool
    # switch hold true/false: both mean on/off, and `auto` stays a string.
    path = write(tmp_path, "graph: off\ncompile: on\naction_stream: false\n")
    cfg = load_config(["--config", path])
    assert (cfg.graph, cfg.compile, cfg.action_stream) == ("off", "on", "off")
    assert Config(action_stream=True).action_stream == "on"
    one_line_error(["--config", write(tmp_path, "action_stream: 1\n")],
                   r"action_stream must be a string, got 1")


def test_flags_override_yaml(tmp_path: Path) -> None:
    path = write(tmp_path, "batch_size: 128\ntau: 0.01\n")
    cfg = load_config(["--config", path, "--batch-size", "512", "--no-progress"])
    assert (cfg.batch_size, cfg.tau, cfg.progress) == (512, 0.01, False)


def test_flags_override_the_env_file() -> None:
    cfg = load_config(["--env", "Pendulum-v1", "--total-timesteps", "2000", "--hidden-sizes", "8"])
    assert (cfg.total_timesteps, cfg.learning_starts, cfg.hidden_sizes) == (2000, 1000, (8,))


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


def test_help_lists_every_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        load_config(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for f in dataclasses.fields(Config):
        assert "--" + f.name.replace("_", "-") in out
        assert f.metadata["help"].split()[0] in out
    assert "--config" in out and "--env" in out and "--no-autotune" in out
    assert "(default: 256)" in out


def help_text(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """--help's output with argparse's line wrapping undone."""
    with pytest.raises(SystemExit) as info:
        load_config(argv)
    assert info.value.code == 0
    out, err = capsys.readouterr()
    assert err == ""
    return " ".join(out.split())


def test_help_shows_the_defaults_of_the_env_yaml(capsys: pytest.CaptureFixture[str]) -> None:
    out = help_text(["--env", "Pendulum-v1", "--help"], capsys)
    assert ("Defaults shown for --env Pendulum-v1 --algo sac: configs/sac_pendulum.yaml over "
            "the built-in values.") in out
    assert ("random actions before learning (default: 1000, from configs/sac_pendulum.yaml; "
            "without it: 5000)") in out
    assert ("environment steps of the whole run (default: 15000, from "
            "configs/sac_pendulum.yaml; without it: 1000000)") in out
    assert "rows per gradient update (default: 256)" in out  # the same in both
    assert "algorithm, one of sac, td3, ddpg (default: sac)" in out
    out = help_text(["--help", "--algo", "td3", "--env", "HalfCheetah-v5"], capsys)
    assert "(default: 25000, from configs/td3_mujoco.yaml; without it: 5000)" in out


def test_help_shows_the_config_file_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)  # a short path: argparse would wrap a long one at its hyphens
    path = Path(write(tmp_path, "env_id: HalfCheetah-v5\nlearning_starts: 777\n")).name
    out = help_text(["--config", path, "-h"], capsys)
    assert f"Defaults shown: {path} over the built-in values." in out
    assert f"(default: HalfCheetah-v5, from {path}; without it: Pendulum-v1)" in out
    assert f"(default: 777, from {path}; without it: 5000)" in out


@pytest.mark.parametrize(("argv", "note"), [
    (["--config", "nope/missing.yaml"],
     "Built-in defaults shown: config file 'nope/missing.yaml' does not exist."),
    (["--env", "CartPole-v1"],
     "Built-in defaults shown: no shipped YAML for --env CartPole-v1 --algo sac."),
    (["--algo", "ppo"],
     "Built-in defaults shown: --algo must be one of sac, td3, ddpg, got 'ppo'."),
    (["--resume", "runs/x"],
     "Built-in defaults shown; with --resume the run's saved config replaces them."),
])
def test_help_without_a_file_to_show_says_why(argv: list[str], note: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    out = help_text([*argv, "--help"], capsys)
    assert note in out
    assert "random actions before learning (default: 5000)" in out


def test_a_bad_command_line_with_help_is_the_parser_error(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match=r"^--env-id/--env needs a value$"):
        load_config(["--env", "--help"])
    assert capsys.readouterr().out == ""  # no help printed either


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


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--tau", "2"], "--tau must be in (0, 1], got 2.0"),
        (["--batch-size", "-1"], "--batch-size must be a positive int, got -1"),
        (["--device", "gpu"], "--device must be one of auto, cpu, cuda, got 'gpu'"),
        (["--graph", "maybe"], "--graph must be one of auto, on, off, got 'maybe'"),
        (["--action-stream", "yes"],
         "--action-stream must be one of auto, on, off, got 'yes'"),
        (["--algo", "ppo"], "--algo must be one of sac, td3, ddpg, got 'ppo'"),
        (["--vec-env", "subprocess"], "--vec-env must be one of sync, async, got 'subprocess'"),
        (["--gamma", "1.5"], "--gamma must be in [0, 1], got 1.5"),
        (["--q-lr", "0"], "--q-lr must be > 0, got 0.0"),
        (["--hidden-sizes", "64", "0"], "--hidden-sizes must be one or more positive ints"),
        (["--alpha", "0"], "--alpha must be > 0 with --autotune"),
    ],
)
def test_bad_flag_values(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(argv)
    assert str(info.value).startswith(message)


def test_zero_alpha_is_fine_without_autotune() -> None:
    assert load_config(["--alpha", "0", "--no-autotune"]).alpha == 0.0


def test_unknown_flag_is_a_config_error_with_the_nearest_flag() -> None:
    with pytest.raises(ConfigError, match=r"^unknown flag --batchsize \(did you mean "
                                          r"--batch-size\?\)$"):
        load_config(["--batchsize", "3"])


def test_flags_are_never_abbreviated() -> None:
    with pytest.raises(ConfigError, match="unknown flag --learning "):
        load_config(["--learning", "0"])


CONFIGS = Path(__file__).resolve().parent.parent / "configs"


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
    assert (cfg.batch_size, cfg.gamma, cfg.tau, cfg.policy_frequency) == (256, 0.99, 0.005, 2)
    # And through the command line, as a run would get it.
    assert load_config(["--algo", algo, "--env", env_id]) == dataclasses.replace(cfg, env_id=env_id)


def test_every_shipped_file_is_picked_by_some_algo_and_env() -> None:
    shipped = {p.name for p in CONFIGS.glob("*.yaml")}
    expected = {f"{a}_{fam}.yaml" for a in ALGORITHMS for fam in ("pendulum", "mujoco")}
    assert shipped == expected


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
    assert default_config_file("Pendulum-v1", "ppo") is None
    assert default_config_file("Pendulum-v1", "../configs/sac") is None


def test_new_field_defaults() -> None:
    cfg = Config()
    assert (cfg.policy_noise, cfg.noise_clip, cfg.exploration_noise) == (0.2, 0.5, 0.1)
    assert (cfg.actor, cfg.critic, cfg.actor_kwargs, cfg.critic_kwargs) == (None, None, {}, {})
    # Each Config gets its own dict.
    assert Config().actor_kwargs is not cfg.actor_kwargs


@pytest.mark.parametrize("name", ["policy-noise", "noise-clip", "exploration-noise"])
def test_negative_noise_is_an_error(name: str) -> None:
    one_line_error([f"--{name}", "-0.1"], f"--{name} must be a finite number >= 0, got -0.1")
    assert getattr(load_config([f"--{name}", "0"]), name.replace("-", "_")) == 0.0


def test_negative_noise_in_yaml_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "noise_clip: -1\n")
    one_line_error(
        ["--config", path], rf"noise_clip must be a finite number >= 0, got -1.0 in {path}"
    )


@pytest.mark.parametrize(
    "spec", ["my_pkg.nets:WideActor", "nets/actor.py:Actor", r"C:\nets\actor.py:Actor"]
)
def test_network_specs_are_accepted(spec: str) -> None:
    assert load_config(["--actor", spec, "--critic", spec]).actor == spec


@pytest.mark.parametrize("flag", ["--actor", "--critic"])
def test_spec_without_colon_names_both_forms(flag: str) -> None:
    message = one_line_error([flag, "my_pkg.nets.WideActor"], f"{flag} must be")
    assert "package.module:ClassName" in message
    assert "path/to/file.py:ClassName" in message
    assert "'my_pkg.nets.WideActor'" in message


@pytest.mark.parametrize("spec", ["my_pkg.nets:", ":Actor", "nets.py:not-a-name"])
def test_malformed_specs(spec: str) -> None:
    one_line_error(["--actor", spec], "--actor must be package.module:ClassName or")


def test_kwargs_flags_parse_to_dicts() -> None:
    cfg = load_config(
        ["--actor-kwargs", '{"width": 64}', "--critic-kwargs", "{depth: 3, act: relu}"]
    )
    assert cfg.actor_kwargs == {"width": 64}
    assert cfg.critic_kwargs == {"depth": 3, "act": "relu"}
    assert load_config(["--actor-kwargs", ""]).actor_kwargs == {}


@pytest.mark.parametrize("text", ["64", "[1, 2]", "width", "{1: 2}", '{"width": '])
def test_kwargs_flag_must_be_a_mapping(text: str) -> None:
    message = one_line_error(["--actor-kwargs", text], "--actor-kwargs must be a YAML/JSON mapping")
    assert """'{"width": 128}'""" in message


def test_yaml_kwargs_and_the_flag_overrides_them(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "actor: nets.py:Actor\nactor_kwargs: {width: 128, sizes: [8, 8]}\n"
        "critic_kwargs:\n  depth: 2\n",
    )
    cfg = load_config(["--config", path])
    assert cfg.actor == "nets.py:Actor"
    assert cfg.actor_kwargs == {"width": 128, "sizes": [8, 8]}
    assert cfg.critic_kwargs == {"depth": 2}
    # A flag replaces the whole mapping (no merge), like any other flag.
    cfg = load_config(["--config", path, "--actor-kwargs", '{"width": 64}'])
    assert (cfg.actor_kwargs, cfg.critic_kwargs) == ({"width": 64}, {"depth": 2})


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


def test_markdown_table_has_the_new_keys() -> None:
    cfg = Config(algo="td3", actor="nets.py:Actor", actor_kwargs={"width": 64})
    table = to_markdown_table(cfg)
    for key in ("policy_noise", "noise_clip", "exploration_noise", "critic", "critic_kwargs"):
        assert f"| {key} |" in table
    assert "| actor | nets.py:Actor |" in table
    assert '| actor_kwargs | {"width": 64} |' in table
    assert "| critic_kwargs | {} |" in table
    assert "| exploration_noise | 0.1 |" in table


def test_dict_round_trip_and_markdown() -> None:
    cfg = Config(
        batch_size=64, hidden_sizes=(32, 32), run_name="a|b", critic_kwargs={"sizes": (4, 4)}
    )
    data = config_to_dict(cfg)
    assert data["hidden_sizes"] == [32, 32]
    # Tuples inside the kwargs come out as YAML lists too (and stay as given in the Config).
    assert data["critic_kwargs"] == {"sizes": [4, 4]}
    assert cfg.critic_kwargs == {"sizes": (4, 4)}
    assert config_from_dict(data) == dataclasses.replace(cfg, critic_kwargs={"sizes": [4, 4]})
    table = to_markdown_table(cfg)
    assert table.splitlines()[:2] == ["| key | value |", "|---|---|"]
    for f in dataclasses.fields(Config):
        assert f"| {f.name} |" in table
    assert "| batch_size | 64 |" in table
    assert r"| run_name | a\|b |" in table


def test_config_is_frozen_and_checked_on_construction() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Config().seed = 2  # type: ignore[misc]
    with pytest.raises(ConfigError, match="batch_size must be an int, got 'x'"):
        Config(batch_size="x")  # type: ignore[arg-type]


NO_UPDATE = [
    (["--total-timesteps", "500", "--learning-starts", "500"],
     "--learning-starts 500 is not below --total-timesteps 500: the run would end before its "
     "first update; lower --learning-starts or raise --total-timesteps"),
    (["--total-timesteps", "500", "--learning-starts", "800"],
     "--learning-starts 800 is not below --total-timesteps 500: the run would end before its "
     "first update; lower --learning-starts or raise --total-timesteps"),
    (["--batch-size", "512", "--buffer-size", "256"],
     "--batch-size 512 is above --buffer-size 256: the replay buffer could never hold one "
     "batch, so no update would run; lower --batch-size or raise --buffer-size"),
    (["--total-timesteps", "300", "--learning-starts", "100", "--batch-size", "300"],
     "--batch-size 300 is not below --total-timesteps 300: the run would end before the replay "
     "buffer holds one batch, so no update would run; lower --batch-size or raise "
     "--total-timesteps"),
]


@pytest.mark.parametrize(("argv", "message"), NO_UPDATE)
def test_a_run_that_could_never_update_is_refused(argv: list[str], message: str) -> None:
    assert one_line_error(argv, "would") == message


def test_a_run_that_could_never_update_is_refused_from_yaml_and_python(tmp_path: Path) -> None:
    path = write(tmp_path, "total_timesteps: 500\nlearning_starts: 1000\n")
    assert one_line_error(["--config", path], "first update").startswith(
        "--learning-starts 1000 is not below --total-timesteps 500")
    with pytest.raises(ConfigError, match="--batch-size 64 is above --buffer-size 32"):
        config_from_dict({"batch_size": 64, "buffer_size": 32})
    with pytest.raises(ConfigError, match="--learning-starts 5000 is not below"):
        Config(total_timesteps=5000)  # the default learning_starts is 5000


def test_the_first_update_at_the_last_step_is_allowed() -> None:
    """One step past learning_starts and one row past a batch is the shortest run that learns."""
    cfg = load_config(["--total-timesteps", "301", "--learning-starts", "300", "--batch-size",
                       "300", "--buffer-size", "300"])
    assert (cfg.total_timesteps, cfg.learning_starts, cfg.batch_size) == (301, 300, 300)


def test_the_shipped_configs_could_all_update() -> None:
    for algo, env_id in itertools.product(ALGORITHMS, ("Pendulum-v1", "HalfCheetah-v5")):
        cfg = load_config(["--algo", algo, "--env", env_id])
        assert cfg.learning_starts < cfg.total_timesteps
        assert cfg.batch_size <= min(cfg.buffer_size, cfg.total_timesteps - 1)


# ----------------------------------------------------------------------------- removed settings

ASYNC_LINE = "was replaced by --vec-env async (--vec-env sync is the default)"
WORKER_LINE = ("was removed: it never measured faster than the default; use --vec-env async to "
               "step the environments in subprocesses")
OVERLAP_LINE = "was removed: the loop always steps the environments while the GPU updates"


@pytest.mark.parametrize(("flag", "line"), [
    ("--async-envs", ASYNC_LINE), ("--no-async-envs", ASYNC_LINE),
    ("--env-worker", WORKER_LINE), ("--no-env-worker", WORKER_LINE),
    ("--overlap", OVERLAP_LINE), ("--no-overlap", OVERLAP_LINE),
], ids=lambda value: value if value.startswith("--") else "")
def test_a_removed_flag_names_its_replacement(flag: str, line: str) -> None:
    assert one_line_error(["--env", "Pendulum-v1", flag], "^--") == f"{flag} {line}"
    # However it is written, and also when resuming.
    assert one_line_error([f"{flag}=true"], "^--") == f"{flag} {line}"
    with pytest.raises(ConfigError) as info:
        load_config(["--resume", "runs/x", flag], base=config_to_dict(Config()))
    assert str(info.value) == f"{flag} {line}"


def test_the_nearest_flag_is_never_a_removed_one() -> None:
    for flag in removed_flags():
        for typo in {flag[:-1], flag + "s", "--" + flag[2:].replace("-", "_")} - {flag}:
            message = one_line_error([typo], "unknown flag")
            assert not any(f"did you mean {removed}?" in message for removed in removed_flags())


@pytest.mark.parametrize(("key", "line"), [
    ("async_envs", "was replaced by vec_env: async (vec_env: sync is the default)"),
    ("env_worker", "was removed: it never measured faster than the default; use vec_env: "
                   "async to step the environments in subprocesses"),
    ("overlap", OVERLAP_LINE),
], ids=lambda value: value if "_" in value or value == "overlap" else "")
def test_a_removed_yaml_key_names_its_replacement(tmp_path: Path, key: str, line: str) -> None:
    path = write(tmp_path, f"batch_size: 64\n{key}: true\n")
    assert one_line_error(["--config", path], "^config key") == (
        f"config key {key!r} in {path} {line}")


def test_removed_settings_are_no_fields_and_no_flags() -> None:
    assert not set(REMOVED) & set(FIELDS)
    assert set(removed_flags()) == {"--async-envs", "--no-async-envs", "--env-worker",
                                    "--no-env-worker", "--overlap", "--no-overlap"}
    flags = build_parser().flags()
    assert "--vec-env" in flags and not set(removed_flags()) & set(flags)


def test_vec_env_from_flag_and_yaml(tmp_path: Path) -> None:
    assert Config().vec_env == "sync"
    assert load_config(["--vec-env", "async"]).vec_env == "async"
    path = write(tmp_path, "vec_env: async\n")
    assert load_config(["--config", path]).vec_env == "async"
    assert load_config(["--config", path, "--vec-env", "sync"]).vec_env == "sync"


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


def test_config_takes_the_algorithm_names_without_importing_an_algorithm() -> None:
    """One registry (rl_graphstep.algorithms) whose names cost no import of torch modules
    beyond config's own."""
    code = ("import sys, rl_graphstep.config as c\n"
            "print(c.FIELDS['algo'].metadata['help'], "
            "[m for m in sys.modules if m.startswith('rl_graphstep.algorithms.')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out == "algorithm, one of sac, td3, ddpg []\n"
    assert {name: cls.name for name, cls in ALGORITHMS.items()} == {n: n for n in ALGORITHMS}
    assert "ppo" not in ALGORITHMS and len(ALGORITHMS) == 3


@pytest.mark.parametrize(("argv", "message"), [
    (["--updates-per-step", "0"], "--updates-per-step must be a positive int, got 0"),
    (["--compile", "maybe"], "--compile must be one of auto, on, off, got 'maybe'"),
])
def test_new_flags_are_checked(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(argv)
