"""Sweeps on Ray Tune: a 2 x 2 grid on a local Ray (every trial a seed group), the results
table and best config, a second sweep into the same folder refused, a resume of an edited file
refused; stops and resumes, retries, bad flags; the metric and the search space on their own."""

from __future__ import annotations

import contextlib
import csv
import math
import os
from pathlib import Path

import pytest
import yaml
from processtools import Children, run

from rl_graphstep.core.errors import RunFolderError
from rl_graphstep.run.checkpoint import checkpoint_step, list_checkpoints
from rl_graphstep.run.cli import suggested_command
from rl_graphstep.sweep import main
from rl_graphstep.sweeps.trials import trial_cpus, trial_metrics
from rl_graphstep.train import main as train_main

SWEEP = """
name: grid
base:
  env_id: Pendulum-v1
  total_timesteps: 400
  learning_starts: 200
  batch_size: 32
  hidden_sizes: [16]
  device: cpu
  log_interval: 100
  progress: false
search:
  q_lr: [0.001, 0.0003]
  policy_lr: [0.001, 0.0003]
num_seeds: 2
"""


def test_the_metric_is_the_iqm_or_mean_of_the_seeds_recent_means() -> None:
    recent = [[-100.0, -300.0], [-50.0], [-900.0], [-10.0]]  # seed means -200, -50, -900, -10
    got = trial_metrics(recent, "iqm")
    assert got["iqm_return"] == pytest.approx(-125.0)  # the middle two: -200 and -50
    assert got["mean_return"] == pytest.approx(-290.0)
    assert got["score"] == got["iqm_return"]
    assert trial_metrics(recent, "mean")["score"] == got["mean_return"]
    assert math.isnan(trial_metrics([[-1.0], []], "iqm")["score"])  # a seed without episodes


def test_a_trial_trains_with_the_whole_cpus_it_holds() -> None:
    # train(cpus=...) then decides --vec-env auto and the shared env's workers from them.
    assert [trial_cpus(share) for share in (0.25, 1, 3.5, 4)] == [1, 1, 3, 4]


