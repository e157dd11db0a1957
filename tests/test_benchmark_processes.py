"""benchmarks/processes.py: a group ended is a group gone, the leader's children included, at
the moment the call returns (what the next arm or the benchmark's exit relies on)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import processes  # noqa: E402
import recipes  # noqa: E402
from processtools import running  # noqa: E402

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="reads process states from /proc")

# A leader that starts a worker in its own group which ignores SIGINT and SIGTERM (as a stuck
# env worker would), writes the worker's pid, then stops on SIGINT or sleeps until killed.
_LEADER = """import signal, subprocess, sys, time
worker = subprocess.Popen([sys.executable, "-c", "import signal, time; "
    "signal.signal(signal.SIGINT, signal.SIG_IGN); signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('ready', flush=True); time.sleep(120)"], stdout=subprocess.PIPE, text=True)
worker.stdout.readline()
open(sys.argv[1], "w").write(str(worker.pid))
signal.signal(signal.SIGINT, lambda *_: sys.exit(130))
if sys.argv[2] == "stay":
    time.sleep(120)
"""


def start_leader(tmp_path: Path, mode: str) -> tuple[subprocess.Popen, Path]:
    pid_file = tmp_path / "worker"
    process = subprocess.Popen([sys.executable, "-c", _LEADER, str(pid_file), mode],
                               start_new_session=True)
    deadline = time.monotonic() + 60
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline and process.poll() in (None, 0), "no worker started"
        time.sleep(0.05)
    return process, pid_file


@pytest.mark.parametrize("mode", ["stay", "leave"])
def test_a_group_ended_has_no_live_member_left(tmp_path: Path, mode: str) -> None:
    process, pid_file = start_leader(tmp_path, mode)
    worker = int(pid_file.read_text())
    try:
        assert running(worker) and worker in processes.group_members(process.pid)
        code = processes.end_group(process, grace_s=0.5)
        assert not running(worker), "the worker outlived end_group"
        assert processes.group_members(process.pid) == []
        # The leader ended by SIGTERM while it stayed; by itself (0) when it left first.
        assert code == (-signal.SIGTERM if mode == "stay" else 0)
        assert processes.end_group(process) == code  # again: nothing to do, same code
    finally:
        processes.end_group(process, signal.SIGKILL, 0)


def test_a_recipe_run_stopped_at_its_budget_leaves_no_worker(tmp_path: Path) -> None:
    pid_file = tmp_path / "worker"
    code = recipes.run_for([sys.executable, "-c", _LEADER, str(pid_file), "stay"], 3.0,
                           tmp_path / "run.log", grace_s=5.0)
    assert code == 130  # the leader's own clean stop on SIGINT
    assert not running(int(pid_file.read_text())), "the run's worker outlived run_for"
