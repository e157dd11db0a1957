"""A Ctrl-C (or SIGTERM) to the whole process group stops a GPU run cleanly: the stop line,
the checkpoint of the stop and the run folder's lock released, with the GPU loop's parts all
at work (CUDA graphs, torch.compile, the action stream, shared envs, a seed group). On the H200 two
MuJoCo groups (SAC on Humanoid-v5, TD3 on Walker2d-v5) ended at a SIGINT with exit status 130
and none of these, while groups beside them stopped cleanly; the CPU loop always does."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from processtools import Children

from rl_graphstep.run.checkpoint import load_checkpoint
from rl_graphstep.run.rundir import LOCK_FILE

pytestmark = pytest.mark.cuda

ROOT = Path(__file__).resolve().parent.parent


def _wait_for(path: Path, text: str, process: subprocess.Popen[bytes], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while text not in path.read_text(errors="replace"):
        assert process.poll() is None, path.read_text(errors="replace")
        assert time.monotonic() < deadline, f"no {text!r} in {seconds} s"
        time.sleep(0.2)


def _catches(pid: int, signum: int) -> bool:
    """Whether the process has a handler for ``signum`` at the C level (its SigCgt mask): a
    library that resets it behind Python's back shows here, not in signal.getsignal."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) & (1 << (signum - 1)))
    raise AssertionError("no SigCgt line")


@pytest.mark.parametrize(("algo", "env_id", "signum"), [
    ("sac", "Pendulum-v1", signal.SIGINT), ("td3", "Walker2d-v5", signal.SIGINT),
    ("sac", "Humanoid-v5", signal.SIGINT), ("td3", "Walker2d-v5", signal.SIGTERM)],
    ids=["pendulum-int", "walker2d-int", "humanoid-int", "walker2d-term"])
def test_a_signal_to_the_group_stops_a_compiled_gpu_run_cleanly(algo: str, env_id: str,
                                                                signum: int,
                                                                tmp_path: Path,
                                                                children: Children) -> None:
    if env_id != "Pendulum-v1":
        pytest.importorskip("mujoco")
    args = ["--algo", algo, "--env", env_id, "--device", "cuda", "--num-seeds", "5",
            "--graph", "on", "--compile", "on", "--vec-env", "shared",
            "--total-timesteps", "1000000", "--learning-starts", "1000",
            "--buffer-size", "100000", "--save-buffer", "--checkpoint-every", "1000000",
            "--log-dir", str(tmp_path), "--run-name", "run", "--no-progress"]
    log = tmp_path / "stderr.log"
    with log.open("wb") as stderr:
        # Its own process group (processtools), killed whole when the test ends.
        process = children.python("-m", "rl_graphstep.train", *args, cwd=ROOT, stdout=stderr,
                                  stderr=stderr)
        _wait_for(log, "updates:", process, 300)  # learning, the updates built
        time.sleep(10)
        caught = _catches(process.pid, signum)
        os.killpg(process.pid, signum)  # a terminal's Ctrl-C reaches the whole group
        process.wait(timeout=180)
    text = log.read_text(errors="replace")
    name = signal.Signals(signum).name
    assert caught, f"{name} had no handler when it was sent: {text}"
    assert process.returncode == 128 + signum, text
    assert f"stopped: {name} at step" in text and "Traceback" not in text, text
    assert load_checkpoint(tmp_path / "run")["global_step"] > 1000
    assert not (tmp_path / "run" / LOCK_FILE).exists()
