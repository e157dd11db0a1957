"""benchmarks/ppo_speed.py: our arm's row from a short CPU run, LeanRL's speed and error lines
read from its output, a failing or hanging arm reported as failed (its processes ended), and
LeanRL's own script on the CPU where tensordict and tyro are installed (speed means nothing
here)."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from processtools import Children, running
from torch.utils.tensorboard import SummaryWriter

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import ppo_speed  # noqa: E402

TINY = ["--device", "cpu", "--env", "Pendulum-v1", "--num-steps", "32", "--num-minibatches",
        "2", "--update-epochs", "1", "--rollouts", "10", "--burn-in", "2"]

# What LeanRL's tqdm bar leaves on stderr: refreshes joined by carriage returns, the speed in
# the description from the 10th iteration on.
TQDM_SAMPLE = (
    "  0%|          | 0/20 [00:00<?, ?it/s]\r 45%|####5     | 9/20 [00:05<00:06,  1.7it/s]"
    "\rspeed:  1774.3 sps, reward avg: -0.02, reward max: 0.04, returns:  nan,lr:  0.00:  50%"
    "|#####     | 10/20 [00:06<00:06,  1.6it/s]\rspeed:  1802.9 sps, reward avg: 0.11, reward"
    " max: 0.93, returns: -310.20,lr:  0.00: 100%|##########| 20/20 [00:11<00:00,  1.7it/s]\n")

TRACEBACK = textwrap.dedent("""\
    Traceback (most recent call last):
      File "leanrl/ppo_continuous_action_torchcompile.py", line 355, in <module>
        container = gae(next_obs, next_done, container)
    torch._dynamo.exc.InternalTorchDynamoError: AttributeError: 'NoneType' has no attribute 'f'

    from user code:
       File "leanrl/ppo_continuous_action_torchcompile.py", line 150, in gae

    Set TORCHDYNAMO_VERBOSE=1 for the internal stack trace (please do this especially if
    you're reporting a bug to PyTorch). For even more developer context, set TORCH_LOGS="+dynamo"
    """)

# A stand-in for LeanRL's script: it imports the shimmed wandb and calls gymnasium 1.x's
# TransformObservation as LeanRL does (without observation_space); --compile fails as a Dynamo
# error would, --cudagraphs hangs with a child of its own, and plain prints a speed.
FAKE_LEANRL = textwrap.dedent("""\
    import os, subprocess, sys, time
    import gymnasium as gym
    import wandb
    wandb.init(project="x")
    env = gym.wrappers.TransformObservation(gym.make("Pendulum-v1"), lambda obs: obs)
    if "--compile" in sys.argv:
        raise RuntimeError("Dynamo failed inside gae")
    if "--cudagraphs" in sys.argv:
        child = subprocess.Popen(["sleep", "300"])
        with open(os.environ["FAKE_PIDS"], "w") as pids:
            pids.write(f"{os.getpid()} {child.pid}")
        time.sleep(300)
    wandb.log({"speed": 1234.5}, step=100)
    print("\\rspeed:  1000.0 sps, lr: 0.00\\rspeed:  1234.5 sps, lr: 0.00", file=sys.stderr)
    """)


def rows(out: str) -> dict[str, list[str]]:
    """The table's rows by arm name, as cells."""
    return {line.split(" | ")[0][2:]: [cell.strip(" |") for cell in line.split(" | ")]
            for line in out.splitlines() if line.startswith(("| ours", "| LeanRL"))}


def fake_checkout(tmp_path: Path) -> Path:
    script = tmp_path / "LeanRL" / ppo_speed.SCRIPT
    script.parent.mkdir(parents=True)
    script.write_text(FAKE_LEANRL)
    return tmp_path / "LeanRL"


def test_leanrl_speed_is_the_last_one_its_bar_printed() -> None:
    assert ppo_speed.leanrl_speed(TQDM_SAMPLE) == 1802.9
    assert ppo_speed.leanrl_speed("  0%|          | 0/20 [00:00<?, ?it/s]\r") is None


def test_error_line_is_the_exception_not_the_advice_after_it() -> None:
    assert ppo_speed.error_line(TRACEBACK) == ("torch._dynamo.exc.InternalTorchDynamoError: "
                                               "AttributeError: 'NoneType' has no attribute 'f'")
    assert ppo_speed.error_line("\r 10%|#\rKilled\n\n") == "Killed"
    assert ppo_speed.error_line("") == "no output"


def test_our_rate_is_steps_over_wall_time_after_the_burn_in(tmp_path: Path) -> None:
    writer = SummaryWriter(str(tmp_path / "runs" / "run"))
    writer.add_scalar("losses/value_loss", 1.0, 64, walltime=1.0)
    for step, wall in [(64, 10.0), (128, 11.0), (192, 13.0), (256, 14.0)]:
        writer.add_scalar("charts/SPS", 1.0, step, walltime=wall)
    writer.close()
    # After 2 rollouts: steps 128 -> 256 in 11 s -> 14 s.
    assert ppo_speed.rollout_rate(tmp_path / "runs", 2) == pytest.approx(128 / 3)
    assert ppo_speed.rollout_rate(tmp_path / "runs", 1) == pytest.approx(192 / 4)
    assert ppo_speed.rollout_rate(tmp_path / "runs", 4) is None


def test_our_arms_give_rows_with_positive_rates(capsys: pytest.CaptureFixture[str]) -> None:
    code = ppo_speed.main([*TINY, "--many-envs", "2", "--many-steps", "16"])
    out = capsys.readouterr().out
    assert code == 0, out
    table = rows(out)
    assert table["ours, 1 env"][2] == "1 x 32" and table["ours, 2 envs"][2] == "2 x 16"
    assert table["ours, 1 env"][1].startswith("eager")
    for row in table.values():
        assert float(row[3].replace(",", "")) > 0
    assert "over rollouts 3-10" in out


def test_a_failing_leanrl_mode_is_a_row_and_the_job_goes_on(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = ppo_speed.main([*TINY, "--many-envs", "0", "--leanrl", str(fake_checkout(tmp_path)),
                           "--leanrl-modes", "compile", "plain"])
    out = capsys.readouterr().out
    assert code == 1, out
    table = rows(out)
    assert table["LeanRL compile"][3] == "failed: RuntimeError: Dynamo failed inside gae"
    assert table["LeanRL plain"][1:4] == ["eager", "1 x 32", "1,234"]
    assert table["LeanRL compile"][1] == "--compile"
    assert "vs LeanRL plain" in out
    ours = float(table["ours, 1 env"][3].replace(",", ""))
    assert table["ours, 1 env"][4] == f"{ours / 1234.5:.2f}x"
    assert table["LeanRL plain"][4] == "1.00x"


def test_an_arm_past_its_timeout_is_ended_with_its_children(tmp_path: Path) -> None:
    args = ppo_speed.parse([*TINY, "--leanrl", str(fake_checkout(tmp_path))])
    shims = ppo_speed.shim_folder(tmp_path)
    [arm] = ppo_speed.leanrl_arms(args.leanrl, ["cudagraphs"], args, shims)
    pids = tmp_path / "pids"
    env = dict(os.environ, PYTHONPATH=str(shims), FAKE_PIDS=str(pids))
    result = ppo_speed.run_arm(arm, env, 8, 2, tmp_path)
    assert result.rate is None and result.error == "timed out after 8 s"
    assert pids.exists(), "the fake script never started"
    assert [pid for pid in map(int, pids.read_text().split()) if running(pid)] == []


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_ends_the_arm_under_way_and_prints_the_table(
        signum: int, tmp_path: Path, children: Children) -> None:
    pids = tmp_path / "pids"
    harness = children.python(
        str(ROOT / "benchmarks" / "ppo_speed.py"), *TINY, "--many-envs", "0", "--leanrl",
        str(fake_checkout(tmp_path)), "--leanrl-modes", "cudagraphs", stdout=subprocess.PIPE,
        text=True, env=dict(os.environ, FAKE_PIDS=str(pids)))
    deadline = time.monotonic() + 120
    while not pids.exists() and harness.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert pids.exists(), "the hanging arm never started"
    harness.send_signal(signum)
    out, _ = harness.communicate(timeout=60)
    assert harness.returncode == 130, out
    assert "| ours, 1 env |" in out and "| LeanRL cudagraphs |" not in out
    assert [pid for pid in map(int, pids.read_text().split()) if running(pid)] == []


def test_rollouts_must_be_a_multiple_of_ten(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        ppo_speed.parse(["--rollouts", "15"])
    assert "--rollouts takes a multiple of 10" in capsys.readouterr().err


@pytest.mark.skipif(not all(importlib.util.find_spec(m) for m in ("tensordict", "tyro")),
                    reason="LeanRL's script needs tensordict and tyro, not installed here")
@pytest.mark.skipif(not os.environ.get("LEANRL_DIR"),
                    reason="set LEANRL_DIR to a LeanRL checkout to run its script")
def test_leanrl_plain_on_the_cpu_gives_a_rate(capsys: pytest.CaptureFixture[str]) -> None:
    code = ppo_speed.main([*TINY, "--many-envs", "0", "--leanrl", os.environ["LEANRL_DIR"],
                           "--leanrl-modes", "plain"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert float(rows(out)["LeanRL plain"][3].replace(",", "")) > 0
