"""The sweep file: what a good one gives, and one clear line for each kind of bad one."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from rl_graphstep.core.errors import ConfigError
from rl_graphstep.settings.sweepfile import Sampled, read_sweep_file, trial_config

ROOT = Path(__file__).parents[2]


def write(tmp_path: Path, text: str, name: str = "sweep.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_the_shipped_sweep_reads_as_a_grid_of_four(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # its base config path is relative to the repository
    spec = read_sweep_file("configs/sweeps/sac_pendulum.yaml")
    assert spec.name == "sac_pendulum" and spec.trials == 4
    assert spec.grid == {"q_lr": (0.001, 0.0003), "policy_lr": (0.001, 0.0003)}
    assert spec.seeds == (1, 2, 3) and (spec.metric, spec.mode) == ("iqm", "max")
    assert spec.base["env_id"] == "Pendulum-v1" and spec.base["total_timesteps"] == 6000
    assert spec.base["batch_size"] == 256  # from the base config file
    points = spec.grid_points()
    assert points[0] == {"q_lr": 0.001, "policy_lr": 0.001} and len(points) == 4
    cfg = trial_config(spec, points[3], log_dir="runs/sac_pendulum", run_name="t3")
    assert (cfg.q_lr, cfg.policy_lr, cfg.seed_list) == (0.0003, 0.0003, (1, 2, 3))
    assert (cfg.log_dir, cfg.run_name, cfg.total_timesteps) == ("runs/sac_pendulum", "t3", 6000)


def test_sampled_dimensions_and_repeats(tmp_path: Path) -> None:
    spec = read_sweep_file(write(tmp_path, """
base: {env_id: Pendulum-v1}
search:
  tau: {uniform: [0.002, 0.02]}
  q_lr: {loguniform: [1.0e-4, 1.0e-2]}
  policy_frequency: {randint: [1, 4]}
  hidden_sizes: {choice: [[64, 64], [256, 256]]}
  batch_size: [64, 128, 256]
