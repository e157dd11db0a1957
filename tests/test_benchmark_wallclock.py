"""The wall-clock axis of the benchmark table: the launch a run records and reads back, times
since launch across a resume, the even-pace estimate of old results, and the time to a
threshold with its bootstrap interval on hand-made groups whose answers are worked out by
hand."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from processtools import run_python
from test_benchmark_table import config_table, load
from torch.utils.tensorboard import SummaryWriter

from rl_graphstep import train
from rl_graphstep.run import cli
from rl_graphstep.run.aggregate import bootstrap_interval, iqm
from rl_graphstep.run.logger import LAUNCH_TAG, launch_text, read_launch

ROOT = Path(__file__).resolve().parents[1]


def test_the_process_start_comes_from_proc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                           ) -> None:
    """Started 2,500 s after boot (field 22, in clock ticks), read at 3,000.5 s of uptime:
    500.5 s before now. The command name may hold spaces and parentheses."""
    ticks = cli.os.sysconf("SC_CLK_TCK")
    (tmp_path / "self").mkdir()
    fields = ["S", *map(str, range(4, 22)), str(2500 * ticks), "7", "8"]
    (tmp_path / "self" / "stat").write_text(f"1234 (a (b) c) {' '.join(fields)}\n")
    (tmp_path / "uptime").write_text("3000.50 100.0\n")
    monkeypatch.setattr(cli.time, "time", lambda: 1_000_000.0)
    assert cli.process_start_time(str(tmp_path)) == pytest.approx(1_000_000.0 - 500.5)
    assert cli.process_start_time(str(tmp_path / "none")) is None  # no /proc


def test_this_processes_start_is_before_now() -> None:
    started = cli.process_start_time()
    if started is None:
        pytest.skip("no /proc here")
    assert time.time() - 7 * 86_400 < started < time.time()


def test_the_marked_launch_is_taken_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "process_start_time", lambda: 1234.5)
    cli.mark_launch()
    assert cli.launch_time() == 1234.5
    assert cli.launch_time() == pytest.approx(time.time(), abs=5)  # a later run: now


def test_the_launch_text_reads_back() -> None:
    assert read_launch(launch_text(1765432100.123456)) == 1765432100.123456


def test_a_group_records_its_launch_and_collect_times_its_episodes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A launch marked 100 s before the run: every episode is 100 s and more after it, in
    step order, and the group's wall time counts from it."""
    monkeypatch.setattr(cli, "_launched", time.time() - 100)
    assert train.main(["--env", "Pendulum-v1", "--num-seeds", "2", "--total-timesteps", "600",
                       "--learning-starts", "100", "--batch-size", "16", "--hidden-sizes", "16",
                       "16", "--log-interval", "100", "--no-progress", "--device", "cpu",
                       "--log-dir", str(tmp_path), "--run-name", "group"]) == 0
    for folder in ("seed_1", "seed_2", "aggregate"):
        (process,), _ = load("runfolders").processes(tmp_path / "group" / folder)
        assert process.launch == pytest.approx(time.time() - 100, abs=60)
    table = load("table")
    assert table.main(["collect", str(tmp_path / "group"), "--results",
                       str(tmp_path / "results")]) == 0
    assert (tmp_path / "results" / "Pendulum-v1__sac.csv").read_text().startswith(
        "seed,step,return,seconds\n")
    (group,) = load("results").load_results(tmp_path / "results")
    assert group.timed_from == "launch" and not group.estimated
    assert 100 <= group.wall_s < 400
    # PPO's settings, in every run's config table, are not SAC's: not kept.
    assert group.settings == {"num_envs": 1, "batch_size": 16, "updates_per_step": 1,
                              "learning_starts": 100, "num_steps": None, "num_minibatches": None,
                              "update_epochs": None}
    for curve in group.curves:
        assert list(curve.steps) == [200, 400, 600]
        assert 100 <= curve.seconds[0] <= curve.seconds[1] <= curve.seconds[2] <= group.wall_s


