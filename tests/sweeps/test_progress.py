"""The sweep's progress lines, from Tune's callback hooks with stand-in trials (the lines of a
real sweep are checked in tests/test_sweep.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("ray.tune")

from rl_graphstep.sweeps.progress import SweepProgress


def trial(trial_id: str, status: str, q_lr: float, **result: Any) -> SimpleNamespace:
    return SimpleNamespace(trial_id=trial_id, status=status, config={"q_lr": q_lr, "seed": 1},
                           last_result=result, get_pickled_error=lambda: RuntimeError("boom"))


def progress(now: list[float], mode: str = "max") -> SweepProgress:
    return SweepProgress("score", mode, ["q_lr"], "not_learned", lambda e: f"error: {e}",
                         every=30.0, clock=lambda: now[0])


def test_each_trial_that_ends_is_a_line(capsys: pytest.CaptureFixture[str]) -> None:
    now = [0.0]
    a = trial("a", "RUNNING", 0.001, score=-150.0, not_learned="")
    b = trial("b", "TERMINATED", 0.01, score=-900.0, not_learned="")
    c = trial("c", "RUNNING", 0.1, score=-1200.0, not_learned="no update was made")
    d = trial("d", "RUNNING", 1.0)
    trials = [a, b, c, d]
    sweep = progress(now)
    sweep.on_trial_complete(0, trials, a)
    sweep.on_trial_complete(0, trials, c)
    sweep.on_trial_error(0, trials, d)
    assert capsys.readouterr().out.splitlines() == [
        "trial a ended (q_lr 0.001): score -150.0; 2 of 4 trials ended",
        "trial c ended (q_lr 0.1): did not learn (no update was made); 2 of 4 trials ended",
        "trial d failed (q_lr 1.0): error: boom; 2 of 4 trials ended",
    ]


@pytest.mark.parametrize(("mode", "best"), [("max", "a"), ("min", "b")])
def test_the_status_line_comes_every_30_s_with_the_best_so_far(
        capsys: pytest.CaptureFixture[str], mode: str, best: str) -> None:
    now = [0.0]
    trials = [trial("a", "RUNNING", 0.001, score=-150.0),
              trial("b", "TERMINATED", 0.01, score=-900.0),
              trial("c", "RUNNING", 0.1, score=-2000.0, not_learned="no update was made"),
              trial("d", "PENDING", 1.0)]
    sweep = progress(now, mode)
    now[0] = 29.0
    sweep.on_step_end(0, trials)
    assert capsys.readouterr().out == ""
    now[0] = 30.0
    sweep.on_step_end(0, trials)
    score = {"a": "-150.0", "b": "-900.0"}[best]
    assert capsys.readouterr().out == (f"sweep: 1 of 4 trials ended, 2 running; best so far "
                                       f"score {score} (trial {best})\n")
    now[0] = 45.0
    sweep.on_step_end(0, trials)
    assert capsys.readouterr().out == ""


def test_before_any_report_the_status_has_no_best(capsys: pytest.CaptureFixture[str]) -> None:
    now = [100.0]
    sweep = progress(now)
    now[0] = 200.0
    sweep.on_step_end(0, [trial("a", "RUNNING", 0.001)])
    assert capsys.readouterr().out == "sweep: 0 of 1 trials ended, 1 running\n"
