"""The command line end to end: a short run's event file, and one clear line per bad input."""

from __future__ import annotations

import gc
import os
import platform
import subprocess
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from processtools import run_python
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rl_graphstep import train as train_module
from rl_graphstep.data.buffer import ReplayBuffer
from rl_graphstep.learners import OffPolicyLearner
from rl_graphstep.run import setup as runsetup
from rl_graphstep.run.acting import ActionPipe
from rl_graphstep.run.checkpoint import load_checkpoint
from rl_graphstep.run.console import summary_line
from rl_graphstep.run.flags import load_config
from rl_graphstep.train import main, train

TAGS = {
    "losses/critic", "losses/actor", "losses/alpha", "losses/critic_grad_norm",
    "losses/actor_grad_norm", "charts/alpha", "charts/episodic_return",
    "charts/episodic_length", "charts/SPS",
}
# The learning tests' networks: 64 wide, where a CPU thread updates them about 4x as fast
# as the shipped 256-wide ones (the slow tests must fit CI's budget).
NARROW = ["--hidden-sizes", "64", "64"]
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
    # What ran it: the tables of results that mix machines say which.
    machine = events.Tensors("machine/text_summary")[0].tensor_proto.string_val[0].decode()
    host = f"{os.cpu_count()} CPUs ({platform.machine()})"
    assert machine == f"CPU; {host}; torch {torch.__version__}"


def test_train_from_python_returns_a_summary_and_prints_the_commands_lines(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """train() ends with the command's ``done:`` line, printed once (the command prints
    the same lines: test_no_progress_prints_the_start_and_final_lines_only)."""
    cfg = load_config(["--env", "Pendulum-v1", "--log-dir", str(tmp_path), *SHORT])
    summary = train(cfg)
    assert summary["global_step"] == 400 and summary["episodes"] == 2
    assert summary["graph"] is False
    assert summary["mean_return_last_10"] < 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert len(lines) == 3 and err == ""  # --no-progress: the first lines and the last
    assert lines[0].startswith(f"{summary['run_dir']}: SAC on Pendulum-v1, cpu")
    assert lines[2] == summary_line(summary)
    assert lines[2].startswith("done: 400 steps, 2 episodes, mean return of the last 10: ")


def test_cpu_training_runs_on_one_thread_and_gives_the_count_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, torch_threads: None) -> None:
    seen = []
    monkeypatch.setattr(runsetup, "seed_everything",
                        lambda seed: seen.append(torch.get_num_threads()))
    summary = train(load_config(["--env", "Pendulum-v1", "--log-dir", str(tmp_path), *SHORT]))
    assert summary["global_step"] == 400
    assert seen == [1] and torch.get_num_threads() == 2

    def fail(seed: int) -> None:
        seen.append(torch.get_num_threads())
        raise RuntimeError("the loop failed")

    monkeypatch.setattr(runsetup, "seed_everything", fail)
    with pytest.raises(RuntimeError, match="the loop failed"):
        train(load_config(["--env", "Pendulum-v1", "--log-dir", str(tmp_path), *SHORT]))
    assert seen == [1, 1] and torch.get_num_threads() == 2


def test_tf32_holds_for_the_run_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []
    monkeypatch.setattr(runsetup, "seed_everything",
                        lambda seed: seen.append(torch.get_float32_matmul_precision()))
    torch.set_float32_matmul_precision("medium")
    try:
        for tf32 in ("--tf32", "--no-tf32"):
            train(load_config(["--env", "Pendulum-v1", "--log-dir", str(tmp_path), *SHORT,
                               tf32, "--run-name", tf32.strip("-")]))
            assert torch.get_float32_matmul_precision() == "medium"
    finally:
        torch.set_float32_matmul_precision("highest")
    assert seen == ["high", "highest"]


