"""RunLog: the loop's calls land in a single run's folder, or in a group's seed and aggregate
runs, and the recent returns on the display as one seed's or as the group's."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_console import GROUP_RECENT, FakeClock
from test_grouplog import scalars

from rl_graphstep.run.console import ProgressDisplay
from rl_graphstep.run.grouplog import AGGREGATE_DIR, AGGREGATE_TAGS, GroupLogger, seed_dir_name
from rl_graphstep.run.logger import Logger
from rl_graphstep.run.runlog import RunLog
from rl_graphstep.settings.config import Config


def test_one_seeds_episodes_and_charts_go_into_its_run(tmp_path: Path) -> None:
    with RunLog.open(Config(progress=False), tmp_path, 0, resumed=False) as log:
        assert isinstance(log.logger, Logger)
        log.episode(0, 200, -150.0, 200)
        log.charts(200, {"charts/SPS": 2500.0, "charts/skipped_updates": 0})
        log.returns(200, [[-150.0]])
    logged = scalars(tmp_path)
    assert logged["charts/episodic_return"] == [(200, -150.0)]
    assert logged["charts/SPS"] == [(200, 2500.0)]
    assert logged["charts/skipped_updates"] == [(200, 0.0)]
    assert log.logger.closed


def test_a_groups_episodes_go_into_their_seeds_run_and_its_charts_into_the_aggregate(
        tmp_path: Path) -> None:
    seeds = (3, 5, 7)
    with RunLog.open(Config(seeds=seeds, progress=False), tmp_path, 0, resumed=False) as log:
        assert isinstance(log.logger, GroupLogger)
        for k, returns in enumerate(GROUP_RECENT):
            for ret in returns:
                log.episode(k, 200, ret, 200)
        log.charts(200, {"charts/SPS": 2500.0})
        log.returns(200, GROUP_RECENT)
    for k, seed in enumerate(seeds):
        logged = scalars(tmp_path / seed_dir_name(seed))
        assert [v for _, v in logged["charts/episodic_return"]] == GROUP_RECENT[k]
        assert "charts/SPS" not in logged
    aggregate = scalars(tmp_path / AGGREGATE_DIR)
    assert aggregate["charts/SPS"] == [(200, 2500.0)]
    assert aggregate[AGGREGATE_TAGS["min"]] == [(200, -300.0)]
    assert log.logger.closed


@pytest.mark.parametrize(("recent", "shown"), [
    ([[-150.0, -140.0]], "return -145.0"),
    (GROUP_RECENT, "return mean -188.3, min -300.0"),
])
def test_the_display_shows_one_seeds_returns_or_the_groups(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], recent: list[list[float]],
        shown: str) -> None:
    clock = FakeClock()
    bar = ProgressDisplay(50_000, 0, enabled=True, learning_starts=0, terminal=False,
                          clock=clock)
    logger = (Logger(tmp_path) if len(recent) == 1 else
              GroupLogger(tmp_path, range(len(recent))))
    with RunLog(logger, bar) as log:
        log.bar.start_learning(0)
        clock.now = 20.0
        log.returns(5000, recent)
    assert capsys.readouterr().out.splitlines() == [
        f"step 5000/50000 (10%) | 250 steps/s | {shown} | eta 3 min 00 s"]
