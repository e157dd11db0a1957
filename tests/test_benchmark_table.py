"""benchmarks/table.py: run folders -> the kept CSVs -> the table (numbers checked against
hand-computed ones), a figure per task and one across tasks, rebuilt from the CSVs alone;
and its one-line errors."""

from __future__ import annotations

import importlib
import os
import platform
import shutil
import sys
import time
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch
from torch.utils.tensorboard import SummaryWriter

from rl_graphstep import train
from rl_graphstep.run.aggregate import bootstrap_interval, iqm

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
REFERENCES = """algo,task,source,env_id,steps,mean,std,seeds,what,where
td3,HalfCheetah,cleanrl,HalfCheetah-v4,1000000,1000,100,3,"training returns, 3 seeds",docs
td3,HalfCheetah,td3_paper,HalfCheetah-v1,1000000,9000,,10,max of evaluations,paper
sac,Hopper,cleanrl,Hopper-v4,1000000,3000,200,3,training returns,docs
"""


def load(name: str) -> ModuleType:
    """Import a benchmarks/ script (benchmarks/ is not a package; its scripts import each
    other as modules of their folder)."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    return importlib.import_module(name)


# The project's imports and the benchmarks': a folder of benchmarks/ with one of these names
# would be imported as that package (a namespace package) wherever it is not installed.
PACKAGES = {"gymnasium", "matplotlib", "mujoco", "numpy", "optuna", "ray", "rl_graphstep",
            "scipy", "tensorboard", "torch", "tqdm", "yaml"}


def test_no_folder_of_benchmarks_passes_for_a_package() -> None:
    """load() puts benchmarks/ on sys.path: a results folder named ``mujoco`` there made
    gymnasium import it as MuJoCo on a machine without MuJoCo."""
    folders = {path.name for path in BENCHMARKS.iterdir() if path.is_dir()}
    assert not folders & PACKAGES
    assert load("table").DEFAULT_RESULTS.name not in PACKAGES


def config_table(env_id: str, algo: str, seed: int) -> str:
    return (f"| key | value |\n|---|---|\n| env_id | {env_id} |\n| algo | {algo} |\n"
            f"| seed | {seed} |")


def write_run(run_dir: Path, env_id: str, algo: str, seed: int,
              episodes: list[tuple[int, float]], seconds: float,
              settings: dict[str, int] | None = None) -> None:
    """A single-seed run's event file: its config (with ``settings``) and episodes, the last
    ``seconds`` after the file was opened."""
    writer = SummaryWriter(str(run_dir))
    start = time.time()
    extra = "".join(f"\n| {key} | {value} |" for key, value in (settings or {}).items())
    writer.add_text("hyperparameters", config_table(env_id, algo, seed) + extra)
    for i, (step, value) in enumerate(episodes):
        at = start + seconds * (i + 1) / len(episodes)
        writer.add_scalar("charts/episodic_return", value, step, walltime=at)
    writer.close()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A real seed group (SAC on Pendulum, seeds 1 and 2), and TD3 on HalfCheetah as three
    single-seed runs with chosen returns and wall times; seed 3's run was resumed (two event
    files of 40 s each)."""
    log_dir = tmp_path_factory.mktemp("runs")
    assert train.main(["--env", "Pendulum-v1", "--num-seeds", "2", "--total-timesteps", "600",
                       "--learning-starts", "100", "--batch-size", "16", "--hidden-sizes", "16",
                       "16", "--log-interval", "100", "--no-progress", "--device", "cpu",
                       "--log-dir", str(log_dir), "--run-name", "group"]) == 0
    steps = [1000 * (i + 1) for i in range(12)]
    for seed, level in ((1, 900.0), (2, 1100.0)):
        write_run(log_dir / f"td3_{seed}", "HalfCheetah-v5", "td3", seed,
                  [(s, level + i) for i, s in enumerate(steps)], 100.0)
    write_run(log_dir / "td3_3", "HalfCheetah-v5", "td3", 3,
              [(s, 2000.0) for s in steps[:6]], 40.0)
    write_run(log_dir / "td3_3", "HalfCheetah-v5", "td3", 3,
              [(s, 2000.0) for s in steps[6:]], 40.0)
    references = log_dir / "references.csv"
    references.write_text(REFERENCES)
    return {"group": log_dir / "group", "td3": log_dir, "references": references}


