"""benchmarks/table.py's evaluation column: ``collect --evaluate`` keeps what ``evaluate``
gives for a real run (a short CPU seed group), the same file when run again; ``report`` shows
the evaluation IQM of a hand-made results folder and judges such a group by it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from test_benchmark_table import load

from rl_graphstep import train
from rl_graphstep.evaluate import GroupEvaluation, evaluate
from rl_graphstep.run.aggregate import bootstrap_interval, iqm


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SAC on Pendulum, seeds 1 and 2, 300 steps (one episode each, a checkpoint at 300)."""
    log_dir = tmp_path_factory.mktemp("runs")
    assert train.main(["--env", "Pendulum-v1", "--num-seeds", "2", "--total-timesteps", "300",
                       "--learning-starts", "100", "--batch-size", "16", "--hidden-sizes", "16",
                       "16", "--no-progress", "--device", "cpu", "--log-dir", str(log_dir),
                       "--run-name", "group"]) == 0
    return log_dir / "group"


def test_collect_evaluate_keeps_what_evaluate_gives(group: Path, tmp_path: Path) -> None:
    table = load("table")
    results = tmp_path / "results"
    assert table.main(["collect", str(group), "--results", str(results), "--evaluate",
                       "--device", "cpu"]) == 0
    kept = results / "Pendulum-v1__sac__evaluation.csv"
    expected = evaluate(group, episodes=10, device="cpu", verbose=False)
    assert isinstance(expected, GroupEvaluation) and expected.seeds == (1, 2)
    assert kept.read_text().splitlines() == ["seed,step,episodes,mean,std", *(
        f"{seed},300,10,{expected.of(seed).mean:.2f},{expected.of(seed).std:.2f}"
        for seed in (1, 2))]
    first = kept.read_bytes()
    # Again, and from the seeds' folders given one by one (pooled as collect pools them):
    # the same file.
    assert table.main(["collect", str(group / "seed_2"), str(group / "seed_1"), "--results",
                       str(results), "--evaluate", "--device", "cpu"]) == 0
    assert kept.read_bytes() == first
    assert (results / "Pendulum-v1__sac.csv").exists()  # the training returns beside it


