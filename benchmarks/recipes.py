"""Training recipes against wall-clock: each arm (a set of flags) trains the same task and
seeds for the same wall-time budget, one arm after the other on the whole machine, and the
arms are compared where a user waits: the seeds' IQM return at each minute since launch and
the time to a threshold.

    python benchmarks/recipes.py --env HalfCheetah-v5 --num-seeds 5 --minutes 4 \\
        --arm "wide=--num-envs 32 --batch-size 4096 --updates-per-step 2 --vec-env shared" \\
        --arm "wide+n3=--num-envs 32 --batch-size 4096 --updates-per-step 2 --vec-env shared \\
               --n-step 3" --threshold 9635 --out results/

Each arm is ``python -m rl_graphstep.train --env ENV --num-seeds K <flags>`` in its own
process, with compiler caches of its own, empty at its launch (its start-up is a first run's,
whichever arms ran before), stopped with SIGINT at the budget (the run saves its checkpoint and
flushes its logs, as a Ctrl-C does). Its times come from the launch each run records
(``runfolders.py``). Writes ``recipes.md`` (the table) and ``recipes.csv`` (each arm's IQM
curve over time) under --out, and each arm's episodes as ``table.py collect`` keeps a group's
(``<arm>/<env>__<group>.csv`` and ``<arm>/groups.csv``), so that every reading can be made
again without the runs.
"""

from __future__ import annotations

import argparse
import csv
import math
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from cli import check_training, cli_main, positive_float, positive_int
from processes import cold_compile, end_group
from results import GroupResult, ResultsError, joined_machines, write_results
from runfolders import read_group
from wallclock import at_budget, iqm_curve, time_curves, time_to_threshold

# A stopped run saves its checkpoint and closes its envs: this long at most, then it is killed.
STOP_GRACE_S = 120.0


@dataclass(frozen=True)
class Arm:
    name: str
    flags: list[str]


def parse_arm(spec: str) -> Arm:
    """``NAME=FLAGS`` (FLAGS as a shell would split them; may be empty)."""
    name, sep, flags = spec.partition("=")
    if not sep or not name.strip() or not name.replace("-", "").replace("_", "").replace(
            "+", "").isalnum():
        raise ValueError(f"--arm takes NAME=FLAGS with a NAME of letters, digits, '-', '_' "
                         f"or '+', got {spec!r}")
    return Arm(name.strip(), shlex.split(flags))


def run_for(command: Sequence[str], budget_s: float, log: Path,
            grace_s: float = STOP_GRACE_S, env: dict[str, str] | None = None) -> int:
    """Run ``command`` (output to ``log``, environment ``env``, default this one's) until it
    ends or ``budget_s`` has passed, then stop it with SIGINT and wait for its clean exit
    (SIGKILL after ``grace_s``). Its exit code."""
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True, env=env)
        try:
            return process.wait(timeout=budget_s)
        except subprocess.TimeoutExpired:
            return end_group(process, signal.SIGINT, grace_s)
        finally:  # whatever happened here (a Ctrl-C of this script too), nothing of it is left
            end_group(process)


def arm_log(log_dir: Path, arm: Arm) -> Path:
    """Where ``arm``'s run writes its output."""
    return log_dir / f"{arm.name}.log"


def run_arm(arm: Arm, env_id: str, seeds: int, budget_s: float, log_dir: Path) -> Path:
    """Train ``arm`` for ``budget_s``, compiling cold (as a first run does, whatever ran
    before); its run folder (the only one under ``log_dir/arm``)."""
    folder = log_dir / arm.name
    folder.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "rl_graphstep.train", "--env", env_id, "--num-seeds",
               str(seeds), "--log-dir", str(folder), "--no-progress", *arm.flags]
    with cold_compile(log_dir / f"{arm.name}.compile-cache") as env:
        code = run_for(command, budget_s, arm_log(log_dir, arm), env=env)
    runs = [p for p in folder.iterdir() if p.is_dir()]
    if len(runs) != 1:
        tail = arm_log(log_dir, arm).read_text().strip().splitlines()[-3:]
        raise ResultsError(f"arm {arm.name} (exit {code}) left {len(runs)} run folders in "
                           f"{folder}; its output ended: {' / '.join(tail)}")
    return runs[0]


@dataclass(frozen=True)
class ArmResult:
    arm: Arm
    group: GroupResult
    grid: np.ndarray  # seconds since launch at which the IQM curve is given
    iqm: np.ndarray
    built_s: float | None = None  # how long its updates took to build (compile, capture)


# The line a run prints once its updates are built, at its learning start (rl_graphstep.train).
_BUILT = re.compile(r"^updates: .*; built in ([0-9.]+) s", re.MULTILINE)


def built_seconds(log: Path) -> float | None:
    """The seconds the run logged to ``log`` took to build its updates; None if it never
    said (stopped before its learning start)."""
    found = _BUILT.search(log.read_text(errors="replace")) if log.exists() else None
    return float(found.group(1)) if found else None


