"""The run folder: its name, claiming a new one, and its ownership by one training at a time."""

from __future__ import annotations

import errno
import os
import re
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from processtools import run_python

from rl_graphstep.core.errors import RLGraphstepError, RunFolderError
from rl_graphstep.evaluate import main as evaluate_main
from rl_graphstep.run import rundir
from rl_graphstep.run.checkpoint import load_checkpoint
from rl_graphstep.run.flags import load_config
from rl_graphstep.run.rundir import RunLock, claim_run_dir, run_name, seeds_label
from rl_graphstep.settings.config import Config
from rl_graphstep.train import main, train


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Work in tmp_path, so messages show short relative paths such as runs/x."""
    monkeypatch.chdir(tmp_path)
    return Path("runs/x")


def test_run_name_format(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default name ends in the local date and time, readable and in start order."""
    assert run_name(Config(run_name="mine")) == "mine"
    name = run_name(Config(env_id="HalfCheetah-v5", seed=7))
    assert re.fullmatch(r"HalfCheetah-v5__sac__7__\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d", name)
    assert ":" not in name
    started = 1796014201.5
    monkeypatch.setattr(rundir.time, "time", lambda: started)
    expected = time.strftime("%Y-%m-%d_%H-%M-%S", time.localtime(started))
    assert run_name(Config(env_id="HalfCheetah-v5", seed=7)) == (
        f"HalfCheetah-v5__sac__7__{expected}")
    # Later starts sort later, across seconds, days, months and years (9 s to 400 days).
    names = []
    for later in (0, 9, 60, 3600, 86400 * 3, 86400 * 40, 86400 * 400):
        monkeypatch.setattr(rundir.time, "time", lambda later=later: started + later)
        names.append(run_name(Config(env_id="HalfCheetah-v5", seed=7)))
    assert names == sorted(names) and len(set(names)) == len(names)


def test_claim_run_dir_gives_each_claim_a_new_folder(tmp_path: Path) -> None:
    path = tmp_path / "runs" / "Pendulum-v1__sac__1__2026-12-06_01-23-45"
    claimed = [claim_run_dir(path) for _ in range(3)]
    assert [p.name for p in claimed] == [path.name, f"{path.name}_2", f"{path.name}_3"]
    assert all(p.is_dir() and not any(p.iterdir()) for p in claimed)


# ----------------------------------------------------------------------------- run ownership


def lock_error(run_dir: Path | str, **kwargs: Any) -> str:
    """The one line a second RunLock of ``run_dir`` is refused with."""
    with pytest.raises(RunFolderError) as info, RunLock(run_dir, **kwargs):
        pass
    message = str(info.value)
    assert "\n" not in message and isinstance(info.value, RLGraphstepError)
    return message


def test_a_run_folder_has_one_owner_at_a_time(in_tmp: Path) -> None:
    with RunLock(in_tmp) as owner:
        assert owner.path == in_tmp / ".lock"
        assert owner.path.read_text() == f"{os.getpid()} {socket.gethostname()}\n"
        assert lock_error(in_tmp) == (f"runs/x is in use by another training (pid "
                                      f"{os.getpid()}); wait for it to end or pick another "
                                      "--run-name")
        assert lock_error(in_tmp, advice="wait for it to end before resuming it").endswith(
            "; wait for it to end before resuming it")
        (in_tmp / "events").write_text("logged")
    assert not (in_tmp / ".lock").exists()
    with RunLock(in_tmp):  # free again once released
        pass
    assert os.listdir(in_tmp) == ["events"]


def test_the_owner_on_another_host_is_named(in_tmp: Path) -> None:
    with RunLock(in_tmp) as owner:
        owner.path.write_text("4321 gpu-node-7\n")
        assert "(pid 4321 on gpu-node-7);" in lock_error(in_tmp)
        owner.path.write_text("")  # the moment between the owner's lock and its write
        assert lock_error(in_tmp).startswith("runs/x is in use by another training; wait")


def test_a_folder_made_for_the_lock_goes_when_nothing_was_written(in_tmp: Path) -> None:
    with RunLock(in_tmp):
        assert in_tmp.is_dir()
    assert not Path("runs").exists()  # runs/ was made for it too
    Path("runs").mkdir()
    with RunLock(in_tmp):
        pass
    assert Path("runs").is_dir() and not in_tmp.exists()


def test_a_folder_that_cannot_be_made_is_one_line(in_tmp: Path) -> None:
    Path("runs").write_text("a file, not a folder")
    message = lock_error(in_tmp)
    assert message.startswith("cannot make the lock file runs/x/.lock (")
    assert message.endswith("); the run folder must be writable")


def test_without_fcntl_runs_are_not_locked(in_tmp: Path, monkeypatch: pytest.MonkeyPatch
                                           ) -> None:
    monkeypatch.setattr(rundir, "fcntl", None)
    with RunLock(in_tmp), RunLock(in_tmp):
        pass
    assert not Path("runs").exists()


