"""The command line: flag and YAML precedence, --help with the defaults that apply, one-line
errors for bad flags and removed ones."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from configtools import one_line_error, write

from rl_graphstep.algorithms import listed
from rl_graphstep.core.errors import ConfigError
from rl_graphstep.run.flags import build_parser, load_config
from rl_graphstep.settings.config import FIELDS, REMOVED, Config, config_to_dict, removed_flags


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


def test_flags_override_yaml(tmp_path: Path) -> None:
    path = write(tmp_path, "batch_size: 128\ntau: 0.01\n")
    cfg = load_config(["--config", path, "--batch-size", "512", "--no-progress"])
    assert (cfg.batch_size, cfg.tau, cfg.progress) == (512, 0.01, False)


def test_flags_override_the_env_file() -> None:
    cfg = load_config(["--env", "Pendulum-v1", "--total-timesteps", "2000", "--hidden-sizes", "8"])
    assert (cfg.total_timesteps, cfg.learning_starts, cfg.hidden_sizes) == (2000, 1000, (8,))


def test_help_lists_every_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        load_config(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for f in dataclasses.fields(Config):
        if not listed(f):  # an algorithm's that is not here yet (tests/algorithms/test_registry)
            continue
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
    assert "algorithm, one of sac, td3, ddpg, crossq, ppo (default: sac)" in out
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
    (["--algo", "a2c"],
     "Built-in defaults shown: --algo must be one of sac, td3, ddpg, crossq, ppo, got 'a2c'."),
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


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--tau", "2"], "--tau must be in (0, 1], got 2.0"),
        (["--batch-size", "-1"], "--batch-size must be a positive int, got -1"),
        (["--device", "gpu"], "--device must be one of auto, cpu, cuda, got 'gpu'"),
        (["--graph", "maybe"], "--graph must be one of auto, on, off, got 'maybe'"),
        (["--action-stream", "yes"],
         "--action-stream must be one of auto, on, off, got 'yes'"),
        (["--algo", "a2c"], "--algo must be one of sac, td3, ddpg, crossq, ppo, got 'a2c'"),
        (["--vec-env", "subprocess"],
         "--vec-env must be one of auto, sync, async, shared, got 'subprocess'"),
        (["--gamma", "1.5"], "--gamma must be in [0, 1], got 1.5"),
        (["--q-lr", "0"], "--q-lr must be a finite number > 0, got 0.0"),
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


@pytest.mark.parametrize("name", ["policy-noise", "noise-clip", "exploration-noise"])
def test_negative_noise_is_an_error(name: str) -> None:
    one_line_error([f"--{name}", "-0.1"], f"--{name} must be a finite number >= 0, got -0.1")
    cfg = load_config(["--algo", "td3", f"--{name}", "0"])  # TD3 reads all three
    assert getattr(cfg, name.replace("-", "_")) == 0.0


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


def test_a_kwargs_flag_with_a_key_given_twice_is_one_line() -> None:
    assert one_line_error(["--critic-kwargs", "{depth: 2, width: 8, depth: 3}"], "twice") == (
        "--critic-kwargs '{depth: 2, width: 8, depth: 3}': key 'depth' appears twice (line 1, "
        "columns 2 and 22); give it once")


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


def test_the_first_update_at_the_last_step_is_allowed() -> None:
    """One step past learning_starts and one row past a batch is the shortest run that learns."""
    cfg = load_config(["--total-timesteps", "301", "--learning-starts", "300", "--batch-size",
                       "300", "--buffer-size", "300"])
    assert (cfg.total_timesteps, cfg.learning_starts, cfg.batch_size) == (301, 300, 300)


# ----------------------------------------------------------------------------- removed settings

ASYNC_LINE = "was replaced by --vec-env async (--vec-env auto is the default)"
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


def test_removed_settings_are_no_fields_and_no_flags() -> None:
    assert not set(REMOVED) & set(FIELDS)
    assert set(removed_flags()) == {"--async-envs", "--no-async-envs", "--env-worker",
                                    "--no-env-worker", "--overlap", "--no-overlap"}
    flags = build_parser().flags()
    assert "--vec-env" in flags and not set(removed_flags()) & set(flags)


def test_vec_env_from_flag_and_yaml(tmp_path: Path) -> None:
    assert Config().vec_env == "auto"
    assert load_config(["--vec-env", "async"]).vec_env == "async"
    path = write(tmp_path, "vec_env: async\n")
    assert load_config(["--config", path]).vec_env == "async"
    assert load_config(["--config", path, "--vec-env", "sync"]).vec_env == "sync"


def test_seed_group_flags() -> None:
    assert load_config(["--num-seeds", "8"]).seed_list == tuple(range(1, 9))
    assert load_config(["--seed", "10", "--num-seeds", "3"]).seed_list == (10, 11, 12)
    assert load_config(["--seeds", "3", "5", "7"]).seed_list == (3, 5, 7)
    single = load_config(["--seed", "4"])  # --seed keeps its meaning for a single run
    assert (single.seed_list, single.num_seeds, single.seeds) == ((4,), 1, None)


@pytest.mark.parametrize(("argv", "message"), [
    (["--num-seeds", "0"], "--num-seeds must be a positive int, got 0"),
    (["--num-seeds", "-1"], "--num-seeds must be a positive int, got -1"),
    (["--seeds", "3", "--num-seeds", "1"], "--seeds and --num-seeds cannot both be given"),
    (["--num-seeds", "2", "--seeds", "3", "4"], "--seeds and --num-seeds cannot both be given"),
    (["--seeds", "3", "--seed", "3"], "--seed and --seeds cannot both be given"),
    (["--seeds", "3", "5", "3"], "--seeds must differ from each other, got 3 twice"),
    (["--seeds"], "--seeds needs one or more values"),
    (["--seeds", "x"], "--seeds must be an int, got 'x'"),
    (["--num-seeds", "100"], "--num-seeds must be at most 64, got 100"),
])
def test_bad_seed_flags_are_one_line(argv: list[str], message: str) -> None:
    one_line_error(argv, re.escape(message))


def _saved(**values: object) -> dict[str, object]:
    return config_to_dict(Config(**values))  # type: ignore[arg-type]


@pytest.mark.parametrize(("saved", "argv", "message"), [
    ({"num_seeds": 3}, ["--num-seeds", "4"], "--num-seeds 4 does not match: the resumed run "
     "has 3 seeds (1 2 3), and a run resumes with its own seeds; drop --num-seeds"),
    ({}, ["--num-seeds", "2"], "--num-seeds 2 does not match: the resumed run has 1 seed (1)"),
    ({"seeds": (3, 5, 7)}, ["--seeds", "3", "5"], "--seeds 3 5 does not match: the resumed run "
     "has 3 seeds (3 5 7)"),
    ({"seeds": (3, 5, 7)}, ["--seeds", "3", "7", "5"], "--seeds 3 7 5 does not match"),
    ({"num_seeds": 3}, ["--seed", "2"], "--seed 2 does not match: the resumed run has 3 seeds "
     "(1 2 3)"),
    # A single run's generators are the checkpoint's: another seed would only be recorded.
    ({}, ["--seed", "2"], "--seed 2 does not match: the resumed run has 1 seed (1), and a run "
     "resumes with its own seeds; drop --seed"),
])
def test_a_resume_with_other_seeds_is_one_line(saved: dict[str, object], argv: list[str],
                                               message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(argv, base=_saved(**saved))
    assert str(info.value) == message if message.endswith("--num-seeds") else (
        str(info.value).startswith(message))


@pytest.mark.parametrize(("saved", "argv", "seeds"), [
    ({"num_seeds": 3}, ["--num-seeds", "3"], (1, 2, 3)),
    ({"seeds": (3, 5, 7)}, ["--num-seeds", "3"], (3, 5, 7)),
    ({"seeds": (3, 5, 7)}, ["--seeds", "3", "5", "7"], (3, 5, 7)),
    ({"seeds": (3, 5, 7)}, ["--total-timesteps", "20000"], (3, 5, 7)),
    ({"seed": 2}, ["--seed", "2"], (2,)),
])
def test_a_resume_with_its_own_seeds_goes_on(saved: dict[str, object], argv: list[str],
                                             seeds: tuple[int, ...]) -> None:
    assert load_config(argv, base=_saved(**saved)).seed_list == seeds
