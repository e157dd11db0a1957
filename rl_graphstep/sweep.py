"""Hyperparameter sweeps and seed grids on Ray Tune: each trial is one ``train()`` call that
trains the sweep's seeds as one group, and reports the group's returns at each log interval.

    pip install -e ".[sweep]"
    python -m rl_graphstep.sweep configs/sweeps/sac_pendulum.yaml      # a local Ray
    python -m rl_graphstep.sweep my_sweep.yaml --address auto --gpus-per-trial 0.25

Every trial trains in ``<log-dir>/<sweep>/<trial>/`` (its seeds inside, as a seed group lays
them out) and checkpoints as a run does; a retried trial resumes from its last checkpoint, and
one that had none starts over with a clean log. Tune's own state lies in
``<log-dir>/<sweep>/.tune/``, and the sweep file as it started in ``<log-dir>/<sweep>/sweep.yaml``
(``--resume`` refuses a file that differs). At the end the trials are printed best first and
written to ``results.csv`` and ``results.md``, and the best trial's config to
``best_config.yaml`` (``train --config`` takes it).
"""

from __future__ import annotations

if __name__ == "__main__":
    # Before the imports below: a Ctrl-C during them is one line, exit 130.
    from rl_graphstep.run.cli import startup_guard

    startup_guard()