num_samples: 2
seeds: [3, 5]
metric: mean
mode: min
"""))
    assert spec.name == "sweep" and spec.trials == 6
    assert spec.sampled == {"tau": Sampled("uniform", (0.002, 0.02)),
                            "q_lr": Sampled("loguniform", (1e-4, 1e-2)),
                            "policy_frequency": Sampled("randint", (1, 4)),
                            "hidden_sizes": Sampled("choice", ((64, 64), (256, 256)))}
    assert spec.seeds == (3, 5) and (spec.metric, spec.mode) == ("mean", "min")
    cfg = trial_config(spec, {"batch_size": 64, "hidden_sizes": [64, 64]}, log_dir="x",
                       run_name="y")
    assert cfg.seeds == (3, 5) and cfg.num_seeds == 2 and cfg.hidden_sizes == (64, 64)


@pytest.mark.parametrize(("text", "message"), [
    ("serach: {q_lr: [0.1]}", r"unknown sweep key 'serach' \(did you mean 'search'\?\); valid: "
                              r"name, base, search"),
    ("search: {q_rl: [0.1]}", r"unknown setting in search 'q_rl' \(did you mean 'q_lr'\?\)"),
    ("search: {q_lr: []}", r"search for 'q_lr' must be a non-empty list \(a grid\) or one of "
                           r"choice, uniform, loguniform, randint, got \[\]"),
    ("search: {q_lr: [0.1, -1]}", r"q_lr must be a finite number > 0, got -1.0 in "
                                  r".*sweep.yaml's search for 'q_lr'"),
    ("search: {q_lr: {uniform: [0.1, 0.01]}}", r"uniform needs low < high, got \[0.1, 0.01\]"),
    ("search: {gamma: {loguniform: [0, 0.5]}}", r"loguniform needs low > 0, got 0.0"),
    ("search: {tau: {uniform: [0.1]}}", r"uniform takes \[low, high\], got \[0.1\]"),
    ("search: {tau: {normal: [0, 1]}}", r"a sampled value needs exactly one of choice, uniform, "
                                        r"loguniform, randint, got normal"),
    ("search: {algo: {uniform: [sac, td3]}}", r"uniform needs numbers, and algo is not numeric"),
    ("search: {batch_size: {randint: [1.5, 4]}}",
     r"batch_size must be an int, got 1.5 in .*search for 'batch_size'"),
    ("search: {seed: [1, 2]}", r"search cannot vary 'seed': the sweep sets it for every trial"),
    ("search: {log_dir: [a, b]}", r"search cannot vary 'log_dir'"),
    ("base: {run_name: x}", r"base cannot set 'run_name': the sweep sets it for every trial"),
    ("base: {batch_sise: 3}", r"unknown config key 'batch_sise' in .*sweep.yaml's base"),
    ("base: [1, 2]", r"base must be a mapping of training settings, got \[1, 2\]"),
    ("base: {config: nowhere.yaml}", r"config file 'nowhere.yaml' does not exist, and no "
                                     r"shipped config has that name \(shipped: crossq_mujoco, "
                                     r".*\) \(the base "
                                     r"config of .*sweep.yaml\)"),
    ("seeds: [1, 2]\nnum_seeds: 2", r"give seeds or num_seeds, not both"),
    ("seeds: [1, 1]", r"seeds .*1"),
    ("num_seeds: 0", r"num_seeds must be a whole number from 1 to 64, got 0"),
    ("num_seeds: 65", r"num_seeds must be a whole number from 1 to 64, got 65"),
    ("num_samples: 0", r"num_samples must be a positive whole number, got 0"),
    ("metric: median", r"metric must be one of iqm, mean, got 'median'"),
    ("mode: up", r"mode must be one of max, min, got 'up'"),
    ("name: a/b", r"name must be a folder name \(.*\), got 'a/b'"),
    ("- 1\n- 2", r"sweep file '.*sweep.yaml' must be a mapping of key: value lines, got a YAML "
                 r"list"),
    ("search: {q_lr: [0.1}", r"sweep file '.*sweep.yaml' is not valid YAML at line 1"),
    ("base: {learning_starts: 9000, total_timesteps: 5000}",
     r"--learning-starts 9000 is not below --total-timesteps 5000: .* \(in .*sweep.yaml\)$"),
    # Only some trials would not build: each one is checked before Ray starts, not the
    # first alone (the others failed in Ray, each retried).
    ("base: {learning_starts: 100}\nsearch: {total_timesteps: [3000, 50]}",
     r"^--learning-starts 100 is not below --total-timesteps 50: .* \(in .*sweep.yaml, with "
     r"\{'total_timesteps': 50\}\)$"),
    ("base: {total_timesteps: 3000, learning_starts: 100}\n"
     "search: {q_lr: [0.1, 0.2], buffer_size: [10000, 1000], batch_size: {randint: [16, 2000]}}",
     r"^--batch-size 2000 is above --buffer-size 1000: .* \(in .*sweep.yaml, with \{'q_lr': "
     r"0.1, 'buffer_size': 1000, 'batch_size': 2000\}\)$"),
    ("base: {total_timesteps: 3000, learning_starts: 100}\n"
     "search: {batch_size: {choice: [32, 5000]}}", r"^--batch-size 5000 is not below "),
    ("search: {batch_size: {uniform: [16, 64]}}",
     r"^uniform draws fractional numbers and batch_size is a whole number; use randint: "
     r"\[16, 64\] in .*sweep.yaml's search for 'batch_size'$"),
    ("search: {q_lr: [0.001, 1.0e-3]}",
     r"^search for 'q_lr' lists 0.001 twice: the grid would train the same trials again; list "
     r"each value once \(num_samples repeats the grid\) in .*sweep.yaml$"),
    ("name: 'a\\b'", r"^name must be a folder name \(no / or \\, not . or .., no control "
                      r"characters, at most 255 bytes\), got 'a\\\\b' in .*sweep.yaml$"),
    ('name: "a\\nb"', r"got 'a\\nb'"),
    ("name: " + "x" * 256, r"at most 255 bytes\), got 'xxx"),
])
def test_a_bad_sweep_file_is_one_line(text: str, message: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=message) as raised:
        read_sweep_file(write(tmp_path, text))
    assert "\n" not in str(raised.value)


def test_a_missing_sweep_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^sweep file '.*nothing.yaml' does not exist$"):
        read_sweep_file(tmp_path / "nothing.yaml")


def test_an_empty_sweep_file_is_one_default_trial(tmp_path: Path) -> None:
    spec = read_sweep_file(write(tmp_path, "# nothing yet\n", name="empty.yaml"))
    assert spec.trials == 1 and spec.grid_points() == [{}] and spec.seeds == (1,)
    assert spec.name == "empty" and spec.base == {}


def test_a_network_file_is_taken_from_the_current_folder_and_kept_absolute(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``train --config`` takes ``nets/x.py:Class`` from the current folder; a trial runs in a
    Ray worker elsewhere, so the sweep keeps the absolute path, in its base (also from a base
    config file) and in its search."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "nets").mkdir()
    for name in ("a.py", "b.py", "c.py"):
        (tmp_path / "nets" / name).write_text("")
    write(tmp_path, "critic: nets/c.py:Critic\n", name="base.yaml")
    spec = read_sweep_file(write(tmp_path, """
