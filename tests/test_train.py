"""The command line end to end: a short run's event file, and one clear line per bad input."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rl_graphstep.config import load_config
from rl_graphstep.train import main, train

TAGS = {
    "losses/critic", "losses/actor", "losses/alpha", "losses/critic_grad_norm",
    "losses/actor_grad_norm", "charts/alpha", "charts/episodic_return",
    "charts/episodic_length", "charts/SPS",
}
SHORT = ["--total-timesteps", "400", "--learning-starts", "150", "--batch-size", "32",
         "--hidden-sizes", "32", "32", "--log-interval", "100", "--no-progress", "--device", "cpu"]


def test_short_run_writes_every_tag(tmp_path: Path) -> None:
    assert main(["--env", "Pendulum-v1", "--log-dir", str(tmp_path), "--run-name", "short",
                 *SHORT]) == 0
    events = EventAccumulator(str(tmp_path / "short"))
    events.Reload()
    assert set(events.Tags()["scalars"]) >= TAGS
    assert [e.step for e in events.Scalars("charts/episodic_length")] == [200, 400]
    assert all(e.value == 200 for e in events.Scalars("charts/episodic_length"))
    critic_steps = [e.step for e in events.Scalars("losses/critic")]
    assert critic_steps == [200, 300, 400]  # learning starts after 150 steps
    assert "hyperparameters" in "".join(events.Tags()["tensors"])


def test_train_from_python_returns_a_summary(tmp_path: Path) -> None:
    cfg = load_config(["--env", "Pendulum-v1", "--log-dir", str(tmp_path), *SHORT])
    summary = train(cfg)
    assert summary["global_step"] == 400 and summary["episodes"] == 2
    assert summary["graph"] is False
    assert summary["mean_return_last_10"] < 0


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rl_graphstep.train", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--env", "Pendulm-v1"], "unknown environment 'Pendulm-v1'; did you mean Pendulum-v1?"),
        (["--env", "CartPole-v1"],
         "SAC needs a continuous action space; CartPole-v1 has Discrete(2)"),
        (["--config", "no/such/file.yaml"], "no/such/file.yaml"),
        (["--tau", "2"], "--tau must be in (0, 1], got 2.0"),
        (["--batch-size", "-1"], "--batch-size"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str, tmp_path: Path) -> None:
    result = run_cli(*args, "--log-dir", str(tmp_path), "--no-progress")
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_cuda_without_a_gpu_is_refused(tmp_path: Path) -> None:
    result = run_cli("--device", "cuda", "--log-dir", str(tmp_path))
    assert result.returncode == 2
    assert "--device cuda was asked for, but no CUDA GPU is available" in result.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_graph_on_without_a_gpu_is_refused(tmp_path: Path) -> None:
    result = run_cli("--graph", "on", "--log-dir", str(tmp_path))
    assert result.returncode == 2
    assert "--graph on needs a CUDA device" in result.stderr


def test_help_lists_the_flags() -> None:
    result = run_cli("--help")
    assert result.returncode == 0
    for flag in ("--env", "--config", "--seed", "--total-timesteps", "--device", "--graph",
                 "--run-name", "--batch-size"):
        assert flag in result.stdout


@pytest.mark.slow
def test_sac_learns_pendulum_on_cpu(tmp_path: Path) -> None:
    cfg = load_config(["--env", "Pendulum-v1", "--seed", "0", "--device", "cpu",
                       "--log-dir", str(tmp_path), "--no-progress"])
    assert cfg.total_timesteps == 15_000
    summary = train(cfg)
    assert summary["mean_return_last_10"] >= -300, summary
