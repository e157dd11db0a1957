"""Checkpoints: the layout, keeping the newest K, atomic writes, and one clear line for every
checkpoint that cannot be loaded."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from rl_graphstep import evaluate, train
from rl_graphstep.core.errors import CheckpointError, RLGraphstepError
from rl_graphstep.run import checkpoint as ckpt
from rl_graphstep.run.checkpoint import (
    FORMAT,
    REQUIRED_KEYS,
    checkpoint_path,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from rl_graphstep.run.rundir import PartialSaves, remove_partial_saves
from rl_graphstep.settings.config import Config, config_to_dict


def make_state(step: int, env_id: str = "Pendulum-v1", algo: str = "sac") -> dict[str, Any]:
    """A checkpoint in the documented format, with real tensors and a numpy RNG state."""
    torch.manual_seed(step)
    return {
        "format": FORMAT,
        "config": config_to_dict(Config(env_id=env_id, algo=algo)),
        "run_name": "run",
        "global_step": step,
        "episodes": step // 200,
        "recent_returns": [-150.0, -140.5],
        "agent": {"actor": {"weight": torch.randn(64, 64)}, "critic": {"bias": torch.randn(8)}},
        "rng": {"numpy": np.random.get_state()},
        "envs": None,
        "observations": np.ones((1, 3), dtype=np.float32),
        "buffer": None,
    }


def names(run_dir: Path) -> list[str]:
    return [p.name for p in list_checkpoints(run_dir)]


def load_error(*args: Any, **kwargs: Any) -> str:
    """The message of the CheckpointError load_checkpoint raises; it must be one line."""
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(*args, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    assert isinstance(info.value, RLGraphstepError) and isinstance(info.value, ValueError)
    return message


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Work in tmp_path, so messages show short relative paths such as runs/x."""
    monkeypatch.chdir(tmp_path)
    return Path("runs/x")


# ----------------------------------------------------------------------------- save and find


def test_save_list_latest_and_load(tmp_path: Path) -> None:
    for step in (2000, 1000, 3000):
        path = save_checkpoint(tmp_path, step, make_state(step), keep=5)
        assert path == tmp_path / "checkpoints" / f"step_{step:012d}.pt" == checkpoint_path(
            tmp_path, step)
    assert names(tmp_path) == ["step_000000001000.pt", "step_000000002000.pt",
                               "step_000000003000.pt"]
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoints" / "step_000000003000.pt"

    state = load_checkpoint(tmp_path)
    expected = make_state(3000)
    assert state["global_step"] == 3000 and state["config"]["env_id"] == "Pendulum-v1"
    assert torch.equal(state["agent"]["actor"]["weight"], expected["agent"]["actor"]["weight"])
    np.testing.assert_array_equal(state["rng"]["numpy"][1], expected["rng"]["numpy"][1])
    assert state["recent_returns"] == [-150.0, -140.5]


def test_keep_the_newest_k(tmp_path: Path) -> None:
    for step in range(1000, 6000, 1000):
        save_checkpoint(tmp_path, step, make_state(step), keep=2)
    assert names(tmp_path) == ["step_000000004000.pt", "step_000000005000.pt"]
    save_checkpoint(tmp_path, 6000, make_state(6000), keep=1)
    assert names(tmp_path) == ["step_000000006000.pt"]


def test_the_checkpoint_just_written_is_never_pruned(tmp_path: Path) -> None:
    # A run restarted from an earlier step: its new checkpoint is older than one on disk.
    save_checkpoint(tmp_path, 5000, make_state(5000), keep=1)
    save_checkpoint(tmp_path, 3000, make_state(3000), keep=1)
    assert names(tmp_path) == ["step_000000003000.pt", "step_000000005000.pt"]