def test_a_file_system_without_locks_warns_and_goes_on(
        in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(rundir.fcntl, "flock", refuse)
    with pytest.warns(UserWarning, match="runs/x: the file system refuses locks"), \
            RunLock(in_tmp):
        pass


def test_a_lock_file_removed_after_it_was_opened_is_not_trusted(
        in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The owner removes its lock file on release: a process that had opened that file and
    then gets the lock must take the new one at the path, or two would own the folder."""
    in_tmp.mkdir(parents=True)
    flock, calls = rundir.fcntl.flock, []

    def owner_leaves_first(fd: int, operation: int) -> None:
        flock(fd, operation)
        if not calls:  # the first lock taken is on a file the owner then removes
            os.unlink(in_tmp / ".lock")
        calls.append(os.fstat(fd).st_ino)

    monkeypatch.setattr(rundir.fcntl, "flock", owner_leaves_first)
    with RunLock(in_tmp) as owner:
        assert len(calls) == 2  # locked, found the file gone, locked the new one
        assert os.stat(owner.path).st_ino == calls[1]
        monkeypatch.setattr(rundir.fcntl, "flock", flock)
        assert "in use by another training" in lock_error(in_tmp)


def test_a_seed_groups_name_holds_its_seeds() -> None:
    name = run_name(Config(env_id="Pendulum-v1", num_seeds=8))
    assert re.fullmatch(r"Pendulum-v1__sac__seeds_1-8__\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d", name)
    assert run_name(Config(seeds=[3, 5, 7])).startswith("Pendulum-v1__sac__seeds_3_5_7__")
    assert run_name(Config(seeds=[8, 7])).startswith("Pendulum-v1__sac__seeds_8_7__")
    # One seed given as a list is the single run's name, with that seed.
    assert run_name(Config(seeds=[9])).startswith("Pendulum-v1__sac__9__")
    assert run_name(Config(seeds=[9], run_name="mine")) == "mine"


def test_a_long_seed_list_is_shortened_in_the_name() -> None:
    assert seeds_label(tuple(range(1, 65))) == "1-64"
    many = tuple(range(10**9, 10**9 + 40, 2))
    assert seeds_label(many) == f"{10**9}_{10**9 + 2}_and_18_more"
    assert len(run_name(Config(seeds=many))) < 100


# ----------------------------------------------------------------------------- checked at start

# A tiny run into runs/x (as in_tmp names it), from the current folder.
RUN_X = ["--env", "Pendulum-v1", "--device", "cpu", "--learning-starts", "100", "--batch-size",
         "32", "--hidden-sizes", "16", "--no-progress", "--log-dir", "runs", "--run-name", "x"]


def test_a_checkpoints_file_in_the_way_stops_the_run_before_it_trains(tmp_path: Path) -> None:
    """It used to train the whole span and fail at the first save (``File exists``)."""
    run = tmp_path / "runs" / "x"
    run.mkdir(parents=True)
    (run / "checkpoints").write_text("mine")
    result = run_python("-m", "rl_graphstep.train", *RUN_X, "--total-timesteps", "300",
                        cwd=tmp_path, capture_output=True, text=True)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == ("error: cannot write checkpoints: runs/x/checkpoints is a file, "
                             "not a folder; move it away or pick another --log-dir or "
                             "--run-name\n")
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints"]  # nothing else written
    assert (run / "checkpoints").read_text() == "mine"


def refusing_folder(tmp_path: Path) -> Path:
    """A folder that refuses new files: read-only to its owner, or for root (whom permissions
    do not stop) sysfs, which takes no new file from anyone."""
    if os.geteuid() != 0:
        folder = tmp_path / "read-only"
        folder.mkdir(mode=0o555)
        return folder
    try:
        (Path("/sys") / "rl_graphstep_probe").touch()
    except OSError:
        return Path("/sys")
    pytest.skip("no folder here refuses a new file to root")


def test_a_checkpoints_folder_that_refuses_files_stops_the_run_at_the_start(
        in_tmp: Path, tmp_path: Path) -> None:
    in_tmp.mkdir(parents=True)
    (in_tmp / "checkpoints").symlink_to(refusing_folder(tmp_path))
    with pytest.raises(RunFolderError, match=r"^cannot write checkpoints into runs/x/"
                                             r"checkpoints \(Permission denied\); make it "
                                             r"writable or pick another --log-dir or "
                                             r"--run-name$"):
        train(load_config([*RUN_X, "--total-timesteps", "300"]))
    assert not list(in_tmp.glob("events.*"))


def test_a_resumed_run_whose_checkpoints_cannot_be_written_stops_at_the_start(
        in_tmp: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    train(load_config([*RUN_X, "--total-timesteps", "150"]))
    capsys.readouterr()

    def refused(**_: Any) -> None:
        raise PermissionError(errno.EACCES, "Permission denied")

    # As a folder made read-only would (permissions do not stop root, who may run this).
    monkeypatch.setattr(rundir, "tempfile", type(os)("tempfile"))
    monkeypatch.setattr(rundir.tempfile, "NamedTemporaryFile", refused, raising=False)
    assert main(["--resume", "runs/x", "--total-timesteps", "300"]) == 2
    assert capsys.readouterr() == ("", "error: cannot write checkpoints into runs/x/checkpoints "
                                       "(Permission denied); make it writable\n")
    assert load_checkpoint("runs/x")["global_step"] == 150


def test_videos_that_cannot_be_written_stop_evaluate_before_its_episodes(
        in_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    train(load_config([*RUN_X, "--total-timesteps", "150"]))
    (in_tmp / "videos").write_text("mine")
    capsys.readouterr()
    assert evaluate_main(["runs/x", "--episodes", "1", "--video", "--device", "cpu"]) == 2
    assert capsys.readouterr() == ("", "error: cannot write videos: runs/x/videos is a file, "
                                       "not a folder; move it away or evaluate without "
                                       "--video\n")


def test_a_broken_link_for_a_folder_is_named_with_its_target(in_tmp: Path) -> None:
    in_tmp.mkdir(parents=True)
    (in_tmp / "checkpoints").symlink_to("/no/such/disk")
    with pytest.raises(RunFolderError, match=r"^cannot write checkpoints: runs/x/checkpoints "
                                             r"is a link to /no/such/disk, which does not "
                                             r"exist; make that folder or remove the link$"):
        rundir.check_writable_folder(in_tmp / "checkpoints", "checkpoints")
    rundir.check_writable_folder(in_tmp / "videos", "videos")  # made in a writable folder
    assert sorted(p.name for p in in_tmp.iterdir()) == ["checkpoints"]  # the probe is gone


def test_a_log_dir_that_is_a_broken_link_is_named_with_its_target(
        in_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """It was 'cannot make the lock file links/x/.lock (File exists)'."""
    Path("links").symlink_to("/no/such/disk")
    assert main([*RUN_X, "--log-dir", "links/deeper", "--total-timesteps", "150"]) == 2
    assert capsys.readouterr() == ("", "error: cannot make the run folder links/deeper/x: links "
                                       "is a link to /no/such/disk, which does not exist; make "
                                       "that folder or remove the link, or pick another "
                                       "--log-dir or --run-name\n")
    assert sorted(p.name for p in Path().iterdir()) == ["links"]


def test_a_leading_tilde_is_the_home_folder(in_tmp: Path, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """``--log-dir=~/runs`` (no shell expands a ~ after =), a quoted '~' and a YAML value
    made a folder named ~ in the current one, and evaluate or --resume of '~/...' said it
    did not exist."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    run = [arg for arg in RUN_X if arg not in ("--log-dir", "runs")]
    result = run_python("-m", "rl_graphstep.train", *run, "--log-dir=~/runs",
                        "--total-timesteps", "150", capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"{home}/runs/x: SAC on Pendulum-v1")
    assert load_checkpoint(home / "runs" / "x")["config"]["log_dir"] == f"{home}/runs"
    assert sorted(p.name for p in Path().iterdir()) == ["home"]  # no folder named ~ here
    assert evaluate_main(["~/runs/x", "--episodes", "1", "--device", "cpu"]) == 0
    assert main(["--resume", "~/runs/x", "--log-dir", "~/runs", "--total-timesteps", "300"]) == 0
    assert load_checkpoint("~/runs/x")["global_step"] == 300
    Path("home/tilde.yaml").write_text("log_dir: ~/from_yaml\n")
    assert load_config(["--config", "~/tilde.yaml"]).log_dir == f"{home}/from_yaml"
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("seeds", [1, 2])
def test_a_run_started_again_after_one_that_saved_nothing_logs_each_step_once(
        in_tmp: Path, capsys: pytest.CaptureFixture[str], seeds: int) -> None:
    """The first run's event files (a run killed before its first checkpoint: here its
    checkpoints removed) move to earlier_start/ with their layout; the new run's curves count
    each step once, as a sweep's restarted trial's do."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    args = [*RUN_X, "--total-timesteps", "300", "--num-seeds", str(seeds)]
    assert main(args) == 0
    for checkpoint in (in_tmp / "checkpoints").iterdir():
        checkpoint.unlink()
    before = sorted(p.relative_to(in_tmp) for p in in_tmp.rglob("events.out.tfevents.*"))
    capsys.readouterr()
    assert main(args) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.endswith("; the logs of an earlier start, which saved no checkpoint, moved "
                          "to runs/x/earlier_start")
    moved = sorted(p.relative_to(in_tmp / "earlier_start")
                   for p in (in_tmp / "earlier_start").rglob("events.out.tfevents.*"))
    assert moved == before and len(moved) == (1 if seeds == 1 else 1 + seeds)
    curve = in_tmp if seeds == 1 else in_tmp / "seed_1"
    events = EventAccumulator(str(curve))
    events.Reload()
    steps = [e.step for e in events.Scalars("charts/episodic_return")]
    assert steps == sorted(set(steps)) and steps[-1] == 200  # one episode of 200 steps
    assert main(args) == 2  # it has checkpoints now: continued, not started again