def test_the_search_space_in_tunes_terms(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    from rl_graphstep.settings.sweepfile import read_sweep_file
    from rl_graphstep.sweeps.trials import search_space

    path = tmp_path / "s.yaml"
    path.write_text("search:\n  q_lr: [0.1, 0.01]\n  policy_frequency: {randint: [1, 3]}\n"
                    "  hidden_sizes: {choice: [[8], [16, 16]]}\n")
    space = search_space(read_sweep_file(path))
    assert space["q_lr"] == {"grid_search": [0.1, 0.01]}
    assert (space["policy_frequency"].lower, space["policy_frequency"].upper) == (1, 4)
    assert space["hidden_sizes"].categories == [[8], [16, 16]]


def test_a_two_by_two_grid_on_a_local_ray(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("ray.tune")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "grid.yaml").write_text(SWEEP)
    import signal

    handlers = [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)]
    assert main(["grid.yaml", "--log-dir", "runs"]) == 0
    # Called from Python, it leaves the caller's stop handlers (Tune leaves a Ctrl-C one).
    assert [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)] == \
        handlers
    sweep = tmp_path / "runs" / "grid"
    with (sweep / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4 and all(row["error"] == "" for row in rows)
    assert {(row["q_lr"], row["policy_lr"]) for row in rows} == {
        (q, p) for q in ("0.001", "0.0003") for p in ("0.001", "0.0003")}
    scores = [float(row["score"]) for row in rows]
    assert scores == sorted(scores, reverse=True)  # best first (mode max)
    assert all(row["global_step"] == "400" for row in rows)
    for row in rows:  # each trial: its seed group's folder
        assert sorted(p.name for p in (sweep / row["trial"]).iterdir()) == [
            "aggregate", "checkpoints", "seed_1", "seed_2"]
    assert (sweep / "results.md").read_text().count("\n") == 6  # header, rule, 4 trials
    best = sweep / "best_config.yaml"
    assert f"({rows[0]['trial']}," in best.read_text().splitlines()[0]
    # A line for each trial as it ends, before the table.
    ended = [line for line in capsys.readouterr().out.splitlines() if line.startswith("trial ")]
    assert len(ended) == 4 and ended[-1].endswith("; 4 of 4 trials ended")
    assert {line.split()[1] for line in ended} == {row["trial"] for row in rows}
    # The best config trains as it is (shorter here), as a seed group of the sweep's seeds.
    assert train_main(["--config", str(best), "--total-timesteps", "300", "--log-dir",
                       str(tmp_path / "again")]) == 0
    assert (next((tmp_path / "again").iterdir()) / "seed_2").is_dir()
    # A second sweep into the same folder is one line and exit 2.
    assert main(["grid.yaml", "--log-dir", "runs"]) == 2
    resume = suggested_command("sweep", "grid.yaml", "--log-dir", "runs",
                               "--resume")
    assert capsys.readouterr().err == (f"error: {sweep} already holds a sweep; give the sweep "
                                       f"another name, or continue it with: {resume}\n")
    # The folder keeps the file the sweep started with: a resume of an edited one is refused.
    assert yaml.safe_load((sweep / "sweep.yaml").read_text())["search"] == {
        "q_lr": [0.001, 0.0003], "policy_lr": [0.001, 0.0003]}
    (tmp_path / "grid.yaml").write_text(SWEEP.replace("q_lr", "tau")
                                        .replace("total_timesteps: 400", "total_timesteps: 500"))
    assert main(["grid.yaml", "--log-dir", "runs", "--resume"]) == 2
    assert capsys.readouterr().err == (
        "error: the sweep file grid.yaml differs from the one this sweep started with "
        "(total_timesteps 400 -> 500; search.q_lr removed; search.tau added); resume with the "
        "original file (a copy is runs/grid/sweep.yaml) or start a new sweep under another "
        "name or --log-dir\n")
    (tmp_path / "grid.yaml").write_text(SWEEP)
    assert main(["grid.yaml", "--log-dir", "runs", "--resume", "--scheduler", "asha"]) == 2
    assert capsys.readouterr().err == (
        "error: --scheduler asha differs from the sweep's --scheduler fifo: a resumed sweep "
        "keeps the flags it started with; drop --scheduler (or start a new sweep under another "
        "name or --log-dir)\n")
    assert not (sweep / ".lock").exists()


FAIL_ONCE = '''
"""Pendulum whose 250th step (counted over its episodes) raises while a marker file exists,
removing it: the first attempt of a trial fails there, its retry does not."""
import os

import gymnasium as gym
from gymnasium.envs.classic_control.pendulum import PendulumEnv

MARKER = os.environ["FAIL_ONCE_MARKER"]


class FailOncePendulum(PendulumEnv):
    steps = 0

    def step(self, action):
        self.steps += 1
        if self.steps == 250 and os.path.exists(MARKER):
            os.remove(MARKER)
            raise RuntimeError("the simulator crashed")
        return super().step(action)


gym.register("FailOncePendulum-v0", entry_point=FailOncePendulum, max_episode_steps=200)
'''


def failing_sweep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, module: str,
                  extra: str = "") -> Path:
    """``<name>.yaml`` in ``tmp_path`` (the cwd from here on): one trial on the failing Pendulum
    of ``module`` (written as ``failonce.py``, importable by Ray's workers), with ``extra``
    base lines; returns the marker file: while it exists, the 250th step fails."""
    (tmp_path / "failonce.py").write_text(module)
    marker = tmp_path / "fail-marker"
    marker.touch()
    monkeypatch.setenv("FAIL_ONCE_MARKER", str(marker))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.chdir(tmp_path)
    env = "env_id: failonce:FailOncePendulum-v0" + (f"\n{extra}" if extra else "")
    (tmp_path / f"{name}.yaml").write_text(
        SWEEP.replace("name: grid", f"name: {name}").replace("env_id: Pendulum-v1", env)
        .replace("  policy_lr: [0.001, 0.0003]\n", "")
        .replace("q_lr: [0.001, 0.0003]", "q_lr: [0.001]"))
    return marker