def test_later_checkpoints_are_set_aside_not_deleted(tmp_path: Path) -> None:
    from rl_graphstep.run.checkpoint import set_aside_later

    for step in (1000, 2000, 3000):
        save_checkpoint(tmp_path, step, make_state(step), keep=5)
    assert set_aside_later(tmp_path, 3000) is None  # nothing later: nothing moves
    first = set_aside_later(tmp_path, 1000)
    assert first == tmp_path / "checkpoints" / "abandoned_after_000000001000"
    assert names(tmp_path) == ["step_000000001000.pt"]
    assert sorted(p.name for p in first.iterdir()) == ["step_000000002000.pt",
                                                       "step_000000003000.pt"]
    assert load_checkpoint(first / "step_000000003000.pt")["global_step"] == 3000
    # A second abandoned timeline after the same step gets its own folder.
    save_checkpoint(tmp_path, 2000, make_state(2000), keep=5)
    second = set_aside_later(tmp_path, 1000)
    assert second.name == "abandoned_after_000000001000_2"
    assert [p.name for p in second.iterdir()] == ["step_000000002000.pt"]


def test_keep_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="keep must be at least 1 checkpoint, got 0"):
        save_checkpoint(tmp_path, 1000, make_state(1000), keep=0)


def test_listing_sorts_by_step_and_skips_other_files(tmp_path: Path) -> None:
    assert list_checkpoints(tmp_path) == [] and latest_checkpoint(tmp_path) is None
    big = 10**12 + 5  # 13 digits: wider than the padding, still sorted by number
    for step in (big, 999, 1000):
        save_checkpoint(tmp_path, step, make_state(step), keep=10)
    folder = tmp_path / "checkpoints"
    for stray in (".step_000000002000.pt.abc.tmp", "notes.txt", "step_x.pt"):
        (folder / stray).write_text("not a checkpoint")
    assert names(tmp_path) == ["step_000000000999.pt", "step_000000001000.pt",
                               f"step_{big}.pt"]


# ----------------------------------------------------------------------------- atomic writes


@pytest.mark.parametrize("failure", [OSError(28, "No space left on device"), KeyboardInterrupt()])
def test_a_failed_save_leaves_the_previous_checkpoint_intact(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: BaseException) -> None:
    save_checkpoint(tmp_path, 1000, make_state(1000), keep=1)

    def broken_save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        f.write(b"PK\x03\x04 half a zip")  # some bytes reach the disk, then the save dies
        raise failure

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(type(failure)):
        save_checkpoint(tmp_path, 2000, make_state(2000), keep=1)
    monkeypatch.undo()

    assert os.listdir(tmp_path / "checkpoints") == ["step_000000001000.pt"]  # no .tmp left
    assert load_checkpoint(tmp_path)["global_step"] == 1000


# ----------------------------------------------------------------------------- loading


def test_load_a_file_or_the_checkpoints_folder(tmp_path: Path) -> None:
    for step in (1000, 2000):
        save_checkpoint(tmp_path, step, make_state(step), keep=5)
    older = tmp_path / "checkpoints" / "step_000000001000.pt"
    assert load_checkpoint(older)["global_step"] == 1000
    assert load_checkpoint(str(older))["global_step"] == 1000
    assert load_checkpoint(tmp_path / "checkpoints")["global_step"] == 2000


def test_missing_run_folder(in_tmp: Path) -> None:
    assert load_error(in_tmp) == ("run folder runs/x does not exist; give a run folder "
                                  "(such as runs/<run name>) or a .pt checkpoint")
    Path("runs/pendulum_1").mkdir(parents=True)
    assert load_error("runs/pendulum_2").startswith(
        "run folder runs/pendulum_2 does not exist (did you mean runs/pendulum_1?); ")


def test_missing_checkpoint_file(in_tmp: Path) -> None:
    assert load_error(in_tmp / "checkpoints" / "step_000000001000.pt") == (
        "checkpoint file runs/x/checkpoints/step_000000001000.pt does not exist")


def test_a_run_without_checkpoints(in_tmp: Path) -> None:
    """Every run saves at its end: none saved means no run, or one that died before."""
    in_tmp.mkdir(parents=True)
    assert load_error(in_tmp) == (
        "runs/x has no checkpoints in runs/x/checkpoints: it is not a run's folder, or its run "
        "ended before the first save (every --checkpoint-every steps and at the end)")