def test_the_heap_is_frozen_during_the_loop_only(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Objects that exist once the steps are built are kept out of the garbage collector's
    passes while the loop runs (a full pass over compiled code costs milliseconds)."""
    frozen = []
    log = train_module._log
    monkeypatch.setattr(train_module, "_log", lambda *args: (
        frozen.append(gc.get_freeze_count()), log(*args))[1])
    train(load_config(["--env", "Pendulum-v1", "--log-dir", str(tmp_path), *SHORT]))
    # Logged at steps 100 (before learning starts at 150: nothing built yet), 200, 300, 400.
    assert frozen[0] == 0 and len(frozen) == 4 and min(frozen[1:]) > 1000
    assert gc.get_freeze_count() == 0


ROOT = Path(__file__).resolve().parent.parent


def run_cli(*args: str) -> subprocess.CompletedProcess:
    """The command line as a user runs it, from the repository root."""
    return run_python("-m", "rl_graphstep.train", *args, cwd=ROOT, capture_output=True,
                      text=True, timeout=300)


def test_the_last_transition_is_written_while_the_next_action_is_computed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each step: the action requested, the last step's transition added, the updates
    launched, then the wait for the action; and a checkpoint holds every transition."""
    calls: list[str] = []

    def recording(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def record(*args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            return original(*args, **kwargs)
        return record

    for cls, name in ((ActionPipe, "request"), (ActionPipe, "wait"), (ReplayBuffer, "add"),
                      (OffPolicyLearner, "update")):
        monkeypatch.setattr(cls, name, recording(name, getattr(cls, name)))
    summary = train(load_config(["--env", "Pendulum-v1", "--log-dir", str(tmp_path),
                                 "--run-name", "order", *SHORT, "--save-buffer"]))
    assert summary["global_step"] == 400
    first = calls.index("request")  # learning starts at step 150
    assert calls[:first] == ["add"] * 150  # steps 0-148, and 149 before the steps are built
    assert calls[first:] == ["request", "update", "wait"] + [
        "request", "add", "update", "wait"] * 249 + ["add"]  # the last, before saving
    assert load_checkpoint(tmp_path / "order")["buffer"]["size"] == 400


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--env", "Pendulm-v1"], "unknown environment 'Pendulm-v1'; did you mean Pendulum-v1?"),
        (["--env", "CartPole-v1"],
         "SAC needs a continuous action space; CartPole-v1 has Discrete(2) (--algo ppo takes "
         "discrete actions)"),
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


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--algo", "td3", "--actor", "examples.residual_actor:ResidualActor"],
         "ResidualActor.forward returned a tuple, expected a tensor action"),
        (["--critic", "examples/no_such_file.py:Critic"], "does not exist"),
        (["--actor", "examples.residual_actor"], "must be package.module:ClassName"),
    ],
)
def test_bad_custom_networks_are_one_line(args: list[str], message: str, tmp_path: Path) -> None:
    result = run_cli(*args, *SHORT, "--log-dir", str(tmp_path))
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "args",
    [
        ["--actor", "examples.residual_actor:ResidualActor", "--actor-kwargs",
         "{width: 32, blocks: 2}", "--critic", "examples/layernorm_critic.py:LayerNormCritic"],
        ["--algo", "td3", "--critic", "examples/layernorm_critic.py:LayerNormCritic",
         "--critic-kwargs", "{hidden_sizes: [32, 32]}"],
    ],
    ids=["sac-residual-actor-layernorm-critic", "td3-layernorm-critic"],
)
def test_examples_train_through_the_cli(args: list[str], tmp_path: Path) -> None:
    result = run_cli(*args, *SHORT, "--log-dir", str(tmp_path), "--run-name", "custom")
    assert result.returncode == 0, result.stderr
    assert "done: 400 steps, 2 episodes" in result.stdout
    events = EventAccumulator(str(tmp_path / "custom"))
    events.Reload()
    assert len(events.Scalars("losses/actor")) == 3


def test_custom_networks_from_python(tmp_path: Path) -> None:
    import gymnasium as gym

    from examples.layernorm_critic import LayerNormCritic
    from examples.residual_actor import ResidualActor

    env = gym.make("Pendulum-v1")
    critic = LayerNormCritic(env.observation_space, env.action_space, hidden_sizes=(16, 16))
    cfg = load_config(["--env", "Pendulum-v1", "--log-dir", str(tmp_path), *SHORT])
    summary = train(cfg, actor=ResidualActor, critic=critic)
    assert summary["global_step"] == 400
    assert critic.members[0][0].weight.grad is not None  # the given module itself was trained


@pytest.mark.slow
@pytest.mark.parametrize(("algo", "steps"), [("sac", 15_000), ("td3", 15_000),
                                             ("ddpg", 20_000)])
