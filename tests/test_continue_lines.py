"""Every line that gives a command to go on with runs as printed: its paths quoted for the
shell, the interpreter that has rl_graphstep, and each flag the command needs (the sweep's
stop line is run as printed in tests/test_sweep.py)."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from processtools import Children, run

from rl_graphstep.run.cli import suggested_command
from rl_graphstep.train import main

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["--env", "Pendulum-v1", "--device", "cpu", "--learning-starts", "200",
         "--batch-size", "32", "--hidden-sizes", "32", "32", "--buffer-size", "5000",
         "--log-interval", "100", "--no-progress", "--seed", "3"]
AWKWARD = "my runs"  # a space, and below a run named with a quote
NAME = "it's"


def test_a_suggested_command_reads_back_as_its_arguments() -> None:
    awkward = "my runs/it's $HOME \"x\" `y`"
    words = shlex.split(suggested_command("train", "--resume", awkward))
    assert words[1:] == ["-m", "rl_graphstep.train", "--resume", awkward]


def test_python_is_named_by_its_path_unless_a_shell_finds_this_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    other = shutil.which("sh") or "/bin/sh"
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert shlex.split(suggested_command("train"))[0] == sys.executable
    monkeypatch.setattr(shutil, "which", lambda name: sys.executable)
    assert suggested_command("train", "a b") == "python -m rl_graphstep.train 'a b'"
    # Another interpreter (the system's, where a venv is run by its path) is not this one.
    monkeypatch.setattr(shutil, "which", lambda name: other)
    assert shlex.split(suggested_command("train"))[0] == sys.executable


def child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def test_a_stopped_run_continues_with_the_command_its_stop_line_gives(
        tmp_path: Path, children: Children) -> None:
    """Stopped with Ctrl-C, the run's last line gives a command; run as printed, from the same
    folder, it resumes the run (stopped again once it has: the run is a long one)."""
    start = [sys.executable, "-m", "rl_graphstep.train", *SMALL, "--log-dir", AWKWARD,
             "--run-name", NAME, "--total-timesteps", "100000"]
    first_run = children.start(start, cwd=tmp_path, env=child_env(), stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list((tmp_path / AWKWARD / NAME).glob("events.*")) and (
            time.monotonic() < deadline):
        time.sleep(0.2)
    time.sleep(1)
    first_run.send_signal(signal.SIGINT)
    _, stderr = first_run.communicate(timeout=120)
    assert first_run.returncode == 130, stderr
    printed = suggested_command("train", "--resume", f"{AWKWARD}/{NAME}")
    assert stderr.splitlines()[-1].endswith(f"; continue with: {printed}")
    again = children.start(shlex.split(printed), cwd=tmp_path, env=child_env(),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert again.stdout is not None
    first = again.stdout.readline()
    assert f"{AWKWARD}/{NAME}: SAC on Pendulum-v1" in first and "resumed at step" in first
    again.send_signal(signal.SIGINT)
    _, stderr = again.communicate(timeout=120)
    assert again.returncode == 130, stderr


def test_a_run_folder_taken_gives_the_command_that_continues_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    args = [*SMALL, "--log-dir", AWKWARD, "--run-name", NAME, "--total-timesteps", "300"]
    assert main(args) == 0
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    printed = suggested_command("train", "--resume", f"{AWKWARD}/{NAME}")
    assert err == (f"error: {AWKWARD}/{NAME} already holds a run with checkpoints; pick another "
                   f"--run-name, or continue it with: {printed}\n")
    again = run(shlex.split(printed), cwd=tmp_path, env=child_env(), capture_output=True,
                text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert "resumed at step 300" in again.stdout
