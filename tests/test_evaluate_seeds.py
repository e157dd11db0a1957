"""Evaluating a seed group: every seed's actor in one table, one seed alone (``--group-seed``
or its seed folder), each seed exactly what a single run with its weights gives, seeds kept
apart to the bit, and one line for a seed that is not the group's."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from rl_graphstep import train
from rl_graphstep.evaluate import EvaluationResult, GroupEvaluation, evaluate, main
from rl_graphstep.run.aggregate import bootstrap_interval, iqm
from rl_graphstep.run.checkpoint import find_checkpoint, load_checkpoint, save_checkpoint

SEEDS = (3, 4)  # seeds that are not indices, and not the episodes' seed
EPISODES = 2
TINY = ["--env", "Pendulum-v1", "--seed", "3", "--num-seeds", "2", "--total-timesteps", "300",
        "--learning-starts", "100", "--batch-size", "16", "--hidden-sizes", "16", "16",
        "--log-interval", "100", "--no-progress", "--device", "cpu"]


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A trained group of seeds 3 and 4 (a few updates each, so their actors differ)."""
    log_dir = tmp_path_factory.mktemp("runs")
    assert train.main([*TINY, "--log-dir", str(log_dir), "--run-name", "group"]) == 0
    return log_dir / "group"


@pytest.fixture(scope="module")
def whole(group: Path) -> GroupEvaluation:
    result = evaluate(group, episodes=EPISODES, device="cpu", verbose=False)
    assert isinstance(result, GroupEvaluation)
    return result


def single_run_of(group: Path, k: int, run_dir: Path) -> Path:
    """A single run's checkpoint of the group's k-th seed: its config with that seed alone,
    and the actor weights sliced out of the stacked ones by hand (index k of every
    ``stacked.`` tensor), not through the code under test."""
    state = load_checkpoint(find_checkpoint(group))
    config = dict(state["config"], seed=SEEDS[k], num_seeds=1, seeds=None)
    actor = {name.removeprefix("stacked."): tensor[k].clone()
             for name, tensor in state["agent"]["actor"].items()}
    assert all(name.startswith("stacked.") for name in state["agent"]["actor"])
    single = {**state, "config": config, "agent": {"actor": actor}, "buffer": None}
    save_checkpoint(run_dir, state["global_step"], single, keep=1)
    return run_dir


def test_a_group_evaluates_every_seed(whole: GroupEvaluation) -> None:
    assert whole.seeds == SEEDS and len(whole.results) == 2
    assert all(isinstance(r, EvaluationResult) and len(r.returns) == EPISODES
               for r in whole.results)
    # Each seed's episodes are the same starts (seed + i), so trained actors that differ
    # give different returns.
    assert whole.results[0].returns != whole.results[1].returns
    means = [r.mean for r in whole.results]
    assert whole.mean == pytest.approx(np.mean(means)) and whole.min == min(means)
    assert whole.iqm == pytest.approx(iqm(means))
    assert (whole.iqm_low, whole.iqm_high) == bootstrap_interval(means)
    assert whole.of(4) is whole.results[1]


@pytest.mark.parametrize("k", [0, 1])
def test_each_seed_is_a_single_run_of_its_weights(group: Path, whole: GroupEvaluation,
                                                  tmp_path: Path, k: int) -> None:
    single = evaluate(single_run_of(group, k, tmp_path / f"seed{k}"), episodes=EPISODES,
                      device="cpu", verbose=False)
    assert single == whole.results[k]  # to the bit: the same returns, float for float


def test_one_seed_alone(group: Path, whole: GroupEvaluation) -> None:
    by_flag = evaluate(group, episodes=EPISODES, device="cpu", verbose=False, group_seed=4)
    by_folder = evaluate(group / "seed_4", episodes=EPISODES, device="cpu", verbose=False)
    file = find_checkpoint(group)
    by_file = evaluate(file, episodes=EPISODES, device="cpu", verbose=False, group_seed=4)
    assert by_flag == by_folder == by_file == whole.results[1]


