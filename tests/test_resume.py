"""Checkpoints and exact resume through the training loop, and Ctrl-C / SIGTERM on a real
training process."""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from fakes import assert_same_state
from processtools import Children, run
from resumetools import straight_and_halves
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rl_graphstep.core.errors import TrainingInterrupted
from rl_graphstep.run.checkpoint import (
    FORMAT,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from rl_graphstep.run.cli import suggested_command
from rl_graphstep.run.flags import load_config
from rl_graphstep.run.rundir import RunLock
from rl_graphstep.settings.config import config_to_dict
from rl_graphstep.train import main, stop_requests, train

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["--env", "Pendulum-v1", "--device", "cpu", "--learning-starts", "200",
         "--batch-size", "32", "--hidden-sizes", "32", "32", "--buffer-size", "5000",
         "--log-interval", "100", "--no-progress", "--save-buffer", "--seed", "3"]


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_resume_continues_bit_for_bit(algo: str, tmp_path: Path) -> None:
    args = [*SMALL, "--algo", algo, "--log-dir", str(tmp_path)]
    straight, halves = straight_and_halves(tmp_path, args, 800, 400)
    assert straight["global_step"] == halves["global_step"] == 800
    assert straight["agent"]["updates"] == 600
    assert_same_state(straight["agent"], halves["agent"])
    assert_same_state(straight["recent_returns"], halves["recent_returns"])


def test_a_seed_group_resumes_bit_for_bit(tmp_path: Path) -> None:
    """A group of two seeds stopped at step 400 and resumed to 800 ends where the group run
    straight to 800 does: every seed's learning state, returns and tallies."""
    args = [*SMALL, "--num-seeds", "2", "--hidden-sizes", "16", "16", "--log-dir",
            str(tmp_path)]
    straight, halves = straight_and_halves(tmp_path, args, 800, 400)
    assert straight["global_step"] == halves["global_step"] == 800
    assert straight["agent"]["critic"]["stacked.weights.0"].shape[0] == 2
    assert_same_state(straight["agent"], halves["agent"])
    assert_same_state(straight["recent_returns"], halves["recent_returns"])
    assert len(straight["recent_returns"]) == 2


def test_a_checkpoint_saved_before_vec_env_resumes_as_the_same_run(tmp_path: Path) -> None:
    """A checkpoint whose config holds the settings of before --vec-env (async_envs,
    env_worker, overlap) resumes: the env worker is dropped with a warning and the envs step
    in process, ending exactly as a run stepped in process throughout."""
    args = [*SMALL, "--log-dir", str(tmp_path)]
    train(load_config([*args, "--total-timesteps", "800", "--run-name", "straight"]))
    train(load_config([*args, "--total-timesteps", "400", "--run-name", "halves"]))
    saved = list_checkpoints(tmp_path / "halves")[-1]
    state = torch.load(saved, weights_only=False)
    config = state["config"]
    del config["vec_env"]
    config.update(async_envs=False, env_worker=True, overlap=True)  # as the old runs saved
    torch.save(state, saved)
    with pytest.warns(UserWarning, match="stepped its environments in the env worker, which "
                      "was removed; they now step in this process"):
        assert main(["--resume", str(tmp_path / "halves"), "--total-timesteps", "800"]) == 0
    straight = load_checkpoint(tmp_path / "straight")
    halves = load_checkpoint(tmp_path / "halves")
    assert halves["config"]["vec_env"] == "sync" and "env_worker" not in halves["config"]
    assert_same_state(straight["agent"], halves["agent"])
    assert_same_state(straight["recent_returns"], halves["recent_returns"])
    envs = [pickle.loads(run["envs"]) for run in (straight, halves)]
    actions = np.full((1, 1), 0.7)
    np.testing.assert_array_equal(envs[0].step(actions)[0], envs[1].step(actions)[0])


def test_resume_continues_the_log_without_gaps_or_repeats(tmp_path: Path) -> None:
    args = [*SMALL, "--log-dir", str(tmp_path), "--run-name", "run"]
    train(load_config([*args, "--total-timesteps", "400", "--checkpoint-every", "300"]))
    # Resume from the step-300 checkpoint, as after a crash at step 400: the events written
    # after step 300 are replaced, not doubled.
    first = list_checkpoints(tmp_path / "run")[0]
    assert first.name == "step_000000000300.pt"
    # Readers order event files by name, which starts with the second it was made in and
    # ends with a per-process counter: two in one second of one process can sort wrongly.
    time.sleep(1.0)
    assert main(["--resume", str(first), "--total-timesteps", "600"]) == 0
    events = EventAccumulator(str(tmp_path / "run"))
    events.Reload()
    assert [e.step for e in events.Scalars("losses/critic")] == [300, 400, 500, 600]
    assert [e.step for e in events.Scalars("charts/episodic_length")] == [200, 400, 600]


def test_resuming_an_older_checkpoint_sets_the_later_ones_aside(tmp_path: Path) -> None:
    args = [*SMALL, "--log-dir", str(tmp_path), "--run-name", "run", "--checkpoint-every",
            "100", "--keep-checkpoints", "5"]
    train(load_config([*args, "--total-timesteps", "400"]))
    old = {p.name: load_checkpoint(p)["agent"] for p in list_checkpoints(tmp_path / "run")}
    first = list_checkpoints(tmp_path / "run")[0]
    # The new timeline learns from step 200 on (--learning-starts 200) up to 300.
    assert main(["--resume", str(first), "--total-timesteps", "300"]) == 0
    # The new timeline's checkpoints, and the old timeline's later ones kept apart, unchanged.
    names = [p.name for p in list_checkpoints(tmp_path / "run")]
    assert names == ["step_000000000100.pt", "step_000000000200.pt", "step_000000000300.pt"]
    aside = tmp_path / "run" / "checkpoints" / "abandoned_after_000000000100"
    later = ["step_000000000200.pt", "step_000000000300.pt", "step_000000000400.pt"]
    assert sorted(p.name for p in aside.iterdir()) == later
    for name in later:
        assert_same_state(load_checkpoint(aside / name)["agent"], old[name])
    latest = load_checkpoint(tmp_path / "run")
    assert latest["global_step"] == 300 and latest["agent"]["updates"] == 100  # the new latest


def test_keeps_the_newest_checkpoints(tmp_path: Path) -> None:
    train(load_config([*SMALL, "--log-dir", str(tmp_path), "--run-name", "run",
                       "--total-timesteps", "500", "--checkpoint-every", "100",
                       "--keep-checkpoints", "2"]))
    assert [p.name for p in list_checkpoints(tmp_path / "run")] == [
        "step_000000000400.pt", "step_000000000500.pt"]


def wait_for_logs(run_dir: Path, process: subprocess.Popen) -> None:
    """Until the training ``process`` has started logging into ``run_dir``: it is in its loop,
    its stop signals caught. Fails at once, with its errors, when it ended instead."""
    deadline = time.monotonic() + 120
    while not list(run_dir.glob("events.*")):
        assert process.poll() is None, process.communicate()[1]
        assert time.monotonic() < deadline, "no event file in 120 s"
        time.sleep(0.2)


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130),
                                             (signal.SIGHUP, 129)])
