"""Non-finite values and bad input: updates are skipped on the device, runs stop clearly."""

from __future__ import annotations

import copy
import math
import re
import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from fakes import POISONED, register_poisoned
from processtools import run_python
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn

from rl_graphstep.core.errors import NonFiniteUpdates
from rl_graphstep.core.guards import clip_grad_norm
from rl_graphstep.data.buffer import ReplayBuffer
from rl_graphstep.evaluate import evaluate
from rl_graphstep.graphstep import EagerAdaptationStep
from rl_graphstep.run.checkpoint import latest_checkpoint, load_checkpoint
from rl_graphstep.run.cli import suggested_command
from rl_graphstep.run.flags import load_config
from rl_graphstep.run.nonfinite import NonFiniteTally
from rl_graphstep.train import main, train


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


def stored_rows(run: Path) -> torch.Tensor:
    """The replay buffer's filled rows, as the run's last checkpoint (--save-buffer) has it."""
    return load_checkpoint(run)["buffer"]["storage"]


def test_nan_rewards_are_dropped_counted_and_warned_about_once(tmp_path: Path) -> None:
    env_id = register_poisoned("EveryFiftyNaN", "reward", math.nan, every=50)
    cfg = load_config([*SMALL, "--env", env_id, "--total-timesteps", "600", "--save-buffer",
                       "--log-dir", str(tmp_path), "--run-name", "run"])
    with pytest.warns(UserWarning) as caught:
        summary = train(cfg)
    about = [str(w.message) for w in caught if "non-finite" in str(w.message)]
    assert about == [f"{env_id} returned a non-finite reward (env 0, step 50); transitions "
                     "with NaN or inf are not stored but counted in "
                     "charts/nonfinite_transitions (warned once per run)"]
    rows = stored_rows(tmp_path / "run")
    assert rows.shape[0] == 600 - 12 and torch.isfinite(rows).all()  # steps 50, 100, ..., 600
    assert summary["skipped_transitions"] == 12
    # Each 200-step episode had NaN rewards: none counts as a return, none reads as nan.
    assert summary["episodes"] == 3 and summary["nonfinite_episodes"] == 3
    assert summary["mean_return_last_10"] is None
    # 400 updates from step 200 on, each a critic step, and SAC's two actor steps every
    # other update: none skipped.
    assert summary["updates"] == {"critic": (0, 400), "actor": (0, 400)}
    assert summary["mostly_skipped"] is False
    events = EventAccumulator(str(tmp_path / "run"))
    events.Reload()
    dropped = [(e.step, e.value) for e in events.Scalars("charts/nonfinite_transitions")]
    assert dropped == [(100 * i, 2 * i) for i in range(1, 7)]
    assert [e.value for e in events.Scalars("charts/skipped_updates")] == [0.0] * 6


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_inf_observations_never_reach_the_policy_or_the_buffer(tmp_path: Path,
                                                               device: str) -> None:
    """On CUDA through the captured action pipe on its own stream (the defaults there)."""
    env_id = register_poisoned(f"SometimesInf{device}", "observation", math.inf, every=37)
    cfg = load_config([*SMALL, "--device", device, "--env", env_id, "--total-timesteps", "600",
                       "--save-buffer", "--log-dir", str(tmp_path), "--run-name", "run"])
    with pytest.warns(UserWarning, match=f"{env_id} returned a non-finite next observation "
                                         r"\(env 0, step 37\)"):
        summary = train(cfg)
    assert POISONED[-1].nonfinite_actions == 0  # each inf observation got a random action
    rows = stored_rows(tmp_path / "run")
    # 16 inf observations (steps 37 ... 592), none at an episode's end: each drops the
    # transition it ends and the one it starts.
    assert summary["skipped_transitions"] == 32
    assert rows.shape[0] == 600 - 32 and torch.isfinite(rows).all()
    assert summary["updates"] == {"critic": (0, 400), "actor": (0, 400)}
    assert summary["nonfinite_episodes"] == 0
    assert math.isfinite(summary["mean_return_last_10"])