base: {config: base.yaml, actor: nets/a.py:Actor}
search:
  actor: [nets/a.py:Actor, nets/b.py:Actor]
  critic: {choice: [nets/c.py:Critic, examples.layernorm_critic:LayerNormCritic]}
"""))
    nets = tmp_path.resolve() / "nets"
    assert spec.base["actor"] == f"{nets / 'a.py'}:Actor"
    assert spec.base["critic"] == f"{nets / 'c.py'}:Critic"
    assert spec.grid["actor"] == (f"{nets / 'a.py'}:Actor", f"{nets / 'b.py'}:Actor")
    assert spec.sampled["critic"].values == (  # a module spec is imported, not a path
        f"{nets / 'c.py'}:Critic", "examples.layernorm_critic:LayerNormCritic")


def test_a_network_file_that_is_not_there_is_one_line(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    path = write(tmp_path, "base: {actor: nets/custom.py:DeepActor}\n")
    with pytest.raises(ConfigError) as raised:
        read_sweep_file(path)
    assert str(raised.value) == (
        f"actor: file 'nets/custom.py' for 'nets/custom.py:DeepActor' does not exist (relative "
        f"paths are taken from {tmp_path}) in {path}'s base")


def test_the_record_of_a_sweep_reads_back_as_the_same_sweep(tmp_path: Path) -> None:
    import yaml

    from rl_graphstep.settings.sweepfile import sweep_record

    spec = read_sweep_file(write(tmp_path, """
name: rec
base: {env_id: Pendulum-v1, hidden_sizes: [16, 16], total_timesteps: 3000, learning_starts: 100}
search:
  q_lr: [0.001, 0.0003]
  tau: {uniform: [0.002, 0.02]}
  hidden_sizes: {choice: [[8], [16, 16]]}
seeds: [3, 5]
num_samples: 2
metric: mean
mode: min
"""))
    again = read_sweep_file(write(tmp_path, yaml.safe_dump(sweep_record(spec)), "kept.yaml"))
    assert again == dataclasses.replace(spec, source=again.source)


def test_a_search_too_large_to_build_whole_still_checks_each_value(tmp_path: Path) -> None:
    """100,000 trials (more than MAX_CHECKED): each value is built beside the others' first."""
    values = ", ".join(str(0.1 + i / 100) for i in range(10))
    search = "".join(f"  {name}: [{values}]\n" for name in ("gamma", "tau", "policy_noise",
                                                             "noise_clip"))
    text = (f"base: {{total_timesteps: 3000, learning_starts: 100}}\nsearch:\n{search}"
            "  learning_starts: [100, 200, 300, 400, 500, 600, 700, 800, 900, 3000]\n")
    with pytest.raises(ConfigError, match=r"^--learning-starts 3000 is not below "
                       r"--total-timesteps 3000: .*'learning_starts': 3000\}\)$"):
        read_sweep_file(write(tmp_path, text))
    spec = read_sweep_file(write(tmp_path, text.replace(", 3000]", ", 1000]")))
    assert spec.trials == 100_000


def test_keyword_arguments_for_a_default_network_in_some_trials_are_one_line(
        tmp_path: Path) -> None:
    text = ("base: {total_timesteps: 3000, learning_starts: 100}\n"
            "search: {q_lr: [0.1], critic_kwargs: [{}, {n: 3}]}\n")
    with pytest.raises(ConfigError, match=r"^--critic-kwargs \{'n': 3\} is given for the default "
                       r"critic, .* \(in .*sweep.yaml, with \{'q_lr': 0.1, 'critic_kwargs': "
                       r"\{'n': 3\}\}\)$"):
        read_sweep_file(write(tmp_path, text))