def test_learns_pendulum_on_cpu(algo: str, steps: int, tmp_path: Path) -> None:
    """The shipped Pendulum settings with NARROW networks: SAC -127, TD3 -131, DDPG -206
    (seed 0) in 136, 80 and 112 s on a 2-CPU machine, where the 256-wide ones took 459, 345
    and 286 s."""
    cfg = load_config(["--env", "Pendulum-v1", "--algo", algo, "--seed", "0", "--device",
                       "cpu", *NARROW, "--log-dir", str(tmp_path), "--no-progress"])
    assert cfg.total_timesteps == steps
    summary = train(cfg)
    assert summary["mean_return_last_10"] >= -300, summary


@pytest.mark.slow
def test_a_seed_group_learns_pendulum_in_every_seed_on_cpu(tmp_path: Path) -> None:
    """Three TD3 seeds in one process, the shipped config's 15,000 steps each, with 64-64
    networks: on the CPU the eager batched update of three 256-256 seeds took 857 s, of three
    64-64 ones 207 s (every seed learned with both)."""
    cfg = load_config(["--env", "Pendulum-v1", "--algo", "td3", "--seed", "0",
                       "--num-seeds", "3", *NARROW, "--device", "cpu",
                       "--log-dir", str(tmp_path), "--no-progress"])
    summary = train(cfg)
    means = [sum(r) / len(r) for r in summary["recent_returns"]]
    assert len(means) == 3 and min(means) >= -300, means


@pytest.mark.slow
def test_the_many_env_regime_learns_pendulum_on_cpu(tmp_path: Path) -> None:
    """Four envs, batches of 512, two updates per vector step, 3-step returns and normalised
    observations, NARROW networks: 5,000 updates in 12,000 steps (-150.2 on a 2-CPU machine
    in 54 s)."""
    cfg = load_config(["--env", "Pendulum-v1", "--seed", "0", "--num-envs", "4",
                       "--batch-size", "512", "--updates-per-step", "2", "--n-step", "3",
                       "--obs-norm", "--total-timesteps", "12000", "--learning-starts", "2000",
                       *NARROW, "--device", "cpu", "--log-dir", str(tmp_path), "--no-progress"])
    summary = train(cfg)
    assert summary["mean_return_last_10"] >= -300, summary


