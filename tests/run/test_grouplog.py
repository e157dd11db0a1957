"""GroupLogger: a run per seed and the aggregate run, each seed's (K,) entries in its own run
and nothing of one seed in another's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from test_logger import read_events

from rl_graphstep.run.aggregate import bootstrap_interval, iqm
from rl_graphstep.run.grouplog import AGGREGATE_DIR, AGGREGATE_TAGS, GroupLogger, seed_dir_name
from rl_graphstep.run.logger import to_markdown_table
from rl_graphstep.settings.config import Config

SEEDS = (3, 5, 7)


def scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    events = read_events(run_dir)
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)]
            for tag in events.Tags()["scalars"]}


def log_group(group_dir: Path, critic: list[list[float]], returns: list[list[float]]) -> None:
    """Two log intervals of per-seed losses (one row of K values per update) and an episode
    per seed."""
    with GroupLogger(group_dir, SEEDS, to_markdown_table(Config(seeds=SEEDS))) as logger:
        for step, rows in ((100, critic[:2]), (200, critic[2:])):
            for row in rows:
                logger.accumulate({"losses/critic": torch.tensor(row)})
            logger.write(step)
        for k, episode_returns in enumerate(returns):
            for ret in episode_returns:
                logger.episode(k, 150, ret, 200)
        logger.group_scalar("charts/SPS", 2500.0, 200)
        logger.scalars("charts/skipped_updates", [0, 2, 1], 200)
        logger.aggregate(200, returns)


CRITIC = [[1.0, 10.0, 100.0], [3.0, 30.0, 300.0], [5.0, 50.0, 500.0]]
RETURNS = [[-150.0, -130.0], [-300.0], [-120.0]]


def test_each_seed_has_its_run_and_the_group_its_aggregate(tmp_path: Path) -> None:
    log_group(tmp_path, CRITIC, RETURNS)
    assert sorted(p.name for p in tmp_path.iterdir()) == [AGGREGATE_DIR, "seed_3", "seed_5",
                                                          "seed_7"]
    for k, seed in enumerate(SEEDS):
        logged = scalars(tmp_path / seed_dir_name(seed))
        # Interval means of entry k: (1 + 3) / 2 and 5 for seed 3, ten times that for seed 5.
        scale = 10.0 ** k
        assert logged["losses/critic"] == [(100, 2.0 * scale), (200, 5.0 * scale)]
        assert [v for _, v in logged["charts/episodic_return"]] == RETURNS[k]
        assert logged["charts/skipped_updates"] == [(200, [0, 2, 1][k])]
        assert "charts/SPS" not in logged
        text = read_events(tmp_path / seed_dir_name(seed)).Tensors(
            "hyperparameters/text_summary")[0].tensor_proto.string_val[0].decode()
        assert "| seeds | [3, 5, 7] |" in text and f"| seed of this run | {seed} |" in text
    means = np.array([-140.0, -300.0, -120.0])
    aggregate = {tag: values for tag, values in scalars(tmp_path / AGGREGATE_DIR).items()}
    low, high = bootstrap_interval(means, iqm)
    expected = {"mean": means.mean(), "min": -300.0, "iqm": means.mean(),  # 3 seeds: no cut
                "iqm_low": low, "iqm_high": high}
    for key, value in expected.items():
        assert aggregate[AGGREGATE_TAGS[key]] == [(200, pytest.approx(value, rel=1e-6))]
    assert aggregate["charts/SPS"] == [(200, 2500.0)]


def test_one_seeds_data_reaches_no_other_seeds_run(tmp_path: Path) -> None:
    """The isolation test: seed 5's losses and returns changed (a NaN among them), seeds 3
    and 7 log the very same numbers, to the bit."""
    log_group(tmp_path / "a", CRITIC, RETURNS)
    changed = [[row[0], float("nan") if i == 0 else row[1] * 7, row[2]]
               for i, row in enumerate(CRITIC)]
    log_group(tmp_path / "b", changed, [RETURNS[0], [12.5, 40.0], RETURNS[2]])
    for seed in (3, 7):
        a, b = (scalars(tmp_path / run / seed_dir_name(seed)) for run in ("a", "b"))
        assert a == b
    assert scalars(tmp_path / "a" / "seed_5") != scalars(tmp_path / "b" / "seed_5")


def test_no_aggregate_until_every_seed_has_an_episode(tmp_path: Path) -> None:
    with GroupLogger(tmp_path, SEEDS) as logger:
        assert logger.aggregate(100, [[-1.0], [], [-2.0]]) is None
        stats = logger.aggregate(200, [[-1.0], [-3.0], [-2.0]])
    assert stats is not None and stats["mean"] == -2.0
    logged = scalars(tmp_path / AGGREGATE_DIR)
    assert logged[AGGREGATE_TAGS["mean"]] == [(200, -2.0)]


def test_wrong_shapes_are_refused(tmp_path: Path) -> None:
    with GroupLogger(tmp_path, SEEDS) as logger:
        with pytest.raises(ValueError, match=r"must be of shape \(3,\)"):
            logger.accumulate({"losses/critic": torch.tensor(1.0)})
        with pytest.raises(ValueError, match="2 values for a group of 3"):
            logger.scalars("charts/x", [1.0, 2.0], 0)
        with pytest.raises(ValueError, match="2 seeds' returns for a group of 3"):
            logger.aggregate(0, [[1.0], [2.0]])
    with pytest.raises(ValueError, match="distinct seeds"):
        GroupLogger(tmp_path / "x", (1, 1))


def test_close_twice_and_on_errors(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), GroupLogger(tmp_path, SEEDS) as logger:
        logger.episode(1, 5, -10.0, 5)
        raise RuntimeError("boom")
    assert logger.closed and all(run.closed for run in logger.runs)
    logger.close()
    assert scalars(tmp_path / "seed_5")["charts/episodic_return"] == [(5, -10.0)]
