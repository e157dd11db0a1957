"""What a sweep prints while its trials run, as training prints its progress: a line for each
trial that ends, and at most every ``STATUS_SECONDS`` a line of where the sweep stands."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from ray.tune import Callback

from rl_graphstep.run.console import say

STATUS_SECONDS = 30.0
_ENDED = ("TERMINATED", "ERROR")


class SweepProgress(Callback):
    """Tune's callback on the sweep's driver. ``score``: the metric Tune optimises, ``mode``
    ``max`` or ``min``; ``searched``: the settings the search sets, shown for each trial;
    ``not_learned``: the metric whose text says why a trial's run did not learn;
    ``error_line``: a failed trial's exception in one line, as the results table gives it."""

    def __init__(self, score: str, mode: str, searched: Sequence[str], not_learned: str,
                 error_line: Callable[[BaseException], str], *,
                 every: float = STATUS_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.score, self.sign = score, 1.0 if mode == "max" else -1.0
        self.searched, self.not_learned = tuple(searched), not_learned
        self.error_line = error_line
        self.every, self.clock = every, clock
        self.last_status = clock()

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any,
                          **info: Any) -> None:
        result = trial.last_result or {}
        why = result.get(self.not_learned) or ""
        outcome = f"did not learn ({why})" if why else f"{self.score} {self._score(trial)}"
        say(f"trial {trial.trial_id} ended{self._params(trial)}: {outcome}; "
            f"{self._ended(trials, trial)}")

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any,
                       **info: Any) -> None:
        try:
            error = trial.get_pickled_error()
        except Exception:  # its file unreadable: the results table will say what it can
            error = None
        why = self.error_line(error) if error is not None else "see its error.txt"
        say(f"trial {trial.trial_id} failed{self._params(trial)}: {why}; "
            f"{self._ended(trials, trial)}")

    def on_step_end(self, iteration: int, trials: list[Any], **info: Any) -> None:
        now = self.clock()
        if now - self.last_status < self.every:
            return
        self.last_status = now
        running = sum(t.status == "RUNNING" for t in trials)
        best = self._best(trials)
        say(f"sweep: {self._ended(trials)}, {running} running"
            + (f"; best so far {self.score} {self._score(best)} (trial {best.trial_id})"
               if best is not None else ""))

    @staticmethod
    def _ended(trials: list[Any], ending: Any = None) -> str:
        """``1 of 4 trials ended``; ``ending``: the trial that ends now, whose status Tune sets
        after the callbacks."""
        ended = sum(t.status in _ENDED or t is ending for t in trials)
        return f"{ended} of {len(trials)} trials ended"

    def _params(self, trial: Any) -> str:
        shown = ", ".join(f"{name} {trial.config.get(name)}" for name in self.searched
                          if name in (trial.config or {}))
        return f" ({shown})" if shown else ""

    def _value(self, trial: Any) -> float:
        value = (trial.last_result or {}).get(self.score)
        return float(value) if isinstance(value, (int, float)) else math.nan

    def _score(self, trial: Any) -> str:
        value = self._value(trial)
        return "none yet" if math.isnan(value) else f"{value:.1f}"

    def _best(self, trials: list[Any]) -> Any | None:
        """The trial whose last report scores best (not one whose run did not learn)."""
        scored = [t for t in trials if not math.isnan(self._value(t))
                  and not (t.last_result or {}).get(self.not_learned)]
        return max(scored, key=lambda t: self.sign * self._value(t), default=None)