def test_a_failed_trial_is_retried_from_its_last_checkpoint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("ray.tune")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    marker = failing_sweep(tmp_path, monkeypatch, "once", FAIL_ONCE, "  checkpoint_every: 100")
    assert main(["once.yaml", "--log-dir", "runs", "--max-failures", "1"]) == 0
    assert not marker.exists()  # the first attempt failed at its 250th step
    sweep = tmp_path / "runs" / "once"
    with (sweep / "results.csv").open() as f:
        (row,) = list(csv.DictReader(f))
    assert row["error"] == "" and row["global_step"] == "400"
    events = EventAccumulator(str(sweep / row["trial"] / "aggregate"))
    events.Reload()
    # Logged at 100 and 200 by the first attempt, then on from its checkpoint at 200 by the
    # retry: each step once (a retry from scratch would log 100 and 200 twice).
    assert [e.step for e in events.Scalars("charts/SPS")] == [100, 200, 300, 400]


# SIGTERM to the driver alone is not a case of its own: the group's SIGTERM reaches the
# driver's handler the same way (and Ray's processes too), and each case starts Ray twice.
@pytest.mark.parametrize("how", ["kill -9", "SIGINT", "SIGTERM to the group"])
def test_a_driver_stopped_mid_sweep_resumes_and_every_trial_finishes_once(
        how: str, tmp_path: Path, children: Children) -> None:
    """kill -9 of the driver's process group (its local Ray with it), a Ctrl-C to the
    driver, or a SIGTERM to its whole process group (``timeout``, a batch system), after
    which it stops cleanly with one line; the command that line gives, run as printed,
    finishes the rest."""
    pytest.importorskip("ray.tune")
    import shlex
    import signal
    import subprocess
    import sys
    import time

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (tmp_path / "grid.yaml").write_text(  # two trials, stopped past a checkpoint at 400
        SWEEP.replace("total_timesteps: 400", "total_timesteps: 700\n  checkpoint_every: 200")
        .replace("  policy_lr: [0.001, 0.0003]\n", ""))
    root = Path(__file__).parents[1]
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    command = [sys.executable, "-m", "rl_graphstep.sweep", "grid.yaml", "--log-dir", "runs"]
    # Its own process group (processtools), its local Ray in it, killed when the test ends.
    driver = children.start(command, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    sweep = tmp_path / "runs" / "grid"
    deadline = time.monotonic() + 120
    # Stopped once some trial has checkpointed (others may have finished or not started).
    while time.monotonic() < deadline and not list(sweep.glob("*/checkpoints/step_*400.pt")):
        time.sleep(0.2)
    if how == "kill -9":
        os.killpg(driver.pid, signal.SIGKILL)  # the driver, and Ray's processes after it
        driver.communicate(timeout=60)
        resume = [*command, "--resume"]
    else:
        signum = signal.SIGINT if how == "SIGINT" else signal.SIGTERM
        if how == "SIGTERM to the group":
            os.killpg(driver.pid, signum)
        else:
            driver.send_signal(signum)
        _, stderr = driver.communicate(timeout=120)
        assert driver.returncode == 128 + signum, stderr[-2000:]
        assert "Traceback" not in stderr
        last = stderr.splitlines()[-1]
        printed = suggested_command("sweep", "grid.yaml", "--log-dir", "runs",
                                    "--resume")
        assert last.endswith(f"trials unfinished; continue with: {printed}"), stderr[-2000:]
        assert "Tuner.restore" not in stderr  # Tune's own advice, not a command to run
        resume = shlex.split(printed)
    assert not (sweep / "results.csv").exists()
    resumed = run(resume, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    with (sweep / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 and all(r["error"] == "" and r["global_step"] == "700" for r in rows)
    for row in rows:  # every step of every trial logged once: nothing was run twice
        events = EventAccumulator(str(sweep / row["trial"] / "aggregate"))
        events.Reload()
        assert [e.step for e in events.Scalars("charts/SPS")] == list(range(100, 701, 100))


@pytest.mark.slow
def test_a_sweep_on_a_two_node_cluster_retries_a_killed_worker(tmp_path: Path,
                                                              children: Children) -> None:
    """A real cluster on loopback, started and stopped by this test with Ray's own commands:
    a head and a second node of one CPU each. The trials run on both, and the one whose worker
    process is killed is retried from its checkpoint and finishes."""
    pytest.importorskip("ray.tune")
    import signal
    import socket
    import subprocess
    import sys
    import time

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ray = str(Path(sys.executable).with_name("ray"))
    address = f"127.0.0.1:{port}"
    common = ["--num-cpus", "1", "--disable-usage-stats"]
    (tmp_path / "grid.yaml").write_text(SWEEP.replace("total_timesteps: 400",
                                                      "total_timesteps: 1000\n"
                                                      "  checkpoint_every: 200"))
    root = Path(__file__).parents[1]
    # A loopback cluster of this test alone: no token for its nodes and driver to share.
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "RAY_AUTH_MODE": "disabled"}
    try:
        # Not processtools' run: it would kill the nodes `ray start` leaves in its group.
        subprocess.run([ray, "start", "--head", "--node-ip-address", "127.0.0.1", "--port",
                        str(port), "--include-dashboard", "false", *common], check=True,
                       env=env, capture_output=True, timeout=120, stdin=subprocess.DEVNULL)
        subprocess.run([ray, "start", "--address", address, *common], check=True, env=env,
                       capture_output=True, timeout=120, stdin=subprocess.DEVNULL)
        driver = children.python(
            "-m", "rl_graphstep.sweep", "grid.yaml", "--log-dir", "runs", "--address", address,
            "--max-failures", "2", cwd=tmp_path, env=env, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        sweep = tmp_path / "runs" / "grid"
        killed = None  # the trial id whose training process was killed
        deadline = time.monotonic() + 180
        while killed is None and time.monotonic() < deadline and driver.poll() is None:
            # A trial under way: its folder holds a checkpoint at step 400 or later and its
            # lock (gone once it has ended) names its training process, Ray's worker.
            for lock in sweep.glob("*/.lock"):
                steps = [checkpoint_step(p) or 0 for p in list_checkpoints(lock.parent)]
                if not steps or not 400 <= max(steps) < 1000:
                    continue
                with contextlib.suppress(OSError, ValueError, IndexError):  # just released
                    pid = int(lock.read_text().split()[0])
                    os.kill(pid, signal.SIGKILL)
                    killed = lock.parent.name
                    break
            time.sleep(0.1)
        _, stderr = driver.communicate(timeout=300)
        assert driver.returncode == 0, stderr[-3000:]
        assert killed is not None
        with (sweep / "results.csv").open() as f:
            rows = list(csv.DictReader(f))
        assert len(rows) == 4 and all(r["error"] == "" and r["global_step"] == "1000"
                                      for r in rows)
        assert len({r["node"] for r in rows}) == 2  # both nodes ran trials
        # Finished without an error: its retry resumed its folder (one from scratch is refused,
        # the folder holding a run with checkpoints).
        assert killed in {r["trial"] for r in rows}
    finally:
        subprocess.run([ray, "stop", "--force"], env=env, capture_output=True, timeout=120,
                       stdin=subprocess.DEVNULL)


def test_optuna_picks_the_sampled_values(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("ray.tune")
    pytest.importorskip("optuna")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "opt.yaml").write_text(
        SWEEP.replace("name: grid", "name: opt")
        .replace("  q_lr: [0.001, 0.0003]\n  policy_lr: [0.001, 0.0003]\n",
                 "  q_lr: {loguniform: [1.0e-4, 1.0e-2]}\n")
        .replace("num_seeds: 2", "num_seeds: 1\nnum_samples: 2"))
    assert main(["opt.yaml", "--log-dir", "runs", "--search", "optuna"]) == 0
    with (tmp_path / "runs" / "opt" / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 and all(1e-4 <= float(r["q_lr"]) <= 1e-2 for r in rows)


def test_optuna_refuses_a_grid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("ray.tune")
    (tmp_path / "grid.yaml").write_text(SWEEP)
    assert main([str(tmp_path / "grid.yaml"), "--log-dir", str(tmp_path / "runs"),
                 "--search", "optuna"]) == 2
    assert capsys.readouterr().err == (
        f"error: --search optuna samples every setting; the grid of q_lr, policy_lr in "
        f"{tmp_path / 'grid.yaml'} would be one choice each (write it as {{choice: [...]}})\n")
    assert not (tmp_path / "runs").exists()  # refused before anything was made


def test_a_sweep_into_a_folder_another_sweep_holds_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rl_graphstep.run.rundir import RunLock

    (tmp_path / "grid.yaml").write_text(SWEEP)
    sweep = tmp_path / "runs" / "grid"
    with RunLock(sweep, owner="sweep"):  # another sweep's driver, running
        assert main([str(tmp_path / "grid.yaml"), "--log-dir", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {sweep} is in use by another sweep (pid {os.getpid()}); ")
    assert err.endswith("wait for it to end or give this one another name\n")


def test_asha_runs_the_grid_and_may_stop_trials_early(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Which trials ASHA stops depends on the order they report in; what holds: every trial
    ends without an error, at a logged step, and a stopped one counts as ended."""
    pytest.importorskip("ray.tune")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "asha.yaml").write_text(
        SWEEP.replace("name: grid", "name: asha").replace("total_timesteps: 400",
                                                          "total_timesteps: 800")
        .replace("num_seeds: 2", "num_seeds: 1"))
    assert main(["asha.yaml", "--log-dir", "runs", "--scheduler", "asha"]) == 0
    with (tmp_path / "runs" / "asha" / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4 and all(r["error"] == "" for r in rows)
    assert all(int(r["global_step"]) in range(100, 801, 100) for r in rows)


def test_a_trial_that_always_fails_is_recorded_with_its_own_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("ray.tune")
    failing_sweep(tmp_path, monkeypatch, "always", FAIL_ONCE.replace("os.remove(MARKER)", "pass"))
    assert main(["always.yaml", "--log-dir", "runs", "--max-failures", "0"]) == 1
    with (tmp_path / "runs" / "always" / "results.csv").open() as f:
        (row,) = list(csv.DictReader(f))
    assert row["error"].startswith("EnvError: the environment's step raised RuntimeError: "
                                   "the simulator crashed")



@pytest.mark.parametrize(("flags", "line"), [
    (["--max-failures", "-1"], "--max-failures must be 0 or more (retries of a failed trial), "
                               "got -1"),
    (["--cpus-per-trial", "0"], "--cpus-per-trial must be a number > 0 (a share such as 0.5, "
                                "or whole ones), got 0"),
    (["--gpus-per-trial", "-1"], "--gpus-per-trial must be a number >= 0 (a share such as 0.5, "
                                 "or whole ones), got -1"),
    (["--cpus-per-trial", "two"], "--cpus-per-trial must be a number, got 'two'"),
    (["--max-failure", "1"], "unknown flag --max-failure (did you mean --max-failures?)"),
])
def test_a_bad_flag_is_one_line_before_anything_starts(
        flags: list[str], line: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "grid.yaml").write_text(SWEEP)
    assert main([str(tmp_path / "grid.yaml"), "--log-dir", str(tmp_path / "runs"), *flags]) == 2
    assert capsys.readouterr().err == f"error: {line}\n"
    assert not (tmp_path / "runs").exists()


def test_a_trial_the_local_ray_could_never_place_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Tune would wait for the CPUs forever."""
    pytest.importorskip("ray.tune")
    (tmp_path / "grid.yaml").write_text(SWEEP)
    assert main([str(tmp_path / "grid.yaml"), "--log-dir", str(tmp_path / "runs"),
                 "--cpus-per-trial", "100000"]) == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.startswith("error: --cpus-per-trial 100000 is more than the ")
    assert err.endswith(" CPUs of the local Ray this sweep started, so no trial could ever "
                        "start; give at most " + err.split("the ")[1].split()[0] +
                        ", or --address a Ray cluster that has them")
    assert not (tmp_path / "runs").exists()


def test_a_network_file_named_from_the_sweeps_folder_trains_in_every_trial(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``critic: nets/layernorm_critic.py:...`` as ``train --config`` takes it, from the current
    folder, though the trial runs in a Ray worker elsewhere."""
    pytest.importorskip("ray.tune")
    import shutil

    monkeypatch.chdir(tmp_path)
    (tmp_path / "nets").mkdir()
    shutil.copy(Path(__file__).parents[1] / "examples" / "layernorm_critic.py", tmp_path / "nets")
    (tmp_path / "nets.yaml").write_text(
        SWEEP.replace("name: grid", "name: nets").replace("  policy_lr: [0.001, 0.0003]\n", "")
        .replace("q_lr: [0.001, 0.0003]", "q_lr: [0.001]").replace("num_seeds: 2", "num_seeds: 1")
        .replace("  device: cpu", "  device: cpu\n  critic: "
                 "nets/layernorm_critic.py:LayerNormCritic"))
    assert main(["nets.yaml", "--log-dir", "runs", "--max-failures", "0"]) == 0
    with (tmp_path / "runs" / "nets" / "results.csv").open() as f:
        (row,) = list(csv.DictReader(f))
    assert row["error"] == "" and row["global_step"] == "400"


def test_a_trial_that_starts_over_starts_a_clean_folder(tmp_path: Path) -> None:
    """A trial whose earlier attempt left no checkpoint trains again from step 0: what that
    attempt logged goes, so no curve repeats its steps; one with a checkpoint resumes."""
    from rl_graphstep.run.rundir import RunLock
    from rl_graphstep.sweeps.trials import trial_resumes

    trial = tmp_path / "t1"
    assert not trial_resumes(trial) and not trial.exists()
    (trial / "seed_1").mkdir(parents=True)
    (trial / "seed_1" / "events.out.tfevents.1").write_bytes(b"steps 100 and 200")
    (trial / "aggregate").mkdir()
    assert not trial_resumes(trial)
    assert trial.is_dir() and list(trial.iterdir()) == []
    (trial / "checkpoints").mkdir()
    (trial / "checkpoints" / "step_200.pt").write_bytes(b"")
    (trial / "seed_1").mkdir()
    assert trial_resumes(trial)
    assert (trial / "seed_1").is_dir()
    (trial / "checkpoints" / "step_200.pt").unlink()
    with RunLock(trial), pytest.raises(RunFolderError, match="its earlier attempt still runs"):
        trial_resumes(trial)  # an attempt still running: nothing removed under it
    assert (trial / "seed_1").is_dir()


def test_a_retried_trial_without_a_checkpoint_logs_each_step_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("ray.tune")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    marker = failing_sweep(tmp_path, monkeypatch, "over", FAIL_ONCE)
    # Failing before learning starts, it saves no checkpoint (one that fails later keeps what
    # it learned in one): its retry starts over.
    sweep_file = tmp_path / "over.yaml"
    sweep_file.write_text(sweep_file.read_text().replace("learning_starts: 200",
                                                         "learning_starts: 300"))
    assert main(["over.yaml", "--log-dir", "runs", "--max-failures", "1"]) == 0
    assert not marker.exists()  # the first attempt failed at its 250th step
    sweep = tmp_path / "runs" / "over"
    with (sweep / "results.csv").open() as f:
        (row,) = list(csv.DictReader(f))
    assert row["error"] == "" and row["global_step"] == "400"
    trial = sweep / row["trial"]
    events = EventAccumulator(str(trial / "aggregate"))
    events.Reload()
    # The retry's steps alone: the first attempt's 100 and 200 are not logged twice.
    assert [e.step for e in events.Scalars("charts/SPS")] == [100, 200, 300, 400]
    for folder in ("aggregate", "seed_1", "seed_2"):  # the first attempt's files are gone
        assert len(list((trial / folder).glob("events.out.tfevents.*"))) == 1


def test_a_sigterm_while_ray_starts_is_one_line_and_leaves_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Ray's own SIGTERM handler, set while it starts, would exit with 15 and no line."""
    ray = pytest.importorskip("ray")
    import signal

    monkeypatch.setattr(ray, "init", lambda **_kwargs: signal.raise_signal(signal.SIGTERM))
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "grid.yaml").write_text(SWEEP)
    assert main(["grid.yaml", "--log-dir", "my runs"]) == 143
    again = suggested_command("sweep", "grid.yaml", "--log-dir", "my runs")
    assert capsys.readouterr().err == (
        f"stopped by SIGTERM before any trial ran; run the same command again: {again}\n")
    assert not (tmp_path / "my runs").exists()


NAN_REWARDS = '''
"""Pendulum whose every reward is NaN: no transition is stored, so its run makes no update."""
import math

import gymnasium as gym
from gymnasium.envs.classic_control.pendulum import PendulumEnv


class NaNRewardPendulum(PendulumEnv):
    def step(self, action):
        observation, _, terminated, truncated, info = super().step(action)
        return observation, math.nan, terminated, truncated, info


gym.register("NaNRewardPendulum-v0", entry_point=NaNRewardPendulum, max_episode_steps=200)
'''


def test_a_trial_whose_run_did_not_learn_is_not_counted_finished(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
        ) -> None:
    """train exits 3 for such a run: its trial's row says why, it is no best config, and the
    sweep exits 1 with a line saying how many trials did not learn."""
    pytest.importorskip("ray.tune")
    (tmp_path / "nanreward.py").write_text(NAN_REWARDS)
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "nan.yaml").write_text(
        SWEEP.replace("name: grid", "name: nan").replace("  policy_lr: [0.001, 0.0003]\n", "")
        .replace("q_lr: [0.001, 0.0003]", "q_lr: [0.001]").replace("num_seeds: 2", "num_seeds: 1")
        .replace("env_id: Pendulum-v1", "env_id: nanreward:NaNRewardPendulum-v0"))
    assert main(["nan.yaml", "--log-dir", "runs", "--max-failures", "0"]) == 1
    sweep = tmp_path / "runs" / "nan"
    with (sweep / "results.csv").open() as f:
        (row,) = list(csv.DictReader(f))
    assert row["error"].startswith("not learned: no update was made: the replay buffer never "
                                   "held a batch of --batch-size 32 transitions (it holds 0; "
                                   "400 of 400 transitions had non-finite values")
    assert row["global_step"] == "400"
    assert not (sweep / "best_config.yaml").exists()
    assert capsys.readouterr().err.splitlines()[-1] == (
        "error: 1 of 1 trials did not learn; see the error column of runs/nan/results.csv")


def test_trials_that_failed_or_did_not_learn_rank_last_and_are_counted(tmp_path: Path) -> None:
    """Their last returns say nothing of their settings: never the best config."""
    from types import SimpleNamespace

    from rl_graphstep.settings.sweepfile import SweepSpec
    from rl_graphstep.sweeps.results import failed_line, write_results

    def result(trial: str, score: float, error: BaseException | None = None,
               why: str = "") -> SimpleNamespace:
        return SimpleNamespace(metrics={"trial_id": trial, "score": score, "not_learned": why},
                               config={"q_lr": 0.001}, error=error, path=trial)

    spec = SweepSpec(name="s", source="s.yaml",
                     base={"total_timesteps": 400, "learning_starts": 100},
                     grid={"q_lr": (0.001,)})
    rows = [result("a", -900.0), result("b", -100.0, why="no update was made"),
            result("c", -50.0, error=RuntimeError("crashed")), result("d", -500.0)]
    ranked = write_results(spec, rows, tmp_path)
    assert [r["trial"] for r in ranked] == ["d", "a", "c", "b"]
    assert [r["error"] for r in ranked] == ["", "", "RuntimeError: crashed",
                                            "not learned: no update was made"]
    assert "(d, score -500.0)" in (tmp_path / "best_config.yaml").read_text()
    assert failed_line(ranked, Path("runs/s/results.csv")) == (
        "1 of 4 trials failed and 1 did not learn; see the error column of runs/s/results.csv")
    assert failed_line(ranked[:2], Path("r.csv")) is None


@pytest.mark.parametrize(("change", "asked"), [
    ("  device: cpu", "device: cuda"),
    ("  device: cpu\n  graph: 'on'", "graph: on"),
])
def test_a_trial_that_needs_a_gpu_the_local_machine_lacks_is_one_line(
        change: str, asked: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """It failed in Ray, and was retried, in every trial that asked for it."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    text = SWEEP.replace("  device: cpu\n", "" if asked == "device: cuda" else change + "\n")
    if asked == "device: cuda":
        text = text.replace("  policy_lr: [0.001, 0.0003]\n", "  device: [cpu, cuda]\n")
    (tmp_path / "grid.yaml").write_text(text)
    assert main([str(tmp_path / "grid.yaml"), "--log-dir", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: a trial trains with {asked} (in ")
    assert err.endswith("), but this machine, where a local Ray runs every trial, has no CUDA "
                        "GPU; use device cpu or auto, or --address a Ray cluster that has GPUs\n")
    assert not (tmp_path / "runs").exists()


def test_an_empty_log_dir_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    """It put the sweep's folder into the current one."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "grid.yaml").write_text(SWEEP)
    assert main(["grid.yaml", "--log-dir", ""]) == 2
    assert capsys.readouterr().err == ("error: --log-dir must not be empty; give the folder the "
                                       "sweep's folder goes in, such as runs\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["grid.yaml"]


def test_a_leading_tilde_is_the_home_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """``--log-dir=~/x`` and a quoted ``'~/grid.yaml'`` reach the program unexpanded; they are
    the home folder's, as train takes them, not a folder named ``~`` here."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "grid.yaml").write_text(SWEEP)
    assert main(["~/grid.yaml", "--log-dir=~/elsewhere", "--resume"]) == 2
    assert capsys.readouterr().err == (f"error: {tmp_path}/elsewhere/grid holds no sweep to "
                                       "resume; run it without --resume\n")
    assert not (tmp_path / "~").exists()


def test_the_help_says_what_a_sweep_is_in_whole_sentences(
        capsys: pytest.CaptureFixture[str]) -> None:
    """It stopped mid-sentence ("each trial is one ``train()`` call that") with RST quotes."""
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert ("each trial is one train() call that\ntrains the sweep's seeds as one group, and "
            "reports the group's returns at each log interval.") in out
    assert "python -m rl_graphstep.sweep configs/sweeps/sac_pendulum.yaml" in out
    assert "``" not in out