def test_collect_keeps_each_seeds_returns_and_the_groups_cost(runs: dict[str, Path],
                                                              tmp_path: Path) -> None:
    table = load("table")
    results = tmp_path / "results"
    paths = [runs["group"], *(runs["td3"] / f"td3_{s}" for s in (3, 1, 2))]
    assert table.main(["collect", *map(str, paths), "--results", str(results)]) == 0
    groups = {g.key: g for g in load("results").load_results(results)}
    assert set(groups) == {("Pendulum-v1", "sac"), ("HalfCheetah-v5", "td3")}
    td3 = groups[("HalfCheetah-v5", "td3")]
    assert td3.seeds == [1, 2, 3] and td3.steps == 12_000
    assert td3.wall_s == pytest.approx(100 + 100 + 40 + 40, abs=2)
    assert td3.env_steps_per_s == pytest.approx(3 * 12_000 / td3.wall_s)
    np.testing.assert_allclose(td3.finals(), [900 + 6.5, 1100 + 6.5, 2000])  # last 10 of 12
    sac = groups[("Pendulum-v1", "sac")]
    assert sac.seeds == [1, 2] and sac.steps == 600
    assert [list(c.steps) for c in sac.curves] == [[200, 400, 600]] * 2
    assert 0 < sac.wall_s < 300


