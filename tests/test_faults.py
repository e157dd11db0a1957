"""Non-finite values and bad input: updates are skipped on the device, runs stop clearly."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import gymnasium as gym
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn

from rl_graphstep.checkpoint import latest_checkpoint, load_checkpoint
from rl_graphstep.config import load_config
from rl_graphstep.graphstep import EagerAdaptationStep, clip_grad_norm
from rl_graphstep.train import NonFiniteUpdates, main, train


class BadRewards(gym.Wrapper):
    """Pendulum whose reward is NaN (or huge) every `every`-th step from `after` on."""

    def __init__(self, env: gym.Env, value: float, every: int, after: int = 0) -> None:
        super().__init__(env)
        self.value, self.every, self.after, self.steps = value, every, after, 0

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.steps += 1
        if self.steps > self.after and self.steps % self.every == 0:
            reward = self.value
        return obs, reward, terminated, truncated, info


def register(name: str, **kwargs: float) -> str:
    env_id = f"{name}-v0"
    gym.register(env_id, entry_point=lambda **_: BadRewards(gym.make("Pendulum-v1"), **kwargs),
                 max_episode_steps=200)
    return env_id


SMALL = ["--device", "cpu", "--learning-starts", "200", "--batch-size", "32", "--hidden-sizes",
         "32", "32", "--buffer-size", "5000", "--log-interval", "100", "--no-progress"]


def test_a_nan_update_changes_nothing() -> None:
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
    reference = copy.deepcopy(module)
    step = EagerAdaptationStep.capture(
        module, torch.optim.Adam(module.parameters()), torch.zeros(8, 4), torch.zeros(8, 2),
        lambda p, t: ((p - t) ** 2).mean(), skip_nonfinite=True,
        gradient_transform=clip_grad_norm(module.parameters(), 1.0))
    ref_step = EagerAdaptationStep.capture(
        reference, torch.optim.Adam(reference.parameters()), torch.zeros(8, 4),
        torch.zeros(8, 2), lambda p, t: ((p - t) ** 2).mean(),
        gradient_transform=clip_grad_norm(reference.parameters(), 1.0))
    g = torch.Generator().manual_seed(1)
    good = [(torch.randn(8, 4, generator=g), torch.randn(8, 2, generator=g)) for _ in range(3)]
    poisoned = good[1][1].clone()
    poisoned[0, 0] = math.nan
    for inputs, targets in (good[0], (good[1][0], poisoned), good[1], good[2]):
        step(inputs, targets)
    for inputs, targets in good:
        ref_step(inputs, targets)
    assert step.guard is not None
    assert step.guard.skipped.item() == 1 and step.guard.consecutive.item() == 0
    for p, q in zip(module.parameters(), reference.parameters(), strict=True):
        assert torch.equal(p, q)  # as if the NaN batch had never come


def test_occasional_nan_rewards_are_skipped_and_counted(tmp_path: Path) -> None:
    env_id = register("OccasionalNaN", value=math.nan, every=97)
    summary = train(load_config([*SMALL, "--env", env_id, "--total-timesteps", "600",
                                 "--log-dir", str(tmp_path), "--run-name", "run"]))
    assert summary["global_step"] == 600
    state = load_checkpoint(tmp_path / "run")
    for tensor in state["agent"]["actor"].values():
        assert torch.isfinite(tensor).all()
    events = EventAccumulator(str(tmp_path / "run"))
    events.Reload()
    skipped = [e.value for e in events.Scalars("charts/skipped_updates")]
    assert skipped[-1] > 0 and skipped == sorted(skipped)


def test_a_run_of_nan_stops_clearly_and_keeps_its_checkpoint(tmp_path: Path) -> None:
    env_id = register("AlwaysNaN", value=math.nan, every=1, after=250)
    cfg = load_config([*SMALL, "--env", env_id, "--total-timesteps", "2000",
                       "--checkpoint-every", "200", "--nonfinite-limit", "100",
                       "--log-dir", str(tmp_path), "--run-name", "run"])
    with pytest.raises(NonFiniteUpdates, match="non-finite losses or gradients"):
        train(cfg)
    checkpoint = latest_checkpoint(tmp_path / "run")
    assert checkpoint is not None and load_checkpoint(checkpoint)["global_step"] <= 400
    for tensor in load_checkpoint(checkpoint)["agent"]["critic"].values():
        assert torch.isfinite(tensor).all()


def test_huge_rewards_do_not_break_the_parameters(tmp_path: Path) -> None:
    env_id = register("HugeReward", value=1e30, every=53)
    train(load_config([*SMALL, "--env", env_id, "--total-timesteps", "500",
                       "--log-dir", str(tmp_path), "--run-name", "run"]))
    state = load_checkpoint(tmp_path / "run")
    for part in ("actor", "critic"):
        for tensor in state["agent"][part].values():
            assert torch.isfinite(tensor).all()


def run_main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(list(args))
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--batch-size", "-1"], "--batch-size must be"),
        (["--tau", "2"], "--tau must be in (0, 1], got 2.0"),
        (["--resume", "no/such/run"], "run folder no/such/run does not exist"),
        (["--buffer-size", "100000000000"], "use a smaller --buffer-size"),
    ],
)
def test_bad_input_is_one_line(args: list[str], message: str,
                               capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, err = run_main(capsys, *args, "--log-dir", str(tmp_path), "--no-progress")
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1
    assert not any(tmp_path.iterdir())  # nothing written


def test_resume_from_another_algorithm_or_a_broken_file(capsys: pytest.CaptureFixture[str],
                                                        tmp_path: Path) -> None:
    train(load_config([*SMALL, "--env", "Pendulum-v1", "--total-timesteps", "300",
                       "--log-dir", str(tmp_path), "--run-name", "run"]))
    checkpoint = latest_checkpoint(tmp_path / "run")
    before = checkpoint.read_bytes()
    code, err = run_main(capsys, "--resume", str(tmp_path / "run"), "--algo", "td3")
    assert code == 2 and "is of sac on Pendulum-v1, not td3 on Pendulum-v1" in err
    checkpoint.write_bytes(before[: len(before) // 2])
    code, err = run_main(capsys, "--resume", str(tmp_path / "run"))
    assert code == 2 and str(checkpoint) in err and len(err.strip().splitlines()) == 1
    assert checkpoint.read_bytes() == before[: len(before) // 2]  # nothing overwritten