@pytest.fixture
def log_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """runs/ holding a seed group (its seed and aggregate folders), a sweep of two trials and
    nothing else; the working folder is tmp_path."""
    monkeypatch.chdir(tmp_path)
    runs = Path("runs")
    save_checkpoint(runs / "group", 100, make_state(100), keep=1)
    for name in ("seed_1", "seed_2", "aggregate"):
        (runs / "group" / name).mkdir()
    (runs / "sweep" / ".tune" / "sweep").mkdir(parents=True)
    for trial in ("run_trial_b", "run_trial_a"):
        save_checkpoint(runs / "sweep" / trial, 100, make_state(100), keep=1)
    return runs


FOLDERS_NOT_RUNS = [
    ("runs/group/seed_2", "runs/group/seed_2 is the log folder of seed 2 of the seed group "
     "runs/group, whose folder holds the checkpoints: give runs/group (a group resumes as a "
     "whole)"),
    ("runs/group/aggregate", "runs/group/aggregate holds the aggregate curves of the seed group "
     "runs/group, not checkpoints: give runs/group"),
    ("runs/sweep", "runs/sweep is the folder of the sweep 'sweep', not a run: give one of its "
     "trials' folders (such as runs/sweep/run_trial_a), or continue the whole sweep with python "
     "-m rl_graphstep.sweep <its sweep file> --resume --log-dir runs"),
    ("runs", "runs is a folder of runs, not a run: give one of them (such as runs/group)"),
]


@pytest.mark.parametrize(("folder", "line"), FOLDERS_NOT_RUNS)
def test_a_folder_that_is_not_a_run_says_what_it_is_and_what_to_give(
        log_dir: Path, folder: str, line: str) -> None:
    assert load_error(folder) == line


@pytest.mark.parametrize(("folder", "line"), FOLDERS_NOT_RUNS)
def test_resume_and_evaluate_of_such_a_folder_say_it_in_one_line(
        log_dir: Path, folder: str, line: str, capsys: pytest.CaptureFixture[str]) -> None:
    """evaluate takes a group's seed folder (that seed alone); resume takes the group."""
    assert train.main(["--resume", folder, "--total-timesteps", "400"]) == 2
    assert capsys.readouterr().err == f"error: {line}\n"
    if folder.endswith("seed_2"):
        return
    assert evaluate.main([folder]) == 2
    assert capsys.readouterr().err == f"error: {line}\n"


def test_a_sweep_without_a_saved_trial_says_so(log_dir: Path) -> None:
    (log_dir / "new" / ".tune").mkdir(parents=True)
    (log_dir / "new" / "run_trial_c").mkdir()
    assert load_error(log_dir / "new").startswith(
        "runs/new is the folder of the sweep 'new', not a run: give one of its trials' folders "
        "once it has saved one, or continue the whole sweep with ")


def corrupt(path: Path, how: str) -> None:
    data = path.read_bytes()
    blobs = {"truncated": data[: len(data) // 2], "random bytes": os.urandom(4096),
             "empty": b"", "text": b"hello world\n"}
    path.write_bytes(blobs[how])


@pytest.mark.parametrize("how", ["truncated", "random bytes", "empty", "text"])
def test_a_truncated_or_corrupted_file(in_tmp: Path, how: str) -> None:
    path = save_checkpoint(in_tmp, 1000, make_state(1000), keep=1)
    corrupt(path, how)
    message = load_error(in_tmp)
    assert message.startswith(
        "checkpoint runs/x/checkpoints/step_000000001000.pt is truncated or corrupted (")
    assert message.endswith("); load an earlier checkpoint of the run instead")


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ({"actor": {"weight": torch.zeros(2)}},
         "is not an rl_graphstep checkpoint: it lacks format, config, global_step, agent "
         "(expected a dict with format 1 and the keys config, global_step, agent)"),
        (torch.zeros(3),
         "is not an rl_graphstep checkpoint: it holds a Tensor, not a dict with format 1 and "
         "the keys config, global_step, agent"),
        ({**make_state(1000), "format": 2},
         "has format 2, but this rl_graphstep reads format 1; use the version that wrote it"),
        ({k: v for k, v in make_state(1000).items() if k != "agent"},
         "is not an rl_graphstep checkpoint: it lacks agent (expected a dict with format 1 "
         "and the keys config, global_step, agent)"),
    ],
    ids=["plain dict", "tensor", "format 2", "no agent"],
)
def test_a_torch_file_that_is_not_a_checkpoint(in_tmp: Path, content: Any, problem: str
                                               ) -> None:
    path = in_tmp / "checkpoints" / "step_000000001000.pt"
    path.parent.mkdir(parents=True)
    torch.save(content, path)
    message = load_error(in_tmp)
    assert message.endswith(f"runs/x/checkpoints/step_000000001000.pt {problem}")