def test_several_envs_store_only_full_batches_of_finite_rows() -> None:
    buffer = ReplayBuffer(16, 1, 1, "cpu")
    tally = NonFiniteTally("Some-v0")

    def step(*rewards: float) -> None:
        n = len(rewards)
        obs = np.arange(n, dtype=np.float32)[:, None]
        tally.store(buffer, 0, obs, np.zeros((n, 1)), np.array(rewards), obs + 1,
                    np.zeros(n, dtype=bool))

    with pytest.warns(UserWarning, match="Some-v0 returned a non-finite reward .env 1"):
        step(1.0, math.nan)
    assert len(buffer) == 0 and tally.transitions == 1  # one finite row held back
    step(2.0, 3.0)  # two more: the held row and the first go in, the second is held
    assert len(buffer) == 2 and buffer.storage[:2, 2].tolist() == [1.0, 2.0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once per run
        step(math.inf, math.nan)
    step(4.0, 5.0)
    assert len(buffer) == 4 and buffer.storage[:4, 2].tolist() == [1.0, 2.0, 3.0, 4.0]
    assert tally.transitions == 3 and torch.isfinite(buffer.storage).all()


HUGE = 1e30  # finite, so stored; its square overflows float32: the losses are inf


def test_a_run_of_nonfinite_updates_stops_with_a_checkpoint_that_resumes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env_id = register_poisoned("AlwaysHuge", "reward", HUGE, every=1)
    run = tmp_path / "run"
    cfg = load_config([*SMALL, "--env", env_id, "--total-timesteps", "2000",
                       "--checkpoint-every", "1000", "--nonfinite-limit", "100",
                       "--save-buffer", "--log-dir", str(tmp_path), "--run-name", "run"])
    with pytest.raises(NonFiniteUpdates) as stopped:
        train(cfg)
    checkpoint = latest_checkpoint(run)
    assert checkpoint is not None
    state = load_checkpoint(checkpoint)
    step = state["global_step"]
    assert str(stopped.value) == (
        f"at least --nonfinite-limit 100 consecutive updates had non-finite losses or "
        f"gradients (100 by step {step}, when it was "
        f"checked); checkpoint {checkpoint} holds the parameters of the last finite update; "
        f"check the rewards and observations the environment returns, or lower the learning "
        "rates; then continue with: "
        + suggested_command("train", "--resume", str(run)))
    assert step == 300  # the first log interval with 100 updates, not the step-0 checkpoint
    for part in ("actor", "critic"):
        for tensor in state["agent"][part].values():
            assert torch.isfinite(tensor).all()
    evaluated = evaluate(run, episodes=1, device="cpu", verbose=False)
    assert math.isfinite(evaluated.mean)
    capsys.readouterr()
    code = main(["--resume", str(run), "--total-timesteps", "400", "--nonfinite-limit",
                 "100000"])
    out, err = capsys.readouterr()
    # Resumed and finished; every critic update of the run was skipped (counted across the
    # resume), the actor's were not: its loss reads the critic, whose parameters stay finite.
    done = out.splitlines()[-1]
    assert code == 3 and done.startswith("done: 400 steps, ")
    assert ("skipped 0 non-finite transitions, 200 of 200 critic updates and 0 of 200 actor "
            f"updates; logs in {run}") in done
    assert err.strip().splitlines() == [
        "error: most updates were skipped for non-finite losses or gradients (200 of 200 "
        "critic updates and 0 of 200 actor updates), so the agent did not learn; check the "
        "rewards and observations the environment returns, or lower the learning rates; "
        f"logs and checkpoint kept in {run}"]
    assert load_checkpoint(latest_checkpoint(run))["global_step"] == 400


def test_a_finished_run_that_skipped_most_updates_exits_3(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env_id = register_poisoned("OftenHuge", "reward", HUGE, every=4)
    code = main([*SMALL, "--env", env_id, "--total-timesteps", "400", "--log-dir",
                 str(tmp_path), "--run-name", "run"])
    out, err = capsys.readouterr()
    skipped = int(re.search(r"(\d+) of 200 critic updates and 0 of 200 actor", out).group(1))
    assert code == 3 and 100 < skipped <= 200
    assert len(err.strip().splitlines()) == 1
    assert err.startswith(f"error: most updates were skipped for non-finite losses or "
                          f"gradients ({skipped} of 200 critic updates")
    assert latest_checkpoint(tmp_path / "run") is not None


def test_a_clean_run_ends_with_its_counts_and_exit_0(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env_id = register_poisoned("EveryFiftyNaNAgain", "reward", math.nan, every=50)
    with pytest.warns(UserWarning, match="non-finite reward"):
        code = main([*SMALL, "--env", env_id, "--total-timesteps", "300", "--log-dir",
                     str(tmp_path), "--run-name", "run"])
    out, err = capsys.readouterr()
    assert code == 0 and err == ""
    assert re.fullmatch(
        r"done: 300 steps, 1 episodes, mean return of the last 10: n/a, [\d,]+ steps/s "
        r"\(learning phase [\d,]+ steps/s; updates built in \d+\.\d s\); "
        r"skipped 6 non-finite transitions, 0 of 100 critic updates and 0 of 100 actor "
        rf"updates; logs in {tmp_path}/run", out.splitlines()[-1])


# An environment module a training process imports by its --env nanenv:NaNReward-v0.
NAN_ENV = """
import gymnasium as gym


class NaNReward(gym.Wrapper):
    def step(self, action):
        observation, _, terminated, truncated, info = self.env.step(action)
        return observation, float("nan"), terminated, truncated, info


gym.register("NaNReward-v0", entry_point=lambda **_: NaNReward(gym.make("Pendulum-v1")),
             max_episode_steps=200)
"""


def test_a_run_that_made_no_update_exits_3(tmp_path: Path) -> None:
    """Every reward NaN: no transition is stored, so no update can be made. It used to end
    with ``0 of 0 critic updates``, an untrained checkpoint and exit 0."""
    (tmp_path / "nanenv.py").write_text(NAN_ENV)
    run = tmp_path / "runs" / "run"
    result = run_python("-m", "rl_graphstep.train", *SMALL, "--env", "nanenv:NaNReward-v0",
                        "--total-timesteps", "300", "--log-dir", "runs", "--run-name", "run",
                        cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 3, result.stderr
    assert result.stdout.splitlines()[-1].endswith(
        "; skipped 300 non-finite transitions, 0 of 0 critic updates and 0 of 0 actor "
        "updates; logs in runs/run")
    assert result.stderr.splitlines()[-1] == (
        "error: no update was made: the replay buffer never held a batch of --batch-size 32 "
        "transitions (it holds 0; 300 of 300 transitions had non-finite values and were not "
        "stored), so the agent did not learn; check the rewards and observations the "
        "environment returns; logs and checkpoint kept in runs/run")
    assert latest_checkpoint(run) is not None
    # Its evaluation gives NaN means: printed, and said to be no score (it was exit 0).
    evaluated = run_python("-m", "rl_graphstep.evaluate", "runs/run", "--episodes", "2",
                           "--device", "cpu", cwd=tmp_path, capture_output=True, text=True)
    assert evaluated.returncode == 3, evaluated.stderr
    assert "mean return nan" in evaluated.stdout
    assert evaluated.stderr.splitlines()[-1] + "\n" == (  # after gymnasium's own warning
        "error: 2 of 2 episodes returned a non-finite return (the environment's rewards were "
        "NaN or infinite), so the mean above is no score; check the rewards the environment "
        "returns\n")


def test_a_group_whose_observations_are_all_nan_says_so_for_each_seed(tmp_path: Path) -> None:
    env_id = register_poisoned("AllNaNObservations", "observation", math.nan, every=1)
    cfg = load_config([*SMALL, "--env", env_id, "--num-seeds", "2", "--total-timesteps", "250",
                       "--log-dir", str(tmp_path), "--run-name", "run"])
    with pytest.warns(UserWarning, match=r"non-finite next observation \(seed 1, env 0, step 1\)"):
        summary = train(cfg)
    assert summary["updates"] == {"critic": (0, 0), "actor": (0, 0)}
    assert summary["not_learned"] == (
        "no update was made: the replay buffer never held a batch of --batch-size 32 "
        "transitions (it holds 0; seed 1: 250 of 250, seed 2: 250 of 250 transitions had "
        "non-finite values and were not stored), so the agent did not learn; check the "
        f"rewards and observations the environment returns; logs and checkpoint kept in "
        f"{tmp_path / 'run'}")


def test_a_run_that_dropped_most_transitions_exits_3(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The first 100 rewards finite, every later one NaN: updates from step 200 learn from
    those 100 alone."""
    env_id = register("NaNAfterAHundred", value=math.nan, every=1, after=100)
    with pytest.warns(UserWarning, match="non-finite reward"):
        code = main([*SMALL, "--env", env_id, "--total-timesteps", "300", "--log-dir",
                     str(tmp_path), "--run-name", "run"])
    out, err = capsys.readouterr()
    assert code == 3
    assert "skipped 200 non-finite transitions, 0 of 100 critic updates" in out
    assert err.splitlines() == [
        "error: most transitions had non-finite values and were not stored (200 of 300 "
        "transitions), so the agent learned from few of its steps; check the rewards and "
        f"observations the environment returns; logs and checkpoint kept in {tmp_path}/run"]


def test_a_resumed_run_with_nothing_left_to_train_says_so_and_exits_0(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Asked for no step (already at its --total-timesteps), a run is not judged: even one
    that made no update."""
    env_id = register_poisoned("AllNaNRewards", "reward", math.nan, every=1)
    with pytest.warns(UserWarning, match="non-finite reward"):
        assert main([*SMALL, "--env", env_id, "--total-timesteps", "250", "--log-dir",
                     str(tmp_path), "--run-name", "run"]) == 3
    capsys.readouterr()
    assert main(["--resume", str(tmp_path / "run"), "--total-timesteps", "250"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert ("; nothing to train: the run was at step 250 already (--total-timesteps 250); "
            "skipped 250 non-finite transitions, 0 of 0 critic updates") in out.splitlines()[-1]


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
    assert code == 2 and "--algo td3 does not match: the resumed run is sac on Pendulum-v1" in err
    checkpoint.write_bytes(before[: len(before) // 2])
    code, err = run_main(capsys, "--resume", str(tmp_path / "run"))
    assert code == 2 and str(checkpoint) in err and len(err.strip().splitlines()) == 1
    assert checkpoint.read_bytes() == before[: len(before) // 2]  # nothing overwritten