def test_the_command_records_its_process_start(tmp_path: Path) -> None:
    """``python -m rl_graphstep.train`` records the process's start: after it was spawned,
    before its first event (importing torch comes between)."""
    spawned = time.time()
    done = run_python("-m", "rl_graphstep.train", "--env", "Pendulum-v1", "--total-timesteps",
                      "300", "--learning-starts", "100", "--batch-size", "16",
                      "--hidden-sizes", "16", "--no-progress", "--device", "cpu",
                      "--log-dir", str(tmp_path), "--run-name", "one", cwd=ROOT,
                      capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    (process,), _ = load("runfolders").processes(tmp_path / "one")
    assert spawned - 0.05 <= process.launch < process.first  # /proc counts in 10 ms ticks


def write_process(run_dir: Path, seed: int, launch: float,
                  episodes: list[tuple[int, float, float]]) -> None:
    """One process's event file of a single-seed TD3 run: its launch and (step, wall time,
    return) episodes."""
    writer = SummaryWriter(str(run_dir))
    writer.add_text("hyperparameters", config_table("HalfCheetah-v5", "td3", seed))
    writer.add_text(LAUNCH_TAG, launch_text(launch))
    for step, at, value in episodes:
        writer.add_scalar("charts/episodic_return", value, step, walltime=at)
    writer.close()


def test_a_resumed_run_counts_the_earlier_processes_time(tmp_path: Path) -> None:
    """Launched now, last event 60 s later; resumed by a process launched 4,000 s after
    the first: its episodes are 60 s plus their time since its launch. (The writers' own
    first events are stamped now.)"""
    start = time.time()
    write_process(tmp_path, 1, start, [(1000, start + 10, 1.0), (2000, start + 60, 2.0)])
    write_process(tmp_path, 1, start + 4000, [(3000, start + 4005, 3.0),
                                              (4000, start + 4040, 4.0)])
    runfolders = load("runfolders")
    _, curve = runfolders.read_seed_run(tmp_path)
    np.testing.assert_allclose(curve.seconds, [10, 60, 65, 100], atol=1e-3)
    group = runfolders.read_group(tmp_path)
    assert group.wall_s == pytest.approx(100, abs=1e-3) and group.timed_from == "launch"


def test_old_csvs_without_times_are_read_at_an_even_pace(tmp_path: Path) -> None:
    """A results folder written before the times and settings were kept: each episode's time
    is its share of the wall time (200 s over 1,000 steps), marked as estimated."""
    (tmp_path / "groups.csv").write_text(
        "env_id,algo,seeds,steps,wall_s,env_steps_per_s\n"
        "Hopper-v5,sac,1 2,1000,200.0,10\n")
    (tmp_path / "Hopper-v5__sac.csv").write_text(
        "seed,step,return\n1,250,10.0\n1,500,20.0\n1,1000,30.0\n2,400,5.0\n")
    results = load("results")
    (group,) = results.load_results(tmp_path)
    assert group.estimated and group.timed_from == "first event"
    np.testing.assert_allclose(group.seconds(group.curves[0]), [50, 100, 200])
    np.testing.assert_allclose(group.seconds(group.curves[1]), [80])
    assert group.gradient_samples_per_s is None
    rows = load("wallclock").wallclock_rows([group], {})
    row = load("wallclock").wallclock_table(rows).splitlines()[2]
    assert row.endswith("| 3.3 min | 10 | - | even pace (estimated) |")


def test_gradient_samples_count_the_updates_after_learning_starts() -> None:
    """5 seeds, 11,000 steps of 2 envs each, 1,000 random: 5,000 iterations of 3 updates
    of 128 rows per seed, in 100 s."""
    results = load("results")
    curves = [results.SeedCurve(s, np.array([11_000]), np.array([0.0])) for s in range(5)]
    group = results.GroupResult("Hopper-v5", "sac", curves, 11_000, 100.0,
                                {"num_envs": 2, "batch_size": 128, "updates_per_step": 3,
                                 "learning_starts": 1000})
    assert group.gradient_samples == 5 * 5000 * 3 * 128
    assert group.gradient_samples_per_s == pytest.approx(96_000)


def hand_group(late_fifth: bool = False, never_fifth: bool = False) -> Any:
    """Five seeds, each with an episode of return 0 at 5 s, and seed k's next of return
    1,000 at 10k s (its last-10 mean then 500); all end with one more of 1,000 at 60 s
    (667). ``late_fifth``: seed 5's episodes are 1,000 at 45 and 60 s. ``never_fifth``:
    seed 5's episodes all return 0."""
    results = load("results")
    curves = []
    for k in range(1, 6):
        times, returns = [5.0, 10.0 * k, 60.0], [0.0, 1000.0, 1000.0]
        if k == 5 and late_fifth:
            times, returns = [45.0, 60.0], [1000.0, 1000.0]
        if k == 5 and never_fifth:
            returns = [0.0, 0.0, 0.0]
        seconds = np.array(times)
        curves.append(results.SeedCurve(k, (seconds * 100).astype(np.int64),
                                        np.array(returns), seconds))
    return results.GroupResult("Hopper-v5", "sac", curves, 6000, 60.0,
                               dict.fromkeys(results.SETTINGS), "launch")


def test_the_time_to_threshold_and_its_interval() -> None:
    """The IQM of five seeds keeps the middle three: it is 500 once four seeds are at 500,
    at 40 s. A draw of five seeds reaches 400 at its fourth-earliest seed; with T uniform
    over 10-50 s, P(that <= 10 s) = 0.0067 and P(<= 20 s) = 0.087 put the 2.5% quantile at
    20 s; P(<= 40 s) = 0.737 puts the 97.5% at 50 s."""
    wallclock = load("wallclock")
    curves = wallclock.time_curves(hand_group())
    np.testing.assert_allclose(curves.grid, [5, 10, 20, 30, 40, 50, 60])
    np.testing.assert_allclose(wallclock.iqm_curve(curves.rows),
                               [0, 0, 500 / 3, 1000 / 3, 500, 500, 2000 / 3])
    assert wallclock.time_to_threshold(curves, 400) == (40, 20, 50)
    assert wallclock.step_at(curves, 40) == 4000
    # Never at 800: the last IQM is 667.
    assert wallclock.time_to_threshold(curves, 800) == (np.inf, np.inf, np.inf)


def test_a_seed_that_never_gets_there_leaves_the_interval_open() -> None:
    """Seed 5 stays at 0: four seeds still reach at 40 s, but a draw needs four of its five
    among seeds 1-4 (P = 0.737), so over 2.5% of draws never get there."""
    wallclock = load("wallclock")
    group = hand_group(never_fifth=True)
    rows = wallclock.wallclock_rows([group], {group.key: wallclock.Threshold(400, "ref")})
    assert rows[0].reached == (40, 20, np.inf)
    row = wallclock.wallclock_table(rows).splitlines()[2]
    assert "| 400, ref | 40 s [20 s, not reached] | 4,000 |" in row


def test_no_iqm_until_every_seed_has_an_episode() -> None:
    """Seeds 1-4 are at 500 by 40 s, but seed 5 ends its first episode at 45 s: the IQM
    starts there (500, 500, 500 in the middle)."""
    wallclock = load("wallclock")
    curves = wallclock.time_curves(hand_group(late_fifth=True))
    assert np.isnan(wallclock.iqm_curve(curves.rows)[curves.grid < 45]).all()
    assert wallclock.time_to_threshold(curves, 400)[0] == 45


def test_the_iqm_at_the_budget() -> None:
    """At 35 s seeds 1-3 are at 500 and 4-5 at 0: the IQM of (0, 0, 500, 500, 500) is 333;
    a budget past the group's end (60 s) reads its end (every seed at 667), and the table
    says so."""
    wallclock = load("wallclock")
    group = hand_group()
    moment, value, low, high = wallclock.at_budget(group, 35)
    values = np.array([500, 500, 500, 0, 0.0])
    assert (moment, value) == (35, pytest.approx(1000 / 3))
    assert (low, high) == pytest.approx(bootstrap_interval(values, iqm))
    assert wallclock.at_budget(group, 900)[:2] == (60, pytest.approx(2000 / 3))
    rows = wallclock.wallclock_rows([group], {group.key: wallclock.Threshold(800, "ref")})
    row = wallclock.wallclock_table(rows).splitlines()[2]
    assert "| not reached (final IQM 667) | - |" in row
    assert "| 667 [667, 667] (ended at 1 min) |" in row


def test_kept_results_read_the_same_as_the_run_at_every_moment(tmp_path: Path) -> None:
    """An episode that ends 4 ms after a reading's moment (60 s) is not in that reading, in
    the run's own figures and in its kept CSVs read back (kept to 0.01 s, it read as ended
    at 60.00 and counted)."""
    results, wallclock = load("results"), load("wallclock")
    group = hand_group()
    for late in group.curves[:2]:
        late.seconds[-1] = 60.004
    group.wall_s = 60.01
    results.write_results(tmp_path, [group])
    [kept] = results.load_results(tmp_path)
    for moment in (10, 35, 60, 60.01):
        assert wallclock.at_budget(kept, moment)[:2] == wallclock.at_budget(group, moment)[:2]
    # At 60 s seeds 1 and 2 are still at 500 (their third episodes are 4 ms later): the IQM
    # of (500, 500, 667, 667, 667) is 611; with them counted it would be 667.
    assert wallclock.at_budget(kept, 60)[1] == pytest.approx((500 + 2000 / 3 * 2) / 3)
    assert kept.curves[0].seconds[-1] == 60.004