def test_the_required_keys_are_documented() -> None:
    assert REQUIRED_KEYS == ("format", "config", "global_step", "agent")
    assert ckpt.__doc__ is not None and all(f'"{k}"' in ckpt.__doc__ for k in REQUIRED_KEYS)


@pytest.mark.parametrize(
    ("asked", "wanted"),
    [
        ({"env_id": "HalfCheetah-v5", "algo": "sac"}, "sac on HalfCheetah-v5"),
        ({"algo": "sac"}, "sac on Pendulum-v1"),
        ({"env_id": "HalfCheetah-v5"}, "td3 on HalfCheetah-v5"),
    ],
)
def test_a_checkpoint_of_another_env_or_algorithm(in_tmp: Path, asked: dict[str, str],
                                                  wanted: str) -> None:
    save_checkpoint(in_tmp, 1000, make_state(1000, "Pendulum-v1", "td3"), keep=1)
    assert load_error(in_tmp, **asked) == (
        f"checkpoint runs/x/checkpoints/step_000000001000.pt is of td3 on Pendulum-v1, "
        f"not {wanted}")
    assert load_checkpoint(in_tmp, env_id="Pendulum-v1", algo="td3")["global_step"] == 1000



def test_partial_saves_are_removed_and_counted(tmp_path: Path) -> None:
    assert remove_partial_saves(tmp_path) == PartialSaves(0, 0)  # no checkpoints folder
    path = save_checkpoint(tmp_path, 1000, make_state(1000), keep=3)
    folder = path.parent
    (folder / ".step_000000002000.1a2b3c4d.tmp").write_bytes(bytes(3_000_000))
    (folder / ".step_000000003000.zz_9y8x7.tmp").write_bytes(bytes(1_200))
    (folder / "other.tmp").write_bytes(b"not a save")
    assert remove_partial_saves(tmp_path) == PartialSaves(2, 3_001_200)
    assert sorted(os.listdir(folder)) == ["other.tmp", "step_000000001000.pt"]
    assert PartialSaves(2, 3_001_200).describe() == "removed 2 partial checkpoint files (3 MB)"
    assert PartialSaves(1, 45_300).describe() == "removed 1 partial checkpoint file (45 kB)"
    assert PartialSaves(1, 12).describe() == "removed 1 partial checkpoint file (12 bytes)"


def test_a_save_killed_mid_write_leaves_a_file_that_is_removed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The temporary file a save names is the one the clean-up finds (kill -9 runs no
    clean-up of its own: simulated by a save that never returns nor cleans)."""
    unlink = os.unlink
    monkeypatch.setattr(ckpt.os, "unlink", lambda path: None)  # as if the process died

    def dies(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        f.write(b"PK\x03\x04 half a zip")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", dies)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, 2000, make_state(2000), keep=1)
    monkeypatch.setattr(ckpt.os, "unlink", unlink)
    assert len(os.listdir(tmp_path / "checkpoints")) == 1
    assert remove_partial_saves(tmp_path) == PartialSaves(1, len(b"PK\x03\x04 half a zip"))
    assert os.listdir(tmp_path / "checkpoints") == []