def summarise(arm: Arm, group: GroupResult, step_s: float = 10.0,
              built_s: float | None = None) -> ArmResult:
    """The arm's IQM curve (over seeds, of each seed's last-10 mean) every ``step_s`` seconds
    since launch, up to its wall time; NaN before every seed has ended an episode."""
    curves = time_curves(group)
    full = iqm_curve(curves.rows)
    grid = np.arange(step_s, group.wall_s + step_s / 2, step_s)
    index = np.searchsorted(curves.grid, grid, side="right") - 1
    iqm = np.where(index >= 0, full[np.maximum(index, 0)], np.nan)
    return ArmResult(arm, group, grid, iqm, built_s)


def _number(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:,.0f}"


def _minutes(seconds: float) -> str:
    return "not reached" if math.isinf(seconds) else f"{seconds / 60:.1f} min"


def table(results: Sequence[ArmResult], marks_s: Sequence[float],
          threshold: float | None) -> str:
    """One row per arm: its flags, steps, speed, IQM at each mark, time to threshold, and the
    time its updates took to build (compiling is most of a short run's start-up)."""
    head = ["arm", "flags", "env steps per seed", "env steps/s in all", "updates per seed",
            *(f"IQM at {m / 60:g} min" for m in marks_s)]
    if threshold is not None:
        head.append(f"time to {threshold:,.0f} [95% CI]")
    head.append("updates built in")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 2 + "---:|" * (len(head) - 2)]
    for result in results:
        group = result.group
        updates = group.updates_per_seed
        cells = [result.arm.name, f"`{shlex.join(result.arm.flags)}`", f"{group.steps:,}",
                 f"{group.env_steps_per_s:,.0f}", "-" if updates is None else f"{updates:,}"]
        for mark in marks_s:
            moment, value, low, high = at_budget(group, mark)
            late = "" if moment >= mark else f" (ended at {moment / 60:.1f} min)"
            cells.append(f"{_number(value)} [{_number(low)}, {_number(high)}]{late}")
        if threshold is not None:
            point, low, high = time_to_threshold(time_curves(group), threshold)
            cells.append(f"{_minutes(point)} [{_minutes(low)}, {_minutes(high)}]")
        cells.append("-" if result.built_s is None else f"{result.built_s:.1f} s")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_curves(path: Path, results: Sequence[ArmResult]) -> None:
    """``arm, seconds, iqm`` rows: every arm's IQM curve."""
    with path.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["arm", "seconds", "iqm"])
        for result in results:
            for moment, value in zip(result.grid, result.iqm, strict=True):
                writer.writerow([result.arm.name, f"{moment:g}",
                                 "" if math.isnan(value) else f"{value:.2f}"])


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", required=True)
    parser.add_argument("--arm", action="append", required=True, metavar="NAME=FLAGS",
                        help="a recipe: its name and the training flags it adds")
    parser.add_argument("--num-seeds", type=positive_int, default=5)
    parser.add_argument("--minutes", type=positive_float, required=True, help="wall time per arm")
    parser.add_argument("--threshold", type=float, help="the return a user waits for")
    parser.add_argument("--out", type=Path, required=True, help="where the table is written")
    parser.add_argument("--log-dir", type=Path, help="the runs' folders (default: a temporary "
                        "folder, removed at the end)")
    args = parser.parse_args(argv)
    try:
        arms = [parse_arm(spec) for spec in args.arm]
    except ValueError as error:
        parser.error(str(error))
    if len({arm.name for arm in arms}) != len(arms):
        parser.error("each --arm needs a name of its own")
    for arm in arms:  # every arm's flags before the first arm's minutes
        check_training(args.env, arm.flags, f"arm {arm.name}")
    args.out.mkdir(parents=True, exist_ok=True)
    budget_s = args.minutes * 60
    with tempfile.TemporaryDirectory() as scratch:
        log_dir = args.log_dir or Path(scratch)
        results = []
        for arm in arms:
            began = time.monotonic()
            group = read_group(run_arm(arm, args.env, args.num_seeds, budget_s, log_dir))
            results.append(summarise(arm, group,
                                     built_s=built_seconds(arm_log(log_dir, arm))))
            write_results(args.out / arm.name, [group])
            print(f"{arm.name}: {group.steps:,} steps per seed in "
                  f"{time.monotonic() - began:.0f} s", flush=True)
    marks = [m for m in (60.0, 120.0, 240.0, 480.0, 900.0) if m < budget_s] + [budget_s]
    text = table(results, marks, args.threshold)
    print(text, end="")
    # The date and the machine with the command: a figure is compared only with figures of
    # the same job (machines of one kind differ by up to 20%).
    ran = joined_machines(result.group.machine for result in results) or "machine not recorded"
    (args.out / "recipes.md").write_text(
        f"`{shlex.join(['python', 'benchmarks/recipes.py', *argv])}`\n\n"
        f"{time.strftime('%Y-%m-%d')}, {ran}\n\n{text}")
    write_curves(args.out / "recipes.csv", results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
