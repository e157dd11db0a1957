"""The training loop end to end on the CPU: several updates per iteration and the loop's
summary, and training with envs in subprocesses."""

from __future__ import annotations

from pathlib import Path

from rl_graphstep.checkpoint import load_checkpoint
from rl_graphstep.flags import load_config
from rl_graphstep.train import main, train

SHORT = ["--env", "Pendulum-v1", "--total-timesteps", "300", "--learning-starts", "100",
         "--batch-size", "32", "--hidden-sizes", "16", "--no-progress", "--device", "cpu"]


def test_updates_per_step_and_the_loop_summary(tmp_path: Path) -> None:
    summary = train(load_config([*SHORT, "--updates-per-step", "3", "--total-timesteps", "150",
                                 "--log-dir", str(tmp_path)]))
    agent = load_checkpoint(next(tmp_path.iterdir()))["agent"]
    assert agent["updates"] == 3 * 50  # 50 learning iterations, 3 updates each
    assert summary["learning_sps"] > 0 and summary["host_us_per_iteration"] > 0
    assert summary["compile"] is False and summary["graph"] is False


def test_async_envs_train(tmp_path: Path) -> None:
    assert main([*SHORT, "--num-envs", "2", "--vec-env", "async", "--log-dir", str(tmp_path)]) == 0
    state = load_checkpoint(next(tmp_path.iterdir()))
    assert state["config"]["vec_env"] == "async" and state["global_step"] == 300
    assert state["envs"] is None  # AsyncVectorEnv's subprocesses do not pickle; sync ones do
