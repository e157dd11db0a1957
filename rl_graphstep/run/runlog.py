"""Where a training run reports as it trains, through calls that are the same for one seed as
for a group of seeds: its tensorboard logs (a single run's ``Logger``, a group's per-seed and
aggregate runs, see ``grouplog``) and its progress display (see ``console``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from rl_graphstep.run.console import ProgressDisplay
from rl_graphstep.run.grouplog import GroupLogger
from rl_graphstep.run.logger import Logger, to_markdown_table
from rl_graphstep.settings.config import Config


class RunLog:
    """The run's tensorboard logs (``logger``) and progress display (``bar``), so that the
    loop does not ask whether it trains one seed or a group: a group's episodes go into
    their seed's run, its charts into the aggregate run, its recent returns into the
    aggregate curves and the display's group text.

    Used as a context manager: at the end, however it ends, the bar is closed, then the logs
    are flushed and closed."""

    def __init__(self, logger: Logger | GroupLogger, bar: ProgressDisplay) -> None:
        self.logger = logger
        self.bar = bar

    @classmethod
    def open(cls, cfg: Config, run_dir: Path, step: int, *, resumed: bool,
             launched: float | None = None) -> RunLog:
        """The logs of ``cfg``'s seeds in ``run_dir`` and a display from ``step``. A resumed
        run's logs drop what the stopped one logged after its checkpoint (step + 1 on).
        ``launched``: the process's launch (Unix time), recorded in every event file."""
        purge_step = step + 1 if resumed else None
        seeds = cfg.seed_list
        logger = (GroupLogger(run_dir, seeds, to_markdown_table(cfg), purge_step=purge_step,
                              launched=launched)
                  if len(seeds) > 1 else
                  Logger(run_dir, to_markdown_table(cfg), purge_step=purge_step,
                         launched=launched))
        # A tqdm bar on a terminal, a periodic line in a file or a pipe (see ProgressDisplay).
        bar = ProgressDisplay(cfg.total_timesteps, step, enabled=cfg.progress,
                              learning_starts=cfg.learning_starts)
        return cls(logger, bar)

    def episode(self, seed: int, step: int, episodic_return: float, length: int) -> None:
        """Log an ended episode of the run's ``seed``-th seed."""
        if isinstance(self.logger, GroupLogger):
            self.logger.episode(seed, step, episodic_return, length)
        else:
            self.logger.episode(step, episodic_return, length)

    def charts(self, step: int, values: Mapping[str, float]) -> None:
        """Log numbers of the whole run (``charts/SPS``, say): a group's go into its
        aggregate run."""
        for tag, value in values.items():
            if isinstance(self.logger, GroupLogger):
                self.logger.group_scalar(tag, value, step)
            else:
                self.logger.scalar(tag, value, step)

    def returns(self, step: int, recent: Sequence[Sequence[float]]) -> None:
        """At a log step, each seed's recent episode returns: a group's aggregate curves and
        the display's text of them."""
        if isinstance(self.logger, GroupLogger):
            self.logger.aggregate(step, recent)
            self.bar.report_group(step, recent)
        else:
            self.bar.report(step, recent[0])

    def __enter__(self) -> RunLog:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        # As ``with logger, bar:`` would: the bar first, the logs even when that fails.
        try:
            self.bar.__exit__(kind, error, trace)
        finally:
            self.logger.__exit__(kind, error, trace)