def test_changing_one_seed_changes_no_other(group: Path, whole: GroupEvaluation,
                                            tmp_path: Path) -> None:
    changed = tmp_path / "changed"
    shutil.copytree(group / "checkpoints", changed / "checkpoints")
    file = find_checkpoint(changed)
    state = torch.load(file, weights_only=False)
    actor = copy.deepcopy(state["agent"]["actor"])
    for tensor in actor.values():
        tensor[0].add_(0.5)  # seed 3's weights only
    state["agent"]["actor"] = actor
    torch.save(state, file)
    result = evaluate(changed, episodes=EPISODES, device="cpu", verbose=False)
    assert result.results[1] == whole.results[1]
    assert result.results[0].returns != whole.results[0].returns


def test_the_cli_prints_one_table(group: Path, whole: GroupEvaluation,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(group), "--episodes", str(EPISODES), "--device", "cpu"]) == 0
    out, err = capsys.readouterr()
    (r3, r4), step = whole.results, load_checkpoint(find_checkpoint(group))["global_step"]
    means, stds = [f"{r.mean:.1f}" for r in (r3, r4)], [f"{r.std:.1f}" for r in (r3, r4)]
    m, s = max(map(len, means)), max(map(len, stds))
    assert out.splitlines() == [
        f"Pendulum-v1, sac, step {step}, seeds 3-4: {EPISODES} episodes per seed",
        " seed  mean return",
        f"    3  {means[0]:>{m}} ± {stds[0]:>{s}}",
        f"    4  {means[1]:>{m}} ± {stds[1]:>{s}}",
        f"group  mean {whole.mean:.1f}, IQM {whole.iqm:.1f} "
        f"[95% {whole.iqm_low:.1f}, {whole.iqm_high:.1f}]",
    ]
    assert err == ""


def test_the_cli_on_one_seed_prints_the_single_run_line(
        group: Path, whole: GroupEvaluation, capsys: pytest.CaptureFixture[str]) -> None:
    r = whole.results[0]
    step = load_checkpoint(find_checkpoint(group))["global_step"]
    line = (f"Pendulum-v1, sac, seed 3, step {step}: mean return {r.mean:.1f} ± {r.std:.1f} "
            f"over {EPISODES} episodes\n")
    for args in (["--group-seed", "3", str(group)], [str(group / "seed_3")]):
        assert main([*args, "--episodes", str(EPISODES), "--device", "cpu"]) == 0
        assert capsys.readouterr() == (line, "")


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("error: ")
    return err.strip()


def test_a_seed_not_in_the_group(group: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = find_checkpoint(group)
    assert main([str(group), "--group-seed", "5", "--device", "cpu"]) == 2
    assert one_error_line(capsys) == (f"error: --group-seed 5: seed 5 is not in the group of "
                                      f"checkpoint {file}, whose seeds are 3, 4")
    assert main([str(group / "seed_7"), "--device", "cpu"]) == 2
    assert one_error_line(capsys) == (f"error: seed folder {group / 'seed_7'}: seed 7 is not "
                                      f"in the group of checkpoint {file}, whose seeds are 3, 4")
    assert main([str(group / "seed_3"), "--group-seed", "4", "--device", "cpu"]) == 2
    assert one_error_line(capsys) == (f"error: --group-seed 4 and the seed folder "
                                      f"{group / 'seed_3'} name two different seeds; give one "
                                      "of them")


def test_group_seed_on_a_single_run(group: Path, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    single = single_run_of(group, 0, tmp_path / "single")
    assert main([str(single), "--group-seed", "3", "--device", "cpu"]) == 2
    assert one_error_line(capsys) == (
        f"error: --group-seed 3 picks a seed of a group, but checkpoint "
        f"{find_checkpoint(single)} is of a single run (seed 3); evaluate the run itself")


def test_a_group_whose_weights_do_not_fit(group: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """A group checkpoint holding one seed's weights where its config says two: one line."""
    broken = tmp_path / "broken"
    shutil.copytree(group / "checkpoints", broken / "checkpoints")
    file = find_checkpoint(broken)
    state = torch.load(file, weights_only=False)
    state["agent"]["actor"] = {name: tensor[:1] for name, tensor in
                               state["agent"]["actor"].items()}
    torch.save(state, file)
    assert main([str(broken), "--device", "cpu"]) == 2
    assert one_error_line(capsys).startswith(
        f"error: checkpoint {file}: the saved actor does not fit the actor its config builds "
        "(Error(s) in loading state_dict")
