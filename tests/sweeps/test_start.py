"""What a sweep keeps of its start: an edited sweep file or other flags refused on resume, in
one line naming what differs; the flags' ranges; a trial no local Ray could place."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from rl_graphstep.core.errors import ConfigError
from rl_graphstep.settings.sweepfile import read_sweep_file
from rl_graphstep.sweeps.start import (
    SweepFlags,
    check_same_sweep,
    flag_problem,
    placement_problem,
    record_start,
    resumed_flags,
)

SWEEP = """
name: s
base: {env_id: Pendulum-v1, total_timesteps: 3000, learning_starts: 100}
search:
  q_lr: [0.001, 0.0003]
seeds: [1, 2]
"""


def started(tmp_path: Path, text: str = SWEEP, flags: SweepFlags | None = None) -> Path:
    """The folder of a sweep started from ``text`` with ``flags``."""
    sweep_dir = tmp_path / "runs" / "s"
    (sweep_dir / ".tune").mkdir(parents=True)
    (tmp_path / "s.yaml").write_text(text)
    record_start(sweep_dir, read_sweep_file(tmp_path / "s.yaml"), flags or SweepFlags())
    return sweep_dir


def edited(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "edited.yaml"
    path.write_text(text)
    return path


def test_a_sweep_file_that_differs_is_refused_naming_what_differs(tmp_path: Path) -> None:
    sweep_dir = started(tmp_path)
    path = edited(tmp_path, SWEEP.replace("q_lr", "policy_lr").replace("3000", "5000")
                  .replace("seeds: [1, 2]", "seeds: [1, 2, 3]"))
    with pytest.raises(ConfigError) as raised:
        check_same_sweep(sweep_dir, read_sweep_file(path))
    assert str(raised.value) == (
        f"the sweep file {path} differs from the one this sweep started with (total_timesteps "
        "3000 -> 5000; search.q_lr removed; search.policy_lr added; seeds [1, 2] -> [1, 2, 3]); "
        f"resume with the original file (a copy is {sweep_dir / 'sweep.yaml'}) or start a new "
        "sweep under another name or --log-dir")


@pytest.mark.parametrize(("change", "named"), [
    (("q_lr: [0.001, 0.0003]", "q_lr: [0.001]"), "search.q_lr [0.001, 0.0003] -> [0.001]"),
    (("q_lr: [0.001, 0.0003]", "q_lr: {uniform: [0.0003, 0.001]}"),
     "search.q_lr [0.001, 0.0003] -> {uniform: [0.0003, 0.001]}"),
    (("seeds: [1, 2]", "seeds: [1, 2]\nnum_samples: 2"), "num_samples 1 -> 2"),
    (("seeds: [1, 2]", "seeds: [1, 2]\nmetric: mean"), "metric iqm -> mean"),
    (("learning_starts: 100", "learning_starts: 100, batch_size: 64"), "batch_size 256 -> 64"),
])
def test_each_kind_of_edit_is_named(change: tuple[str, str], named: str,
                                    tmp_path: Path) -> None:
    sweep_dir = started(tmp_path)
    path = edited(tmp_path, SWEEP.replace(*change))
    with pytest.raises(ConfigError) as raised:
        check_same_sweep(sweep_dir, read_sweep_file(path))
    assert f"started with ({named}); resume" in str(raised.value)


def test_a_base_config_file_edited_since_is_a_difference(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "base.yaml").write_text("batch_size: 64\n")
    text = SWEEP.replace("base: {", "base: {config: base.yaml, ")
    sweep_dir = started(tmp_path, text)
    (tmp_path / "base.yaml").write_text("batch_size: 128\n")
    with pytest.raises(ConfigError, match=r"started with \(batch_size 64 -> 128\)"):
        check_same_sweep(sweep_dir, read_sweep_file(tmp_path / "s.yaml"))


def test_the_same_sweep_written_otherwise_resumes(tmp_path: Path) -> None:
    """Comments, order, 3e-4 for 0.0003, and a default written out are the same sweep."""
    sweep_dir = started(tmp_path)
    same = edited(tmp_path, "# the same\nseeds: [1, 2]\nname: s\nsearch: {q_lr: [1.0e-3, 3e-4]}\n"
                            "base: {learning_starts: 100, total_timesteps: 3000, gamma: 0.99}\n")
    check_same_sweep(sweep_dir, read_sweep_file(same))
    # A sweep started before its folder kept its file resumes unchecked.
    (sweep_dir / "sweep.yaml").unlink()
    check_same_sweep(sweep_dir, read_sweep_file(edited(tmp_path, SWEEP.replace("3000", "9000"))))


def test_a_resume_keeps_the_flags_the_sweep_started_with(tmp_path: Path) -> None:
    flags = SweepFlags(scheduler="asha", max_failures=0, cpus_per_trial=0.5)
    sweep_dir = started(tmp_path, flags=flags)
    none = dict.fromkeys(("scheduler", "search", "max_failures", "cpus_per_trial",
                          "gpus_per_trial"))
    assert resumed_flags(sweep_dir, none) == flags
    assert resumed_flags(sweep_dir, {**none, "scheduler": "asha", "cpus_per_trial": 0.5}) == flags
    with pytest.raises(ConfigError) as raised:
        resumed_flags(sweep_dir, {**none, "scheduler": "fifo", "max_failures": 2})
    assert str(raised.value) == (
        "--scheduler fifo --max-failures 2 differs from the sweep's --scheduler asha "
        "--max-failures 0: a resumed sweep keeps the flags it started with; drop --scheduler "
        "and --max-failures (or start a new sweep under another name or --log-dir)")


@pytest.mark.parametrize(("name", "value", "line"), [
    ("max_failures", -1, "--max-failures must be 0 or more (retries of a failed trial), got -1"),
    ("cpus_per_trial", 0.0, "--cpus-per-trial must be a number > 0 (a share such as 0.5, or "
                            "whole ones), got 0"),
    ("cpus_per_trial", -2.0, "--cpus-per-trial must be a number > 0 (a share such as 0.5, or "
                             "whole ones), got -2"),
    ("cpus_per_trial", math.nan, "--cpus-per-trial must be a number > 0 (a share such as 0.5, "
                                 "or whole ones), got nan"),
    ("gpus_per_trial", math.inf, "--gpus-per-trial must be a number >= 0 (a share such as 0.5, "
                                 "or whole ones), got inf"),
    ("gpus_per_trial", -0.5, "--gpus-per-trial must be a number >= 0 (a share such as 0.5, or "
                             "whole ones), got -0.5"),
    ("gpus_per_trial", 1e-5, "--gpus-per-trial must be at least 0.0001 (Ray's finest share) or "
                             "0, got 1e-05"),
    ("cpus_per_trial", 1e-5, "--cpus-per-trial must be at least 0.0001 (Ray's finest share), "
                             "got 1e-05"),
])
def test_a_flag_out_of_range_is_one_line(name: str, value: float, line: str) -> None:
    assert flag_problem(name, value) == line


@pytest.mark.parametrize(("name", "value"), [("max_failures", 0), ("cpus_per_trial", 0.25),
                                             ("gpus_per_trial", 0.0), ("gpus_per_trial", 2.0)])
def test_a_flag_in_range_passes(name: str, value: float) -> None:
    assert flag_problem(name, value) is None


def test_a_trial_no_local_ray_could_place_is_one_line() -> None:
    resources = {"CPU": 2.0, "memory": 1e9}
    assert placement_problem(SweepFlags(cpus_per_trial=2), resources) is None
    assert placement_problem(SweepFlags(cpus_per_trial=4), resources) == (
        "--cpus-per-trial 4 is more than the 2 CPUs of the local Ray this sweep started, so no "
        "trial could ever start; give at most 2, or --address a Ray cluster that has them")
    assert placement_problem(SweepFlags(gpus_per_trial=0.25), resources) == (
        "--gpus-per-trial 0.25 is more than the 0 GPUs of the local Ray this sweep started, so "
        "no trial could ever start; give at most 0, or --address a Ray cluster that has them")
    assert placement_problem(SweepFlags(gpus_per_trial=0.25), {**resources, "GPU": 1.0}) is None