import argparse
import contextlib
import dataclasses
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rl_graphstep.core.errors import STOP_SIGNALS, ConfigError, RunFolderError, os_error_line
from rl_graphstep.run.cli import (
    OneLineParser,
    argument_list,
    end_startup_guard,
    exit_quietly,
    suggested_command,
)
from rl_graphstep.run.console import say
from rl_graphstep.run.folders import SWEEP_STATE_DIR
from rl_graphstep.run.rundir import RunLock
from rl_graphstep.settings.fieldtypes import user_path
from rl_graphstep.settings.sweepfile import SweepSpec, read_sweep_file
from rl_graphstep.sweeps.results import failed_line, trial_finished, write_results
from rl_graphstep.sweeps.start import (
    NAMES,
    SweepFlags,
    check_same_sweep,
    flag_problem,
    resumed_flags,
)
from rl_graphstep.sweeps.trials import check_algorithms, local_device_problem, tune_sweep

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    # The module's docstring as plain text: its paragraphs whole (argparse's first line alone
    # stopped mid-sentence) and without reStructuredText's double backquotes.
    parser = OneLineParser(prog="python -m rl_graphstep.sweep",
                           description=__doc__.replace("``", "").strip(),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweep_file", help="the sweep's YAML file")
    parser.add_argument("--log-dir", default="runs", help="where the sweep's folder goes")
    parser.add_argument("--address", help="a running Ray cluster (auto, host:port, "
                                          "ray://...); without it a local Ray starts")
    # None: not given. A new sweep takes the defaults, a resumed one the flags it started with.
    parser.add_argument("--cpus-per-trial", type=float,
                        help="CPUs Ray reserves for each trial (default 1)")
    parser.add_argument("--gpus-per-trial", type=float,
                        help="GPUs Ray reserves for each trial (default 0): fractions pack "
                             "several trials on one GPU, where they take turns (on one GPU, "
                             "more seeds per trial run faster)")
    parser.add_argument("--scheduler", choices=["fifo", "asha"],
                        help="fifo (default) runs every trial to its end; asha stops trials "
                             "that trail the others early")
    parser.add_argument("--search", choices=["variants", "optuna"],
                        help="variants (default): the grid, with sampled values drawn at "
                             "random; optuna: Optuna picks each trial's values (optuna must "
                             "be installed)")
    parser.add_argument("--max-failures", type=int,
                        help="retries of a failed trial, each from its last checkpoint "
                             "(default 2)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the sweep in this folder where it stopped, with the "
                             "flags it started with")
    return parser


def _given_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The flags a sweep keeps (see ``SweepFlags``) as given, None where not, range-checked
    (and --log-dir, which train refuses empty too: it would be the current folder)."""
    if not args.log_dir:
        raise ConfigError("--log-dir must not be empty; give the folder the sweep's folder "
                          "goes in, such as runs")
    given = {name: getattr(args, name) for name in NAMES}
    for name, value in given.items():
        problem = None if value is None else flag_problem(name, value)
        if problem:
            raise ConfigError(problem)
    return given


def run_sweep(spec: SweepSpec, args: argparse.Namespace, stopped_by: list[int]) -> Any:
    """Run (or continue) the sweep on Ray Tune; return Tune's result grid. ``args`` gets the
    sweep's flags: those given, or on ``--resume`` those it started with. SIGTERM and SIGHUP
    stop it as a Ctrl-C does (see ``sweeps.ray.started_ray``), noted in ``stopped_by``."""
    sweep_dir = (Path(args.log_dir) / spec.name).resolve()
    tune_dir = sweep_dir / SWEEP_STATE_DIR
    given = _given_flags(args)
    with RunLock(sweep_dir, advice="wait for it to end or give this one another name",
                 owner="sweep"):
        if args.resume and not (tune_dir / spec.name).is_dir():
            raise ConfigError(f"{sweep_dir} holds no sweep to resume; run it without --resume")
        if not args.resume and (tune_dir / spec.name).exists():
            raise ConfigError(f"{sweep_dir} already holds a sweep; give the sweep another "
                              f"name, or continue it with: {resume_command(args)}")
        if args.resume:
            check_same_sweep(sweep_dir, spec)
            flags = resumed_flags(sweep_dir, given)
        else:
            flags = SweepFlags.given(given)
        vars(args).update(dataclasses.asdict(flags))
        return tune_sweep(spec, flags, sweep_dir, address=args.address, resume=args.resume,
                          stopped_by=stopped_by)


def resume_command(args: argparse.Namespace) -> str:
    """The command that continues the sweep of ``args``, to run as printed from the folder
    it started in: the sweep file, its log dir and cluster (a resume keeps the other flags)."""
    cluster = ("--address", args.address) if args.address else ()
    return suggested_command("sweep", args.sweep_file, "--log-dir", args.log_dir,
                             *cluster, "--resume")


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry: 0 when every trial finished and learned, 1 when some failed or did
    not learn (one line says how many), 2 on bad input,
    128 + the signal when stopped (Ctrl-C, SIGTERM or SIGHUP; ``--resume`` continues)."""
    argv = argument_list(argv, "rl_graphstep.sweep.main()", "['sweep.yaml', '--log-dir', 'runs']")
    # Tune leaves a Ctrl-C handler of its own behind: a Python caller gets its own back.
    previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    command = end_startup_guard()  # from here on a Ctrl-C is the KeyboardInterrupt handled below
    try:
        return _command_line(argv)
    finally:
        if not command:
            for signum, handler in previous.items():
                if handler is not None:
                    with contextlib.suppress(ValueError):  # not the main thread
                        signal.signal(signum, handler)


def _command_line(argv: list[str] | None) -> int:
    """The sweep of ``argv``, its outcome said in one line; the exit code (see :func:`main`)."""
    stopped_by: list[int] = []
    argv = list(sys.argv[1:] if argv is None else argv)
    go_on = "run the same command again: " + suggested_command("sweep", *argv)
    try:
        args = _parser().parse_args(argv)
        _given_flags(args)  # checked before the file is read, Ray started or a folder made
        # A leading ~ that no shell expanded (--log-dir=~/runs, a quoted '~/grid.yaml').
        args.log_dir, args.sweep_file = (str(user_path(args.log_dir)),
                                         str(user_path(args.sweep_file)))
        spec = read_sweep_file(args.sweep_file)
        check_algorithms(spec)
        if args.address is None and not os.environ.get("RAY_ADDRESS"):
            problem = local_device_problem(spec)
            if problem:
                raise ConfigError(problem)
        if (Path(args.log_dir) / spec.name / SWEEP_STATE_DIR / spec.name).is_dir():
            go_on = f"continue with: {resume_command(args)}"
        results = run_sweep(spec, args, stopped_by)
    except (ConfigError, RunFolderError) as err:
        say(f"error: {err}", sys.stderr)
        return 2
    except OSError as err:
        say(f"error: {os_error_line(err)}", sys.stderr)
        return 2
    except ImportError as err:
        say(f"error: sweeps need Ray Tune ({err.name} is missing): "
            'pip install "rl_graphstep[sweep]"', sys.stderr)
        return 2
    except KeyboardInterrupt:  # before Tune ran the trials: nothing of them to save
        signum = stopped_by[0] if stopped_by else signal.SIGINT
        say(f"stopped by {signal.Signals(signum).name} before any trial ran; {go_on}",
            sys.stderr)
        return 128 + signum
    unfinished = sum(not trial_finished(result, args.scheduler) for result in results)
    if unfinished:
        say(f"stopped with {unfinished} of {len(results)} trials unfinished; continue with: "
            f"{resume_command(args)}", sys.stderr)
        return 128 + (stopped_by[0] if stopped_by else signal.SIGINT)
    sweep_dir = (Path(args.log_dir) / spec.name).resolve()
    rows = write_results(spec, results, sweep_dir)
    line = failed_line(rows, sweep_dir / "results.csv")
    if line:
        say(f"error: {line}", sys.stderr)
    return 0 if rows and not line else 1


if __name__ == "__main__":
    exit_quietly(main())