def test_the_shipped_parallel_config_trains(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """configs/sac_mujoco_parallel.yaml, by name, on Pendulum for 100 vector steps of its 32
    envs: 4 updates of batch 2,048 per vector step once 2,048 steps are stored (36 vector
    steps, 144 updates), through its shared env workers; TF32 stays off on the CPU."""
    summary = train(load_config([
        "--config", "sac_mujoco_parallel", "--env", "Pendulum-v1", "--total-timesteps", "3200",
        "--learning-starts", "2048", "--buffer-size", "4096", "--device", "cpu",
        "--log-dir", str(tmp_path), "--no-progress"]))
    assert (summary["global_step"], summary["vec_env"]) == (3200, "shared")
    assert summary["updates"] == {"critic": (0, 144), "actor": (0, 144)}
    assert "shared envs, float32 matmuls;" in capsys.readouterr().out


def test_runs_named_in_the_same_second_get_a_folder_each(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two runs started in one second of the clock (the default name's resolution) keep
    their own logs and checkpoints."""
    from rl_graphstep.run import rundir

    monkeypatch.setattr(rundir.time, "time", lambda: 1796014201.5)
    args = ["--env", "Pendulum-v1", "--log-dir", str(tmp_path), *SHORT]
    first = train(load_config([*args, "--seed", "1"]))
    second = train(load_config([*args, "--seed", "1", "--total-timesteps", "300"]))
    name = "Pendulum-v1__sac__1__" + time.strftime("%Y-%m-%d_%H-%M-%S",
                                                    time.localtime(1796014201.5))
    assert [Path(first["run_dir"]).name, Path(second["run_dir"]).name] == [name, f"{name}_2"]
    assert load_checkpoint(tmp_path / name)["global_step"] == 400
    assert load_checkpoint(tmp_path / f"{name}_2")["global_step"] == 300
    assert all(len(list((tmp_path / n).glob("events.out.tfevents.*"))) == 1
               for n in (name, f"{name}_2"))


def test_the_action_stream_without_cuda_graphs_acts_in_line(tmp_path: Path) -> None:
    """Eager, every --action-stream acts in line and learns alike; only an explicit on warns."""
    summaries = {}
    for value in ("on", "off", "auto"):
        cfg = load_config(["--env", "Pendulum-v1", "--log-dir", str(tmp_path), "--run-name",
                           value, *SHORT, "--action-stream", value])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            summaries[value] = train(cfg)
        said = [str(w.message) for w in caught if "--action-stream" in str(w.message)]
        assert said == (["--action-stream: acting on the updates' stream instead (it needs "
                         "CUDA graphs)"] if value == "on" else [])
        assert summaries[value]["action_stream"] is False
    assert len({s["mean_return_last_10"] for s in summaries.values()}) == 1


# Shorter still, for tests of what a run prints: one 200-step episode, learning from step 80.
TINY = [*SHORT, "--total-timesteps", "200", "--learning-starts", "80", "--batch-size", "16",
        "--hidden-sizes", "8", "8", "--log-interval", "50"]


def test_without_a_terminal_the_run_prints_progress_lines(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Captured output is no terminal: no bar (no carriage returns), a line per log step
    here (the period set to 0 s), each with the step count; then the final line."""
    from rl_graphstep.run import console

    monkeypatch.setattr(console, "LINE_SECONDS", 0.0)
    progress = [a for a in TINY if a != "--no-progress"]
    assert main(["--env", "Pendulum-v1", "--log-dir", str(tmp_path), "--run-name", "lines",
                 *progress]) == 0
    out, err = capsys.readouterr()
    assert "\r" not in err and "%|" not in err
    lines = [line for line in out.splitlines() if line.startswith("step ")]
    assert [line.split(" | ")[0] for line in lines] == [
        "step 50/200 (25%)", "step 100/200 (50%)", "step 150/200 (75%)", "step 200/200 (100%)"]
    assert lines[0].endswith(" | learning not started")  # learning starts at step 80
    assert all(" steps/s | " in line and " | eta " in line for line in lines[1:])
    assert " | return " in lines[-1]  # the first episode ended at step 200
    assert out.splitlines()[-1].startswith("done: 200 steps, 1 episodes")


def test_no_progress_prints_the_start_and_final_lines_only(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """And the final line gives the learning phase's rate beside the whole run's."""
    import re

    assert main(["--env", "Pendulum-v1", "--log-dir", str(tmp_path), "--run-name", "quiet",
                 *TINY]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert len(lines) == 3 and err == ""
    assert lines[0].startswith(f"{tmp_path / 'quiet'}: SAC on Pendulum-v1, cpu")
    assert lines[1].startswith("updates: eager, actions in line, sync envs, float32 matmuls; "
                               "built in ")
    assert re.fullmatch(r"done: 200 steps, 1 episodes, mean return of the last 10: -\d+\.\d, "
                        r"[\d,]+ steps/s \(learning phase [\d,]+ steps/s; updates built in "
                        r"\d+\.\d s\); skipped 0 non-finite transitions, 0 of 120 critic "
                        r"updates and 0 of 120 actor updates; "
                        rf"logs in {re.escape(str(tmp_path / 'quiet'))}",
                        lines[2]), lines[2]

@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--total-timesteps", "400", "--learning-starts", "400"],
         "error: --learning-starts 400 is not below --total-timesteps 400: the run would end "
         "before its first update; lower --learning-starts or raise --total-timesteps\n"),
        (["--batch-size", "64", "--buffer-size", "32"],
         "error: --batch-size 64 is above --buffer-size 32: the replay buffer could never hold "
         "one batch, so no update would run; lower --batch-size or raise --buffer-size\n"),
    ],
)
def test_a_run_that_could_never_update_exits_2(args: list[str], line: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Once these ran to exit 0 after zero updates and saved untrained networks."""
    assert main(["--env", "Pendulum-v1", "--log-dir", str(tmp_path), "--run-name", "never",
                 *SHORT, *args]) == 2
    assert capsys.readouterr().err == line
    assert list(tmp_path.iterdir()) == []


def test_the_shortest_run_allowed_makes_its_update(tmp_path: Path) -> None:
    """One step past --learning-starts, with exactly one batch stored: the refusals above are
    not stricter than the loop."""
    summary = train(load_config(["--env", "Pendulum-v1", "--log-dir", str(tmp_path), *SHORT,
                                 "--run-name", "one", "--total-timesteps", "151",
                                 "--batch-size", "150", "--buffer-size", "150"]))
    assert summary["global_step"] == 151
    assert load_checkpoint(tmp_path / "one")["agent"]["updates"] == 1


def test_a_run_named_by_the_clock_is_owned_while_it_trains(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its folder is claimed atomically, and then locked like any other: a --resume of it
    during the run is refused."""
    from rl_graphstep.core.errors import RunFolderError
    from rl_graphstep.run.rundir import RunLock

    refused: list[str] = []
    log = train_module._log

    def log_and_try_to_own(run: Any) -> None:
        with pytest.raises(RunFolderError) as info, RunLock(run.run_dir):
            pass
        refused.append(str(info.value))
        log(run)

    monkeypatch.setattr(train_module, "_log", log_and_try_to_own)
    summary = train(load_config(["--env", "Pendulum-v1", "--log-dir", str(tmp_path), *SHORT]))
    run_dir = Path(summary["run_dir"])
    assert run_dir.name.startswith("Pendulum-v1__sac__1__")
    assert refused == [f"{run_dir} is in use by another training (pid {os.getpid()}); wait for "
                       "it to end or pick another --run-name"] * 4  # steps 100 to 400
    assert not (run_dir / ".lock").exists()


# The loop end to end: several updates per iteration, the summary, envs in subprocesses.

LOOP = ["--env", "Pendulum-v1", "--total-timesteps", "300", "--learning-starts", "100",
         "--batch-size", "32", "--hidden-sizes", "16", "--no-progress", "--device", "cpu"]


def test_updates_per_step_and_the_loop_summary(tmp_path: Path) -> None:
    summary = train(load_config([*LOOP, "--updates-per-step", "3", "--total-timesteps", "150",
                                 "--log-dir", str(tmp_path)]))
    agent = load_checkpoint(next(tmp_path.iterdir()))["agent"]
    assert agent["updates"] == 3 * 50  # 50 learning iterations, 3 updates each
    assert summary["learning_sps"] > 0 and summary["host_us_per_iteration"] > 0
    assert summary["compile"] is False and summary["graph"] is False


def test_async_envs_train(tmp_path: Path) -> None:
    assert main([*LOOP, "--num-envs", "2", "--vec-env", "async", "--log-dir", str(tmp_path)]) == 0
    state = load_checkpoint(next(tmp_path.iterdir()))
    assert state["config"]["vec_env"] == "async" and state["global_step"] == 300
    assert state["envs"] is None  # AsyncVectorEnv's subprocesses do not pickle; sync ones do


def test_shared_memory_envs_train_a_seed_group(tmp_path: Path) -> None:
    assert main([*LOOP, "--num-seeds", "2", "--vec-env", "shared", "--log-dir",
                 str(tmp_path)]) == 0
    state = load_checkpoint(next(tmp_path.iterdir()))
    assert state["config"]["vec_env"] == "shared" and state["global_step"] == 300
    assert state["envs"] is None  # its envs live in the workers


# A seed group: K seeds in one process, one tensorboard run each and the aggregate run.


def scalar_tags(folder: Path) -> set[str]:
    events = EventAccumulator(str(folder))
    events.Reload()
    return set(events.Tags()["scalars"])


def test_a_seed_group_logs_a_run_per_seed_and_the_aggregate(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main([*LOOP, "--seeds", "4", "9", "--total-timesteps", "400", "--log-interval",
                 "200", "--log-dir", str(tmp_path), "--run-name", "group"])
    assert code == 0
    out = capsys.readouterr().out
    assert "replay buffer: 2 seeds x" in out
    assert "; seeds 4, 9 mean return of the last 10: 4: " in out, out
    group = tmp_path / "group"
    assert sorted(p.name for p in group.iterdir()) == ["aggregate", "checkpoints", "seed_4",
                                                       "seed_9"]
    for seed in (4, 9):
        tags = scalar_tags(group / f"seed_{seed}")
        assert {"losses/critic", "losses/actor", "charts/alpha",
                "charts/episodic_return"} <= tags
    aggregate = scalar_tags(group / "aggregate")
    assert {"charts/SPS", "charts/episodic_return_iqm", "charts/episodic_return_iqm_low",
            "charts/episodic_return_iqm_high"} <= aggregate
    state = load_checkpoint(group)
    assert state["config"]["seeds"] == [4, 9] and len(state["recent_returns"]) == 2


def test_a_seed_group_refuses_a_built_module(tmp_path: Path) -> None:
    import gymnasium as gym

    from rl_graphstep.core.errors import ConfigError
    from rl_graphstep.networks.builtin import DeterministicActor

    space = gym.spaces.Box(-1.0, 1.0, (3,))
    actor = DeterministicActor(space, gym.spaces.Box(-1.0, 1.0, (1,)))
    cfg = load_config([*LOOP, "--algo", "td3", "--num-seeds", "2", "--log-dir", str(tmp_path)])
    with pytest.raises(ConfigError, match="a built actor module has one initialisation"):
        train(cfg, actor=actor)


def test_a_reporter_hears_every_log_interval_with_each_seeds_returns(tmp_path: Path) -> None:
    heard: list[tuple[int, list[list[float]]]] = []
    cfg = load_config([*LOOP, "--num-seeds", "2", "--total-timesteps", "600", "--log-interval",
                       "200", "--log-dir", str(tmp_path)])
    summary = train(cfg, report=lambda step, recent: heard.append((step, recent)))
    assert [step for step, _ in heard] == [200, 400, 600]
    assert all(len(recent) == 2 for _, recent in heard)  # one list per seed
    assert heard[-1][1] == summary["recent_returns"]  # Pendulum's episodes: 200 steps each
    assert [len(returns) for returns in heard[-1][1]] == [3, 3]


@pytest.mark.parametrize("seeds", [1, 2])
def test_obs_norm_statistics_are_those_of_the_stored_observations(seeds: int,
                                                                  tmp_path: Path) -> None:
    """--obs-norm: each seed's statistics count every observation its ring stored (2 envs x
    200 steps = 400 per seed, the ring not yet wrapped), and equal np.mean / np.var of them."""
    assert main(["--env", "Pendulum-v1", "--log-dir", str(tmp_path), "--run-name", "norm",
                 *SHORT, "--num-envs", "2", "--num-seeds", str(seeds), "--obs-norm",
                 "--save-buffer"]) == 0
    state = load_checkpoint(tmp_path / "norm")
    saved, storage = state["obs_normalizer"], state["buffer"]["storage"]
    stored = (storage if seeds > 1 else storage[None])[..., :3].double().numpy()
    assert stored.shape == (seeds, 400, 3)
    assert saved["count"].tolist() == [400] * seeds
    np.testing.assert_allclose(saved["mean"].numpy(), stored.mean(axis=1), rtol=1e-10)
    np.testing.assert_allclose(saved["var"].numpy(), stored.var(axis=1), rtol=1e-10)
    # Pendulum's observation is cos, sin and an angular velocity in [-8, 8].
    assert (np.abs(saved["mean"].numpy()[:, :2]) < 1).all()
    assert (saved["var"].numpy()[:, 2] > 0.1).all()


def test_without_obs_norm_a_checkpoint_has_no_statistics(tmp_path: Path) -> None:
    assert main(["--env", "Pendulum-v1", "--log-dir", str(tmp_path), "--run-name", "raw",
                 *SHORT]) == 0
    assert load_checkpoint(tmp_path / "raw")["obs_normalizer"] is None


def test_obs_norm_updates_and_acts_on_normalised_observations(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The policy acts on the raw observations through the run's statistics (the updates'
    batches: tests/learners/test_offpolicy.py)."""
    from rl_graphstep.algorithms.sac import SAC
    from rl_graphstep.data.normalizer import ObservationNormalizer

    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    normalize = ObservationNormalizer.normalize

    def spy(self: ObservationNormalizer, observations: torch.Tensor,
            stats: torch.Tensor | None = None) -> torch.Tensor:
        out = normalize(self, observations, stats)
        seen.append((observations.clone(), out.clone()))
        return out

    monkeypatch.setattr(ObservationNormalizer, "normalize", spy)
    acted: list[torch.Tensor] = []
    explore = SAC.explore
    monkeypatch.setattr(SAC, "explore", lambda self, actor, obs, noise=None: (
        acted.append(obs.clone()), explore(self, actor, obs, noise))[1])
    assert main(["--env", "Pendulum-v1", "--log-dir", str(tmp_path), "--run-name", "n",
                 *SHORT, "--obs-norm"]) == 0
    assert len(acted) == 400 - 150 and len(seen) == len(acted)
    for (raw, out), observed in zip(seen, acted, strict=True):
        assert torch.equal(out, observed) and not torch.equal(raw, observed)