def test_episodes_that_end_at_one_step_are_each_kept(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Three envs per seed on Pendulum end their 200-step episodes together: every one of a
    seed's nine episodes is read back (three at each of steps 600, 1,200 and 1,800, the
    seed's env steps), and its last-10 mean is the one the run itself printed. Keyed by
    step, the reader kept one episode in three."""
    summary = train.train(train.load_config([
        "--env", "Pendulum-v1", "--num-seeds", "2", "--num-envs", "3",
        "--total-timesteps", "1800", "--learning-starts", "300", "--batch-size", "16",
        "--hidden-sizes", "16", "16", "--no-progress", "--device", "cpu",
        "--log-dir", str(tmp_path), "--run-name", "group"]))
    assert summary["episodes"] == 2 * 9
    group = load("runfolders").read_group(tmp_path / "group")
    for curve, recent in zip(group.curves, summary["recent_returns"], strict=True):
        assert list(curve.steps) == [600] * 3 + [1200] * 3 + [1800] * 3
        np.testing.assert_allclose(curve.returns, recent[-9:], rtol=1e-6)  # float32 in logs
    np.testing.assert_allclose(group.finals(), [np.mean(r) for r in summary["recent_returns"]],
                               rtol=1e-6)

    # A reader that keeps one episode per step disagrees with the run's own aggregate curve:
    # the folder is refused in one line, not turned into a table.
    runfolders = load("runfolders")
    monkeypatch.setattr(runfolders, "logged", lambda events, tag: list(
        {event.step: event for event in events.Scalars(tag)}.values()))
    with pytest.raises(runfolders.ResultsError, match=r"group: at step \d+ the episodes read "
                       r"back give a mean .* where the run logged .*: episodes were lost"):
        runfolders.read_group(tmp_path / "group")


def test_report_builds_the_table_and_figures_from_the_csvs_alone(runs: dict[str, Path],
                                                                 tmp_path: Path) -> None:
    table = load("table")
    copies = tmp_path / "runs"
    shutil.copytree(runs["td3"], copies)
    results = tmp_path / "results"
    assert table.main(["collect", str(copies / "group"),
                       *(str(copies / f"td3_{s}") for s in (1, 2, 3)),
                       "--results", str(results)]) == 0
    shutil.rmtree(copies)  # the report needs the kept CSVs only
    assert table.main(["report", "--results", str(results), "--references",
                       str(runs["references"])]) == 0
    rows = (results / "table.md").read_text().splitlines()
    (td3,) = [row for row in rows if "| TD3 |" in row]
    finals = np.array([906.5, 1106.5, 2000.0])
    low, high = bootstrap_interval(finals, iqm)
    cells = [cell.strip() for cell in td3.strip("|").split("|")]
    assert cells[:6] == [
        "HalfCheetah-v5", "TD3", "1: 906, 2: 1,106, 3: 2,000",
        f"{finals.mean():,.0f} ± {finals.std():,.0f}",
        f"{iqm(finals):,.0f} [{low:,.0f}, {high:,.0f}]",
        "CleanRL (HalfCheetah-v4): 1,000 ± 100<br>TD3 paper (HalfCheetah-v1): 9,000",
    ]
    assert cells[6] == "yes"  # mean 1,338 >= 1,000 - 100, against the first reference
    (sac,) = [row for row in rows if "| SAC |" in row]
    assert "| none found | - |" in sac  # no Pendulum reference
    assert (results / "summary.md").read_text().splitlines() == [
        "| Task | SAC | TD3 |", "|---|---:|---:|",
        "| HalfCheetah-v5 |  | 1,338 (1,000) |",
        f"| Pendulum-v1 | {iqm(load('results').load_results(results)[1].finals()):,.0f} |  |"]
    # The wall-clock table: TD3's runs recorded no launch (times at an even pace); the
    # Pendulum group did, and has no reference to be timed to.
    clock = (results / "wallclock.md").read_text().splitlines()
    (td3,) = [row for row in clock if "| TD3 |" in row]
    assert "| 1,000, CleanRL (HalfCheetah-v4) | ≈ " in td3
    assert td3.endswith("| - | even pace (estimated) |")
    (sac,) = [row for row in clock if "| SAC |" in row]
    assert "| none found | - | - |" in sac and sac.endswith("| since launch |")
    assert "≈ *Estimated from an even pace*" in "\n".join(clock)
    assert (results / "wallclock_summary.md").read_text().startswith("| Task | Algorithm |")
    for name in ("HalfCheetah.png", "Pendulum.png", "aggregate.png", "HalfCheetah_wallclock.png",
                 "Pendulum_wallclock.png"):
        assert (results / name).read_bytes().startswith(PNG_SIGNATURE), name


def test_each_row_says_what_ran_it(runs: dict[str, Path], tmp_path: Path) -> None:
    """The trained group recorded its machine, the hand-written TD3 runs none; groups.csv
    keeps it, and a groups.csv from before the column reads as not recorded."""
    table = load("table")
    results = tmp_path / "results"
    paths = [runs["group"], *(runs["td3"] / f"td3_{s}" for s in (1, 2, 3))]
    assert table.main(["collect", *map(str, paths), "--results", str(results)]) == 0
    groups = {g.key: g for g in load("results").load_results(results)}
    host = f"{os.cpu_count()} CPUs ({platform.machine()})"
    assert groups[("Pendulum-v1", "sac")].machine == f"CPU; {host}; torch {torch.__version__}"
    assert groups[("HalfCheetah-v5", "td3")].machine == ""
    assert table.main(["report", "--results", str(results), "--references",
                       str(runs["references"])]) == 0
    rows = (results / "table.md").read_text().splitlines()
    assert rows[0].endswith("| Env steps/s | Machine |")
    (sac,) = [row for row in rows if "| SAC |" in row]
    (td3,) = [row for row in rows if "| TD3 |" in row]
    assert sac.endswith(f"| CPU; {host}; torch {torch.__version__} |")
    assert td3.endswith("| not recorded |")
    csv_file = results / "groups.csv"
    lines = csv_file.read_text().splitlines()
    assert lines[0].endswith(",timed_from,machine")
    csv_file.write_text("\n".join([lines[0].removesuffix(",machine"),
                                    *(line.rsplit(",", 1)[0] for line in lines[1:])]) + "\n")
    assert {g.machine for g in load("results").load_results(results)} == {""}


def test_the_normalised_scores_divide_by_the_first_reference(runs: dict[str, Path],
                                                             tmp_path: Path) -> None:
    table, results, runfolders = load("table"), load("results"), load("runfolders")
    groups = results.pool(runfolders.read_group(runs["td3"] / f"td3_{s}") for s in (1, 2, 3))
    scores = table.normalised_scores(groups, table.read_references(runs["references"]))
    np.testing.assert_allclose(scores["TD3"][0], np.array([906.5, 1106.5, 2000.0]) / 1000)
    grid, rows = table.smoothed_curves(groups[0])
    assert rows.shape == (3, table.CURVE_POINTS)
    # Seed 1's trailing mean of 10 at its last episode: returns 902..911.
    assert rows[0, -1] == pytest.approx(906.5) and grid[-1] == 12_000


def test_a_resumed_group_of_several_envs_reads_as_the_straight_run(tmp_path: Path) -> None:
    """Three envs per seed, stopped after 1,800 steps and resumed from the step-600
    checkpoint, as after a crash: the episodes the first process logged past step 600 are
    replaced, not doubled, and every seed reads as the same run made straight."""
    args = ["--env", "Pendulum-v1", "--num-seeds", "2", "--num-envs", "3",
            "--learning-starts", "300", "--batch-size", "16", "--hidden-sizes", "16", "16",
            "--log-interval", "300", "--no-progress", "--device", "cpu", "--save-buffer",
            "--log-dir", str(tmp_path)]
    train.train(train.load_config([*args, "--total-timesteps", "1800", "--run-name",
                                   "straight"]))
    train.train(train.load_config([*args, "--total-timesteps", "1800", "--run-name",
                                   "resumed", "--checkpoint-every", "600"]))
    first = min((tmp_path / "resumed" / "checkpoints").glob("step_*.pt"))
    assert first.name == "step_000000000600.pt"
    time.sleep(1.0)  # event files sort by the second they were made in
    assert train.main(["--resume", str(first)]) == 0
    runfolders = load("runfolders")
    straight = runfolders.read_group(tmp_path / "straight")
    resumed = runfolders.read_group(tmp_path / "resumed")  # checked against its aggregate
    for a, b in zip(straight.curves, resumed.curves, strict=True):
        assert list(a.steps) == list(b.steps) == [600] * 3 + [1200] * 3 + [1800] * 3
        np.testing.assert_array_equal(a.returns, b.returns)


def test_the_curve_at_a_step_of_several_episodes_is_the_mean_after_them_all() -> None:
    """Episodes of 1, 2, 6 and 3 at steps 100, 200, 200 and 300: the trailing means are 1,
    1.5, 3 and 3, and the curve at step 200 is the 3 after both of its episodes."""
    results = load("results")
    curve = results.SeedCurve(1, np.array([100, 200, 200, 300]), np.array([1.0, 2.0, 6.0, 3.0]))
    group = results.GroupResult("Pendulum-v1", "sac", [curve], 300, 10.0, {})
    grid, rows = load("table").smoothed_curves(group, points=5)
    np.testing.assert_allclose(grid, [100, 150, 200, 250, 300])
    np.testing.assert_allclose(rows[0], [1.0, 2.0, 3.0, 3.0, 3.0])


@pytest.mark.parametrize(("setup", "message"), [
    ("empty", "no tensorboard event files in this folder"),
    ("twice", "TD3 on HalfCheetah-v5: seed 1 appears in two runs; give each seed once"),
])
def test_a_run_that_cannot_be_read_is_one_line(runs: dict[str, Path], tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str], setup: str,
                                               message: str) -> None:
    table = load("table")
    if setup == "empty":
        (tmp_path / "empty").mkdir()
        paths = [tmp_path / "empty"]
    else:
        paths = [runs["td3"] / "td3_1", runs["td3"] / "td3_1"]
    assert table.main(["collect", *map(str, paths), "--results", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("table.py: error: ") and err.endswith(message) and "\n" not in err


def write_group(folder: Path, env_id: str, algo: str, finals: dict[int, float],
                settings: dict[str, int], steps: int, seconds: float) -> None:
    """A seed group's folder by hand: each seed's run (its config with ``settings``) with 10
    episodes of return ``finals[seed]`` up to ``steps``, and the aggregate run whose events
    span ``seconds`` (the group's wall time)."""
    extra = "".join(f"\n| {key} | {value} |" for key, value in settings.items())
    for seed, level in finals.items():
        writer = SummaryWriter(str(folder / f"seed_{seed}"))
        writer.add_text("hyperparameters", config_table(env_id, algo, seed) + extra)
        for i in range(10):
            writer.add_scalar("charts/episodic_return", level, steps * (i + 1) // 10)
        writer.close()
    writer = SummaryWriter(str(folder / "aggregate"))
    start = time.time()
    writer.add_scalar("charts/SPS", 0.0, 0, walltime=start)
    writer.add_scalar("charts/SPS", 0.0, steps, walltime=start + seconds)
    writer.close()


def test_a_ppo_group_is_judged_against_ppos_references(tmp_path: Path) -> None:
    """PPO and SAC on HalfCheetah, against the shipped references.csv: each group's row cites
    its own algorithm's references (PPO: CleanRL's ppo_continuous_action, 1,442.64 ± 46.03),
    the wall-clock table times each to its own, and PPO's gradient samples count its epochs
    over its rollouts (its config table also lists the off-policy settings, at their defaults,
    which groups.csv leaves out)."""
    table, results = load("table"), load("results")
    # Every run's config table lists every algorithm's settings.
    settings = {"num_envs": 1, "batch_size": 256, "updates_per_step": 1,
                "learning_starts": 5000, "num_steps": 2048, "num_minibatches": 32,
                "update_epochs": 10}
    # 50 rollouts of 1 env x 2,048 steps, 10 epochs of 32 minibatches each, 3 seeds, 100 s.
    write_group(tmp_path / "ppo", "HalfCheetah-v5", "ppo", {1: 1500.0, 2: 1400.0, 3: 1380.0},
                settings, 102_400, 100.0)
    write_group(tmp_path / "sac", "HalfCheetah-v5", "sac", {1: 9000.0, 2: 9500.0},
                settings, 102_400, 100.0)
    out = tmp_path / "results"
    assert table.main(["collect", str(tmp_path / "ppo"), str(tmp_path / "sac"),
                       "--results", str(out)]) == 0
    groups = {g.algo: g for g in results.load_results(out)}
    assert groups["ppo"].updates_per_seed == 50 * 10 * 32
    assert groups["ppo"].gradient_samples == 3 * 50 * 10 * 2048  # minibatches of 64 rows
    # The off-policy count: (102,400 - 5,000) iterations x 256 rows, for 2 seeds.
    assert groups["sac"].gradient_samples == 2 * 97_400 * 256
    assert table.main(["report", "--results", str(out), "--references",
                       str(table.DEFAULT_REFERENCES)]) == 0

    def cells(name: str, algo: str) -> list[str]:
        (row,) = [r for r in (out / name).read_text().splitlines() if f"| {algo} |" in r]
        return [cell.strip() for cell in row.strip("|").split("|")]

    ppo = cells("table.md", "PPO")
    assert ppo[5] == "CleanRL (HalfCheetah-v4): 1,443 ± 46"
    # Within range of PPO's: a mean of 1,427 >= 1,442.64 - 46.03 (SAC's would say no).
    assert ppo[6] == "yes"
    sac = cells("table.md", "SAC")
    assert sac[5].startswith("CleanRL (HalfCheetah-v2): 9,635 ± 1,424<br>SB3 zoo")
    clock = cells("wallclock.md", "PPO")
    assert clock[3] == "1,443, CleanRL (HalfCheetah-v4)"
    assert clock[9] == f"{3 * 50 * 10 * 2048 / 100 / 1e6:,.2f} M"  # 0.31 M rows/s
    assert cells("wallclock.md", "SAC")[3] == "9,635, CleanRL (HalfCheetah-v2)"
    # The IQM of three seeds keeps them all: their mean.
    assert (out / "summary.md").read_text().splitlines()[2] == (
        "| HalfCheetah-v5 | 1,427 (1,443) | 9,250 (9,635) |")
    # groups.csv keeps the settings each algorithm reads.
    assert groups["ppo"].settings == {"num_envs": 1, "batch_size": None,
                                      "updates_per_step": None, "learning_starts": None,
                                      "num_steps": 2048, "num_minibatches": 32,
                                      "update_epochs": 10}


# SAC's settings in its two regimes: configs/sac_mujoco.yaml's one env per seed, and
# configs/sac_mujoco_parallel.yaml's 32 envs per seed with 4 updates of 2,048 rows per step.
DEFAULT_SAC = {"num_envs": 1, "batch_size": 256, "updates_per_step": 1, "learning_starts": 5000}
PARALLEL_SAC = {"num_envs": 32, "batch_size": 2048, "updates_per_step": 4,
                "learning_starts": 5000}


def row_cells(path: Path, label: str) -> list[str]:
    """The cells of the one row of a Markdown table whose second cell is ``label``."""
    (row,) = [r for r in path.read_text().splitlines() if f"| {label} |" in r]
    return [cell.strip() for cell in row.strip("|").split("|")]


def test_a_32_env_group_sits_beside_the_default_group_of_its_task(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """SAC on Humanoid-v5 in both regimes, against the shipped references.csv (SAC's first,
    CleanRL's 4,996.29 ± 686.40): two groups, two returns files, two rows of groups.csv; each
    row labelled by its regime and judged against SAC's reference; one summary column each.
    Collecting the 32-env group again replaces its own row only."""
    table, results = load("table"), load("results")
    write_group(tmp_path / "sac_humanoid", "Humanoid-v5", "sac",
                {1: 4500.0, 2: 4800.0, 3: 5200.0}, DEFAULT_SAC, 102_400, 100.0)
    write_group(tmp_path / "sac_humanoid_parallel", "Humanoid-v5", "sac",
                {1: 3000.0, 2: 3500.0}, PARALLEL_SAC, 102_400, 50.0)
    out = tmp_path / "results"
    assert table.main(["collect", str(tmp_path / "sac_humanoid"),
                       str(tmp_path / "sac_humanoid_parallel"), "--results", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "SAC on Humanoid-v5: seeds [1, 2, 3], 102,400 steps each" in printed
    assert "SAC, 32 envs on Humanoid-v5: seeds [1, 2], 102,400 steps each" in printed
    assert (out / "Humanoid-v5__sac.csv").exists()
    assert (out / "Humanoid-v5__sac-32envs.csv").exists()
    rows = (out / "groups.csv").read_text().splitlines()
    cells = [row.split(",")[:7] for row in rows[1:]]
    assert [cell[:4] + cell[5:] for cell in cells] == [
        ["Humanoid-v5", "sac", "1 2 3", "102400", "3072", "1"],
        ["Humanoid-v5", "sac", "1 2", "102400", "4096", "32"]]
    assert [float(cell[4]) for cell in cells] == [pytest.approx(100.0, abs=1e-3),
                                                  pytest.approx(50.0, abs=1e-3)]
    loaded = results.load_results(out)
    assert [(g.key, g.variant, g.name, g.label) for g in loaded] == [
        (("Humanoid-v5", "sac"), "", "sac", "SAC"),
        (("Humanoid-v5", "sac-32envs"), "32envs", "sac-32envs", "SAC, 32 envs")]
    default, parallel = loaded
    assert default.seeds == [1, 2, 3] and parallel.seeds == [1, 2]
    np.testing.assert_allclose(parallel.finals(), [3000.0, 3500.0])
    # (102,400 - 5,000) // 32 = 3,043 vector steps of 4 updates of 2,048 rows, for 2 seeds.
    assert parallel.gradient_samples == 2 * 3043 * 4 * 2048
    assert default.gradient_samples == 3 * 97_400 * 256

    # Collected again alone, the 32-env group replaces its own row, never the default's.
    assert table.main(["collect", str(tmp_path / "sac_humanoid_parallel"),
                       "--results", str(out)]) == 0
    assert [g.key for g in results.load_results(out)] == [("Humanoid-v5", "sac"),
                                                         ("Humanoid-v5", "sac-32envs")]

    assert table.main(["report", "--results", str(out), "--references",
                       str(table.DEFAULT_REFERENCES)]) == 0
    published = "CleanRL (Humanoid-v4): 4,996 ± 686<br>SB3 zoo (Humanoid-v3): 6,232 ± 280"
    low, high = bootstrap_interval(np.array([4500.0, 4800.0, 5200.0]), iqm)
    assert row_cells(out / "table.md", "SAC")[:9] == [
        "Humanoid-v5", "SAC", "1: 4,500, 2: 4,800, 3: 5,200", "4,833 ± 287",
        f"4,833 [{low:,.0f}, {high:,.0f}]", published, "yes",  # 4,833 >= 4,996 - 686
        "2 min", "3,072"]
    low, high = bootstrap_interval(np.array([3000.0, 3500.0]), iqm)
    assert row_cells(out / "table.md", "SAC, 32 envs")[:9] == [
        "Humanoid-v5", "SAC, 32 envs", "1: 3,000, 2: 3,500", "3,250 ± 250",
        f"3,250 [{low:,.0f}, {high:,.0f}]", published, "**no**",  # 3,250 < 4,996 - 686
        "50 s", "4,096"]
    lines = (out / "table.md").read_text().splitlines()
    assert lines[2].startswith("| Humanoid-v5 | SAC |")  # by name: sac, then sac-32envs
    assert lines[3].startswith("| Humanoid-v5 | SAC, 32 envs |")
    assert (out / "summary.md").read_text().splitlines() == [
        "| Task | SAC | SAC, 32 envs |", "|---|---:|---:|",
        "| Humanoid-v5 | 4,833 (4,996) | 3,250 (4,996) |"]
    assert row_cells(out / "wallclock.md", "SAC")[:4] == [
        "Humanoid-v5", "SAC", "3", "4,996, CleanRL (Humanoid-v4)"]
    clock = row_cells(out / "wallclock.md", "SAC, 32 envs")
    assert clock[:4] == ["Humanoid-v5", "SAC, 32 envs", "2", "4,996, CleanRL (Humanoid-v4)"]
    assert clock[9] == f"{2 * 3043 * 4 * 2048 / 50 / 1e6:,.2f} M"  # 1.00 M rows/s
    assert row_cells(out / "wallclock.md", "SAC")[9] == f"{3 * 97_400 * 256 / 100 / 1e6:,.2f} M"
    assert [row_cells(out / "wallclock_summary.md", label)[:3] for label in (
        "SAC", "SAC, 32 envs")] == [["Humanoid-v5", "SAC", "4,996"],
                                    ["Humanoid-v5", "SAC, 32 envs", "4,996"]]
    scores = table.normalised_scores(loaded, table.read_references(table.DEFAULT_REFERENCES))
    assert sorted(scores) == ["SAC", "SAC, 32 envs"]
    np.testing.assert_allclose(scores["SAC, 32 envs"][0], np.array([3000, 3500]) / 4996.29)
    for name in ("Humanoid.png", "Humanoid_wallclock.png", "aggregate.png"):
        assert (out / name).read_bytes().startswith(PNG_SIGNATURE), name


def test_only_off_policy_groups_of_several_envs_per_seed_are_a_variant() -> None:
    """PPO's envs are part of its rollouts (4 for the classic tasks): no variant. One env
    per seed, or envs not recorded (results from before the settings were kept): none."""
    results = load("results")
    curves = [results.SeedCurve(1, np.array([1000]), np.array([500.0]))]

    def group(algo: str, num_envs: int | None) -> object:
        settings = {**dict.fromkeys(results.SETTINGS), "num_envs": num_envs}
        return results.GroupResult("CartPole-v1", algo, curves, 1000, 10.0, settings)

    ppo = group("ppo", 4)
    assert (ppo.variant, ppo.name, ppo.label, ppo.key) == ("", "ppo", "PPO",
                                                           ("CartPole-v1", "ppo"))
    for num_envs in (1, None):
        sac = group("sac", num_envs)
        assert (sac.variant, sac.name, sac.label) == ("", "sac", "SAC")
    td3 = group("td3", 8)
    assert (td3.variant, td3.name, td3.label) == ("8envs", "td3-8envs", "TD3, 8 envs")
    assert results.returns_file(Path("r"), "CartPole-v1", ppo.name) == Path(
        "r/CartPole-v1__ppo.csv")


def test_runs_of_two_regimes_are_never_pooled(tmp_path: Path) -> None:
    """Single-seed SAC runs of Humanoid-v5: seeds 1 and 2 with one env, seed 1 with 32. The
    two seed 1s are of different groups, not a clash; two 32-env seed 1s are, named by the
    group's label."""
    results = load("results")
    for folder, seed, settings, level in (("one_1", 1, DEFAULT_SAC, 5000.0),
                                          ("one_2", 2, DEFAULT_SAC, 5100.0),
                                          ("many_1", 1, PARALLEL_SAC, 3000.0)):
        write_run(tmp_path / folder, "Humanoid-v5", "sac", seed,
                  [(1000 * (i + 1), level) for i in range(10)], 10.0, settings)
    pooled = results.pool(load("runfolders").read_group(tmp_path / name)
                          for name in ("one_1", "many_1", "one_2"))
    assert [(g.key, g.label, g.seeds) for g in pooled] == [
        (("Humanoid-v5", "sac"), "SAC", [1, 2]),
        (("Humanoid-v5", "sac-32envs"), "SAC, 32 envs", [1])]
    np.testing.assert_allclose(pooled[0].finals(), [5000.0, 5100.0])
    np.testing.assert_allclose(pooled[1].finals(), [3000.0])
    assert pooled[0].wall_s == pytest.approx(20, abs=2)  # the two 1-env runs only
    with pytest.raises(results.ResultsError) as error:
        results.pool(load("runfolders").read_group(tmp_path / "many_1") for _ in range(2))
    assert str(error.value) == ("SAC, 32 envs on Humanoid-v5: seed 1 appears in two runs; "
                                "give each seed once")