def test_collect_evaluate_of_a_run_without_checkpoint_is_one_line(
        group: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    table = load("table")
    copy = tmp_path / "copy"
    copy.mkdir()
    for event in group.glob("seed_1/*tfevents*"):  # the logs without the checkpoints
        (copy / event.name).write_bytes(event.read_bytes())
    assert table.main(["collect", str(copy), "--results", str(tmp_path / "r"),
                       "--evaluate", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"table.py: error: {copy}: cannot evaluate (") and "\n" not in err


REFERENCES = """algo,task,source,env_id,steps,mean,std,seeds,what,where
crossq,Hopper,simba,Hopper-v4,1000000,350,40,10,evaluation returns,there
sac,Hopper,cleanrl,Hopper-v4,1000000,90,20,3,training returns,docs
"""


def hand_made_results(folder: Path) -> None:
    """CrossQ on Hopper (5 seeds, each one training episode of 100) evaluated at 400 on
    average, and SAC on Hopper (2 seeds) without an evaluation."""
    results = load("results")
    curve = results.SeedCurve
    crossq = results.GroupResult("Hopper-v5", "crossq", [
        curve(seed, np.array([1000]), np.array([100.0])) for seed in range(1, 6)], 1000, 10.0)
    sac = results.GroupResult("Hopper-v5", "sac", [
        curve(seed, np.array([1000]), np.array([value]))
        for seed, value in ((1, 60.0), (2, 100.0))], 1000, 10.0)
    results.write_results(folder, [crossq, sac])
    (folder / "Hopper-v5__crossq__evaluation.csv").write_text(
        "seed,step,episodes,mean,std\n1,1000,10,100.00,1.00\n2,1000,10,200.00,2.00\n"
        "3,1000,10,300.00,3.00\n4,1000,10,400.00,4.00\n5,1000,10,1000.00,5.00\n")


def cells(row: str) -> list[str]:
    return [cell.strip() for cell in row.strip("|").split("|")]


def test_report_gives_the_evaluation_iqm_and_judges_by_it(tmp_path: Path) -> None:
    table = load("table")
    results = tmp_path / "results"
    hand_made_results(results)
    references = tmp_path / "references.csv"
    references.write_text(REFERENCES)
    assert table.main(["report", "--results", str(results), "--references",
                       str(references)]) == 0
    text = (results / "table.md").read_text()
    header, _, crossq, sac = text.splitlines()[:4]
    assert cells(header)[4:7] == ["IQM [95% CI]", "Evaluation IQM [95% CI]",
                                  "Published (mean ± std)"]
    # Evaluation means 100, 200, 300, 400, 1,000: the IQM of five cuts one from each end,
    # (200 + 300 + 400) / 3 = 300; their mean 400 >= 350 - 40, where the training mean of
    # 100 would be out of range.
    low, high = bootstrap_interval([100.0, 200.0, 300.0, 400.0, 1000.0], iqm)
    assert cells(crossq)[:8] == [
        "Hopper-v5", "CROSSQ", "1: 100, 2: 100, 3: 100, 4: 100, 5: 100", "100 ± 0",
        "100 [100, 100]", f"300 [{low:,.0f}, {high:,.0f}]", "simba (Hopper-v4): 350 ± 40",
        "yes (evaluation)"]
    # SAC has no evaluation: judged by its training mean, 80 >= 90 - 20.
    assert cells(sac)[4:8] == ["80 [60, 100]", "-", "CleanRL (Hopper-v4): 90 ± 20", "yes"]
    assert "judged by the mean of the seeds' deterministic evaluations" in text
    assert ("- CROSSQ on Hopper-v5, evaluation: the checkpoint of step 1,000, 10 deterministic "
            "episodes per seed; 1: 100, 2: 200, 3: 300, 4: 400, 5: 1,000; mean 400 ± 316."
            ) in text.splitlines()
    assert (results / "summary.md").read_text().splitlines()[2] == (
        "| Hopper-v5 | 100; eval 300 (350) | 80 (90) |")
    # The task's figure carries the evaluation's point (drawn where matplotlib is installed).
    if importlib.util.find_spec("matplotlib") is not None:
        assert (results / "Hopper.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_an_evaluation_of_other_seeds_is_one_line(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    table = load("table")
    results = tmp_path / "results"
    hand_made_results(results)
    (results / "Hopper-v5__sac__evaluation.csv").write_text(
        "seed,step,episodes,mean,std\n1,1000,10,50.00,1.00\n")
    references = tmp_path / "references.csv"
    references.write_text(REFERENCES)
    assert table.main(["report", "--results", str(results), "--references",
                       str(references)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"table.py: error: {results / 'Hopper-v5__sac__evaluation.csv'}: seeds 1, "
                   "but groups.csv has 1 2; collect the group's runs again with --evaluate, "
                   "or delete the file")


def test_a_32_env_groups_evaluation_is_its_own(tmp_path: Path) -> None:
    """SAC on Hopper in both regimes, only the 32-env group evaluated (means 100, 120, 140,
    kept as ``Hopper-v5__sac-32envs__evaluation.csv``): its row gives the evaluation IQM and
    is judged by it against SAC's reference (120 >= 90 - 20, where its training mean of 40
    would be out of range); the default group's row has none."""
    table, results, evaluations = load("table"), load("results"), load("evaluations")
    curve = results.SeedCurve
    settings = {**dict.fromkeys(results.SETTINGS), "num_envs": 32, "batch_size": 2048,
                "updates_per_step": 4, "learning_starts": 5000}
    parallel = results.GroupResult("Hopper-v5", "sac", [
        curve(seed, np.array([1000]), np.array([40.0])) for seed in (1, 2, 3)], 1000, 10.0,
        settings)
    default = results.GroupResult("Hopper-v5", "sac", [
        curve(seed, np.array([1000]), np.array([value]))
        for seed, value in ((1, 60.0), (2, 100.0))], 1000, 10.0)
    folder = tmp_path / "results"
    results.write_results(folder, [default, parallel])
    kept = evaluations.evaluations_file(folder, "Hopper-v5", parallel.name)
    assert kept == folder / "Hopper-v5__sac-32envs__evaluation.csv"
    kept.write_text("seed,step,episodes,mean,std\n1,1000,10,100.00,1.00\n"
                    "2,1000,10,120.00,2.00\n3,1000,10,140.00,3.00\n")
    found = evaluations.load_evaluations(folder, results.load_results(folder))
    assert list(found) == [("Hopper-v5", "sac-32envs")]
    references = tmp_path / "references.csv"
    references.write_text(REFERENCES)
    assert table.main(["report", "--results", str(folder), "--references",
                       str(references)]) == 0
    text = (folder / "table.md").read_text()
    sac, many = text.splitlines()[2:4]
    low, high = bootstrap_interval([100.0, 120.0, 140.0], iqm)
    assert cells(many)[:8] == [
        "Hopper-v5", "SAC, 32 envs", "1: 40, 2: 40, 3: 40", "40 ± 0", "40 [40, 40]",
        f"120 [{low:,.0f}, {high:,.0f}]", "CleanRL (Hopper-v4): 90 ± 20", "yes (evaluation)"]
    assert cells(sac)[:8] == ["Hopper-v5", "SAC", "1: 60, 2: 100", "80 ± 20", "80 [60, 100]",
                              "-", "CleanRL (Hopper-v4): 90 ± 20", "yes"]
    assert ("- SAC, 32 envs on Hopper-v5, evaluation: the checkpoint of step 1,000, 10 "
            "deterministic episodes per seed; 1: 100, 2: 120, 3: 140; mean 120 ± 16."
            ) in text.splitlines()
    assert (folder / "summary.md").read_text().splitlines() == [
        "| Task | SAC | SAC, 32 envs |", "|---|---:|---:|",
        "| Hopper-v5 | 80 (90) | 40; eval 120 (90) |"]