def test_a_signal_saves_flushes_and_resumes(signum: int, code: int, tmp_path: Path,
                                            children: Children) -> None:
    args = [*SMALL, "--log-dir", str(tmp_path), "--run-name", "run", "--checkpoint-every",
            "100000"]
    process = children.python("-m", "rl_graphstep.train", *args, "--total-timesteps", "100000",
                              cwd=ROOT, stderr=subprocess.PIPE, text=True)
    wait_for_logs(tmp_path / "run", process)
    time.sleep(3)  # let it learn for a while
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == code, stderr
    assert "checkpoint" in stderr and "--resume" in stderr
    stopped_at = load_checkpoint(tmp_path / "run")["global_step"]
    assert 0 < stopped_at < 100_000
    events = EventAccumulator(str(tmp_path / "run"))
    events.Reload()
    assert events.Scalars("charts/SPS")[-1].step == stopped_at  # flushed at the stop
    assert main(["--resume", str(tmp_path / "run"), "--total-timesteps",
                 str(stopped_at + 100)]) == 0
    assert load_checkpoint(tmp_path / "run")["global_step"] == stopped_at + 100


def test_a_signal_between_the_logs_and_the_checkpoint_logs_the_step_it_saves(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stop signal handled after the loop chose not to log step 516 (no log interval's) but
    before it chose whether to save: the run stops there, with that step's logs and
    checkpoint. (The loop read the signals at each test: it saved step 516, its logs ending
    at 500; one after the save's test stopped without a save, its line naming an older
    checkpoint. Deferred to the next step instead, a held-down Ctrl-C's second signal came
    during that step's env step, and interrupted it.)"""
    from rl_graphstep.run.collector import Collector

    checkpoint_due = Collector.checkpoint_due

    def signal_at_516(self: Collector, step: int, every: int) -> bool:
        if step == 516:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.1)  # the handler runs before the next line
        return checkpoint_due(self, step, every)

    monkeypatch.setattr(Collector, "checkpoint_due", signal_at_516)
    cfg = load_config([*SMALL, "--log-dir", str(tmp_path), "--run-name", "run",
                       "--total-timesteps", "1000", "--checkpoint-every", "100000"])
    with pytest.raises(TrainingInterrupted, match="SIGINT at step 516: checkpoint"):
        train(cfg)
    assert load_checkpoint(tmp_path / "run")["global_step"] == 516
    events = EventAccumulator(str(tmp_path / "run"))
    events.Reload()
    assert [e.step for e in events.Scalars("charts/SPS")][-2:] == [500, 516]


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_second_signal_interrupts_an_env_step_that_never_returns(
        signum: int, code: int, tmp_path: Path, children: Children) -> None:
    """The first signal waits for the step to end, as ever; the second, while the env has
    not returned, interrupts it and saves what the run learned (no signal did anything: only
    kill -9 ended the run, losing everything since its last checkpoint)."""
    marker = tmp_path / "hanging"
    env = {**os.environ, "HANGING_STEP_MARKER": str(marker),
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    run_dir = tmp_path / "run"
    process = children.python(
        "-m", "rl_graphstep.train", "--env", "fakes:HangsLate-v0", "--device", "cpu",
        "--learning-starts", "100", "--batch-size", "32", "--hidden-sizes", "16",
        "--no-progress", "--total-timesteps", "1000", "--log-dir", str(tmp_path),
        "--run-name", "run", cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert process.poll() is None and time.monotonic() < deadline, process.stderr.read()
        time.sleep(0.1)
    process.send_signal(signum)
    time.sleep(1)
    assert process.poll() is None  # the first waits for a step that does not end
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=60)
    name = signal.Signals(signum).name
    saved = run_dir / "checkpoints" / "step_000000000150.pt"
    resume = suggested_command("train", "--resume", str(run_dir))
    assert (process.returncode, stderr) == (code, (
        f"stopped: {name} again while the environment's step had not returned: interrupted "
        f"at step 150; checkpoint {saved} saved (without the environments, whose episodes "
        f"restart) and logs flushed; continue with: {resume}\n"))
    state = load_checkpoint(run_dir)
    assert (state["global_step"], state["envs"]) == (150, None)


@pytest.mark.parametrize("errors", ["apart", "with the output"])
def test_output_nobody_reads_stops_the_run_with_a_checkpoint(errors: str, tmp_path: Path,
                                                             children: Children) -> None:
    """``train | tee log`` whose ``tee`` dies first (a Ctrl-C in the terminal), ``train |
    head``: the next progress line finds the pipe closed, and the run stops as a signal
    would stop it, saved, with no traceback (exit 141, as a shell reports SIGPIPE)."""
    args = [a for a in SMALL if a != "--no-progress"]
    process = children.python(
        "-m", "rl_graphstep.train", *args, "--log-dir", str(tmp_path), "--run-name", "run",
        "--checkpoint-every", "100000", "--total-timesteps", "100000", cwd=ROOT,
        stdout=subprocess.PIPE, text=True,
        stderr=subprocess.PIPE if errors == "apart" else subprocess.STDOUT)
    assert process.stdout.readline().startswith(str(tmp_path / "run"))  # the first line
    process.stdout.close()  # the reader goes away; a progress line comes within 10 s
    stderr = process.stderr.read() if process.stderr else ""
    assert process.wait(timeout=120) == 128 + signal.SIGPIPE, stderr
    if errors == "apart":  # the stop is said where it can still be read
        assert stderr.startswith("stopped: SIGPIPE (the output's reader went away) at step")
        assert "Traceback" not in stderr
    stopped_at = load_checkpoint(tmp_path / "run")["global_step"]
    assert 0 < stopped_at < 100_000
    assert main(["--resume", str(tmp_path / "run"), "--total-timesteps",
                 str(stopped_at + 100)]) == 0


@pytest.mark.parametrize("closed", [">&-", ">&- 2>&- <&-"], ids=["stdout", "all three"])
def test_a_run_started_without_its_standard_streams_runs_to_the_end(closed: str,
                                                                    tmp_path: Path) -> None:
    """``train >&-`` (a service manager or cron job with no output): the run trains, saves
    and logs as with ``>/dev/null``, and no file it opens takes the free descriptor."""
    args = [*SMALL, "--log-dir", str(tmp_path), "--run-name", "run", "--vec-env", "async",
            "--num-envs", "2", "--total-timesteps", "400"]
    result = run(["sh", "-c", f'exec "$0" "$@" {closed}', sys.executable, "-m",
                  "rl_graphstep.train", *args], cwd=ROOT, stderr=subprocess.PIPE, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # closed, or nothing to say
    assert load_checkpoint(tmp_path / "run")["global_step"] == 400
    events = EventAccumulator(str(tmp_path / "run"))
    events.Reload()
    assert events.Scalars("charts/SPS")[-1].step == 400


def test_a_stop_signal_ignored_at_the_start_stays_ignored() -> None:
    """``nohup train`` ignores SIGHUP: the run must live on past the terminal's closing."""
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with stop_requests() as stops:
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            signal.raise_signal(signal.SIGTERM)
            assert stops == [signal.SIGTERM]
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP],
                         ids=["int", "term", "hup"])
@pytest.mark.parametrize("kind", ["async", "shared"])
def test_a_stop_to_the_process_group_spares_the_env_subprocesses(kind: str, signum: int,
                                                                 tmp_path: Path,
                                                                 children: Children) -> None:
    """A terminal's Ctrl-C or SIGHUP, or a batch system's SIGTERM, reaches every process of
    the group, the vector env's workers too: they must live on so the run can save its
    checkpoint and close them."""
    args = [*SMALL, "--log-dir", str(tmp_path), "--run-name", "run", "--vec-env", kind,
            "--num-envs", "2"]
    process = children.python("-m", "rl_graphstep.train", *args, "--total-timesteps", "100000",
                              cwd=ROOT, stderr=subprocess.PIPE, text=True)
    wait_for_logs(tmp_path / "run", process)
    time.sleep(2)
    os.killpg(process.pid, signum)  # it leads a group of its own (processtools)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + signum, stderr
    assert f"stopped: {signal.Signals(signum).name} at step" in stderr
    assert "Traceback" not in stderr
    assert load_checkpoint(tmp_path / "run")["global_step"] > 0


def test_a_new_run_never_overwrites_an_existing_one(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    args = [*SMALL, "--log-dir", str(tmp_path), "--run-name", "run", "--total-timesteps", "300"]
    train(load_config(args))
    before = {p: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()}
    assert main(args) == 2
    assert "already holds a run with checkpoints; pick another --run-name, or continue it " \
        "with: " in capsys.readouterr().err
    assert {p: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()} == before


def files_of(run_dir: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}


def test_a_second_training_with_the_same_run_name_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A run in progress (held here; it has logged but not yet saved) keeps its folder alone."""
    run_dir = tmp_path / "same"
    with RunLock(run_dir):
        (run_dir / "events.out.tfevents.1.first").write_bytes(b"the first run's events")
        before = files_of(run_dir)
        args = [*SMALL, "--log-dir", str(tmp_path), "--run-name", "same", "--total-timesteps",
                "300"]
        assert main(args) == 2
        assert files_of(run_dir) == before
    assert capsys.readouterr().err == (
        f"error: {run_dir} is in use by another training (pid {os.getpid()}); wait for it "
        "to end or pick another --run-name\n")
    assert not (run_dir / ".lock").exists()  # released and removed with its holder


def test_a_second_resume_of_a_run_is_refused(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Neither a resume from the latest nor one that would set later checkpoints aside may
    touch a run that another process is resuming."""
    cfg = load_config([*SMALL, "--log-dir", str(tmp_path), "--run-name", "run",
                       "--total-timesteps", "300"])
    run_dir = tmp_path / "run"
    for step in (100, 200, 300):  # what the refused resumes read: the config
        save_checkpoint(run_dir, step, {"format": FORMAT, "config": config_to_dict(cfg),
                                        "global_step": step, "agent": {}}, keep=5)
    first = list_checkpoints(run_dir)[0]
    with RunLock(run_dir, advice="wait for it to end before resuming it"):
        before = files_of(run_dir)
        assert main(["--resume", str(run_dir), "--total-timesteps", "400"]) == 2
        assert main(["--resume", str(first), "--total-timesteps", "400"]) == 2
        assert files_of(run_dir) == before
    line = (f"error: {run_dir} is in use by another training (pid {os.getpid()}); wait for it "
            "to end before resuming it\n")
    assert capsys.readouterr().err == line * 2
    assert [p.name for p in list_checkpoints(run_dir)] == [
        "step_000000000100.pt", "step_000000000200.pt", "step_000000000300.pt"]


def test_the_lock_of_a_killed_training_is_free(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str],
                                               children: Children) -> None:
    """kill -9 runs no clean-up; the kernel drops the process's lock all the same, even while
    a process it forked (an env subprocess, say) lives on."""
    run_dir = tmp_path / "run"
    holder = children.python(
        "-c", "import multiprocessing, sys, time\n"
        "from rl_graphstep.run.rundir import RunLock\n"
        "RunLock(sys.argv[1]).__enter__()\n"
        "worker = multiprocessing.get_context('fork').Process(target=time.sleep, args=(120,))\n"
        "worker.start()\n"
        "print(worker.pid, flush=True)\n"
        "time.sleep(120)\n", str(run_dir), cwd=ROOT, stdout=subprocess.PIPE, text=True)
    worker = None
    try:
        worker = int(holder.stdout.readline())
        args = [*SMALL, "--log-dir", str(tmp_path), "--run-name", "run", "--total-timesteps",
                "300"]
        assert main(args) == 2
        assert f"in use by another training (pid {holder.pid});" in capsys.readouterr().err
        holder.kill()  # SIGKILL
        holder.wait(timeout=30)
        assert holder.returncode == -signal.SIGKILL
        assert (run_dir / ".lock").read_text().startswith(f"{holder.pid} ")  # left behind
        os.kill(worker, 0)  # the forked process still lives
        with RunLock(run_dir):
            pass
    finally:  # the holder is ended with the test (children); its forked worker here
        if worker is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker, signal.SIGKILL)
    assert main(args) == 0
    assert "removed" not in capsys.readouterr().out  # said only when something was removed
    assert load_checkpoint(run_dir)["global_step"] == 300
    assert not (run_dir / ".lock").exists()


def test_partial_saves_of_killed_runs_are_removed_at_start_and_resume(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    folder = run_dir / "checkpoints"
    folder.mkdir(parents=True)
    # A run killed during its first save: the temporary file, and no checkpoint.
    (folder / ".step_000000000100.k2j4hx8w.tmp").write_bytes(bytes(1500))
    args = [*SMALL, "--log-dir", str(tmp_path), "--run-name", "run", "--total-timesteps", "300"]
    assert main(args) == 0
    start = capsys.readouterr().out.splitlines()[0]
    assert start.endswith("; removed 1 partial checkpoint file (2 kB)")
    assert [p.name for p in folder.iterdir()] == ["step_000000000300.pt"]
    for name in (".step_000000000400.abcdefgh.tmp", ".step_000000000500.01234567.tmp"):
        (folder / name).write_bytes(bytes(2_500_000))
    (folder / "notes.tmp").write_bytes(b"not ours")  # kept: not a checkpoint's temporary file
    assert main(["--resume", str(run_dir), "--total-timesteps", "400"]) == 0
    start = capsys.readouterr().out.splitlines()[0]
    assert start.endswith("; resumed at step 300; removed 2 partial checkpoint files (5 MB)")
    assert sorted(p.name for p in folder.iterdir()) == [
        "notes.tmp", "step_000000000300.pt", "step_000000000400.pt"]


def test_a_refused_resume_of_an_older_checkpoint_moves_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Refused once the networks are built (sizes other than the run's), the resume leaves the
    later checkpoints where they were: they were set aside before it was refused."""
    args = [*SMALL, "--log-dir", str(tmp_path), "--run-name", "run", "--checkpoint-every",
            "100", "--keep-checkpoints", "5"]
    train(load_config([*args, "--total-timesteps", "300"]))
    before = [p.name for p in list_checkpoints(tmp_path / "run")]
    first = list_checkpoints(tmp_path / "run")[0]
    capsys.readouterr()
    assert main(["--resume", str(first), "--hidden-sizes", "8"]) == 2
    assert "hidden" in capsys.readouterr().err
    assert [p.name for p in list_checkpoints(tmp_path / "run")] == before
    assert not list((tmp_path / "run" / "checkpoints").glob("abandoned_after_*"))


def test_a_resume_without_the_buffer_says_its_updates_wait_for_a_batch(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The first line of a run resumed without --save-buffer says how long its updates wait
    (a batch of 32 steps here); the folder, named as runs were before (by the Unix time), is
    still found by --resume and by evaluate."""
    from rl_graphstep.evaluate import main as evaluate_main

    run_dir = tmp_path / "Pendulum-v1__sac__3__1796014201"
    args = [a for a in SMALL if a != "--save-buffer"]
    assert main([*args, "--log-dir", str(tmp_path), "--run-name", run_dir.name,
                 "--total-timesteps", "300"]) == 0
    capsys.readouterr()
    assert main(["--resume", str(run_dir), "--total-timesteps", "400"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("; resumed at step 300; the replay buffer was not saved "
                           "(--save-buffer saves it): updates wait until it holds a batch "
                           "again (32 steps)"), out[0]
    assert load_checkpoint(run_dir)["global_step"] == 400
    assert evaluate_main([str(run_dir), "--episodes", "1", "--device", "cpu"]) == 0
    # With its buffer saved, a resumed run says nothing of the kind.
    assert main([*SMALL, "--log-dir", str(tmp_path), "--run-name", "saved",
                 "--total-timesteps", "300"]) == 0
    capsys.readouterr()
    assert main(["--resume", str(tmp_path / "saved"), "--total-timesteps", "400"]) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith("; resumed at step 300")


def test_obs_norm_resumes_bit_for_bit(tmp_path: Path) -> None:
    """A --obs-norm group stopped at 400 and resumed to 800 ends with the statistics, and the
    networks learned through them, of the group run straight to 800."""
    args = [*SMALL, "--num-seeds", "2", "--hidden-sizes", "16", "16", "--obs-norm",
            "--log-dir", str(tmp_path)]
    train(load_config([*args, "--total-timesteps", "800", "--run-name", "straight"]))
    train(load_config([*args, "--total-timesteps", "400", "--run-name", "halves"]))
    assert load_checkpoint(tmp_path / "halves")["obs_normalizer"]["count"].tolist() == [400,
                                                                                        400]
    assert main(["--resume", str(tmp_path / "halves"), "--total-timesteps", "800"]) == 0
    straight = load_checkpoint(tmp_path / "straight")
    halves = load_checkpoint(tmp_path / "halves")
    assert straight["obs_normalizer"]["count"].tolist() == [800, 800]
    assert_same_state(straight["obs_normalizer"], halves["obs_normalizer"])
    assert_same_state(straight["agent"], halves["agent"])


@pytest.mark.parametrize(("given", "line"), [
    ("--obs-norm", "--obs-norm does not match: the resumed run trained on raw observations; "
                   "drop --obs-norm"),
    ("--no-obs-norm", "--no-obs-norm does not match: the resumed run trained on normalised "
                      "observations (--obs-norm); drop --no-obs-norm"),
])
def test_obs_norm_cannot_change_on_resume(given: str, line: str, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    own = "--no-obs-norm" if given == "--obs-norm" else "--obs-norm"
    assert main([*SMALL, own, "--log-dir", str(tmp_path), "--run-name", "run",
                 "--total-timesteps", "250"]) == 0
    capsys.readouterr()
    assert main(["--resume", str(tmp_path / "run"), given, "--total-timesteps", "300"]) == 2
    assert line in capsys.readouterr().err
