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
    from rl_graphstep.cli import startup_guard

    startup_guard()

import argparse
import contextlib
import csv
import dataclasses
import os
import shutil
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from rl_graphstep.aggregate import iqm, seed_means
from rl_graphstep.checkpoint import list_checkpoints
from rl_graphstep.cli import (
    OneLineParser,
    argument_list,
    end_startup_guard,
    exit_quietly,
    suggested_command,
)
from rl_graphstep.config import config_to_dict
from rl_graphstep.console import say
from rl_graphstep.errors import (
    STOP_SIGNALS,
    ConfigError,
    RunFolderError,
    display_path,
    first_line,
    os_error_line,
)
from rl_graphstep.rundir import LOCK_FILE, RunLock
from rl_graphstep.runfolders import SWEEP_STATE_DIR, user_path
from rl_graphstep.sweepfile import (
    SweepSpec,
    checked_points,
    read_sweep_file,
    trial_config,
    trial_source,
)
from rl_graphstep.sweepray import started_ray
from rl_graphstep.sweepstart import (
    NAMES,
    SweepFlags,
    check_same_sweep,
    flag_problem,
    placement_problem,
    record_start,
    resumed_flags,
)

__all__ = ["main", "search_space", "trial_metrics"]

METRIC_KEYS = {"iqm": "iqm_return", "mean": "mean_return"}
SCORE = "score"  # what Tune optimises: the sweep's metric, under one name
NOT_LEARNED = "not_learned"  # a trial's last report: why its run did not learn, "" if it did


def trial_metrics(recent: Sequence[Sequence[float]], metric: str) -> dict[str, float]:
    """The group's ``iqm_return`` and ``mean_return`` over its seeds' mean recent returns,
    and ``score``, the sweep's ``metric`` of the two; NaN until every seed ended an episode."""
    means = seed_means(recent)
    if not means or any(m is None for m in means):
        values = {"iqm_return": float("nan"), "mean_return": float("nan")}
    else:
        values = {"iqm_return": float(iqm(means)), "mean_return": float(sum(means) / len(means))}
    return {**values, SCORE: values[METRIC_KEYS[metric]]}


def search_space(spec: SweepSpec) -> dict[str, Any]:
    """The sweep's search space in Tune's terms (lists for tuples: Tune stores them as JSON)."""
    from ray import tune

    def plain(value: Any) -> Any:
        return list(value) if isinstance(value, tuple) else value

    space: dict[str, Any] = {name: tune.grid_search([plain(v) for v in values])
                             for name, values in spec.grid.items()}
    for name, sampled in spec.sampled.items():
        if sampled.kind == "choice":
            space[name] = tune.choice([plain(v) for v in sampled.values])
            continue
        low, high = sampled.values
        if sampled.kind == "uniform":
            space[name] = tune.uniform(low, high)
        elif sampled.kind == "loguniform":
            space[name] = tune.loguniform(low, high)
        else:
            space[name] = tune.randint(low, high + 1)  # Tune's high is excluded, ours not
    return space


def trial_cpus(assigned: float) -> int:
    """The CPUs a trial trains with, from the ``assigned`` share Tune gave it (at least one):
    trials share their node's CPUs, so ``--vec-env auto`` and the shared env's workers count
    the trial's, not the node's."""
    return max(1, int(assigned))


def run_trial(params: dict[str, Any], spec: SweepSpec, sweep_dir: str) -> None:
    """One trial: train the group in its own folder (resuming it where an earlier attempt left
    a checkpoint, else from a clean folder), reporting to Tune at each log interval and at the
    end."""
    import ray
    from ray import tune

    from rl_graphstep.train import train

    name = tune.get_context().get_trial_id()
    cfg = trial_config(spec, params, log_dir=sweep_dir, run_name=name)
    folder = Path(sweep_dir) / name
    if trial_resumes(folder):
        cfg = dataclasses.replace(cfg, resume=str(folder))
    context = ray.get_runtime_context()
    node = context.get_node_id()  # where it ran, for the results table

    def report(step: int, recent: list[list[float]], finished: bool = False,
               not_learned: str = "") -> None:
        tune.report({**trial_metrics(recent, spec.metric), "global_step": step,
                     "node_id": node, "finished": finished, NOT_LEARNED: not_learned})

    summary = train(cfg, report=report,
                    cpus=trial_cpus(context.get_assigned_resources().get("CPU", 1)))
    # A run that did not learn (train's exit 3) ends as a trial whose score means nothing.
    report(summary["global_step"], summary["recent_returns"], finished=True,
           not_learned=summary["not_learned"] or "")


def trial_resumes(folder: Path) -> bool:
    """Whether the trial whose folder is ``folder`` resumes there: an earlier attempt (a
    retry, or a sweep stopped and resumed) left a checkpoint. One that left none starts over
    at step 0, so what it left (the logs of its first steps, which the new start would log
    again) is removed first: the trial's curves count each step once."""
    if not folder.is_dir():
        return False
    if list_checkpoints(folder):
        return True
    # Owned while it is emptied: an earlier attempt still alive is a retried failure, not a
    # folder to empty under it.
    with RunLock(folder, advice="its earlier attempt still runs", owner="trial"):
        for entry in folder.iterdir():
            if entry.name == LOCK_FILE:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    return False


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


def local_device_problem(spec: SweepSpec) -> str | None:
    """Why some trial could not train on this machine, where a local Ray runs them all, or
    None: it asks for CUDA and there is none (it would fail, and be retried, in Ray)."""
    import torch

    if torch.cuda.is_available():
        return None
    for params in checked_points(spec):
        cfg = trial_config(spec, params, log_dir="runs", run_name="check")
        asked = ("device: cuda" if cfg.device == "cuda" else
                 "graph: on" if cfg.graph == "on" else None)
        if asked:
            return (f"a trial trains with {asked} (in {trial_source(spec, params)}), but this "
                    "machine, where a local Ray runs every trial, has no CUDA GPU; use device "
                    "cpu or auto, or --address a Ray cluster that has GPUs")
    return None


def _scheduler(name: str, spec: SweepSpec) -> Any:
    if name == "fifo":
        return None
    from ray.tune.schedulers import ASHAScheduler

    total = int(spec.base.get("total_timesteps", 1_000_000))
    return ASHAScheduler(time_attr="global_step", max_t=total, grace_period=max(1, total // 8))


def _search(name: str, spec: SweepSpec) -> Any:
    if name == "variants":
        return None
    if spec.grid:
        raise ConfigError(f"--search optuna samples every setting; the grid of "
                          f"{', '.join(spec.grid)} in {spec.source} would be one choice each "
                          "(write it as {choice: [...]})")
    try:
        import optuna  # noqa: F401  (OptunaSearch only fails when used)
        from ray.tune.search.optuna import OptunaSearch
    except ImportError:
        raise ConfigError("--search optuna needs optuna: pip install optuna") from None
    return OptunaSearch()


def run_sweep(spec: SweepSpec, args: argparse.Namespace, stopped_by: list[int]) -> Any:
    """Run (or continue) the sweep on Ray Tune; return Tune's result grid. ``args`` gets the
    sweep's flags: those given, or on ``--resume`` those it started with. SIGTERM and SIGHUP
    stop it as a Ctrl-C does (see ``started_ray``), noted in ``stopped_by``."""
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
        search = _search(flags.search, spec)
        return _tune(spec, args, flags, stopped_by, sweep_dir, search)


def _tune(spec: SweepSpec, args: argparse.Namespace, flags: SweepFlags, stopped_by: list[int],
          sweep_dir: Path, search: Any) -> Any:
    """Start (or join) Ray and run the sweep's trials."""
    # The runs write their own tensorboard logs: Tune keeps only its JSON and CSV results.
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    import ray
    from ray import tune
    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback

    from rl_graphstep.sweepprogress import SweepProgress

    tune_dir = sweep_dir / SWEEP_STATE_DIR
    local = args.address is None and not os.environ.get("RAY_ADDRESS")
    with started_ray(args.address, stopped_by):
        problem = placement_problem(flags, ray.cluster_resources()) if local else None
        if problem:
            raise ConfigError(problem)
        trainable = tune.with_resources(
            tune.with_parameters(run_trial, spec=spec, sweep_dir=str(sweep_dir)),
            {"cpu": flags.cpus_per_trial, "gpu": flags.gpus_per_trial})
        if args.resume:
            tuner = tune.Tuner.restore(str(tune_dir / spec.name), trainable,
                                       resume_unfinished=True, resume_errored=True)
        else:
            tune_dir.mkdir(exist_ok=True)
            record_start(sweep_dir, spec, flags)
            tuner = tune.Tuner(
                trainable, param_space=search_space(spec),
                tune_config=tune.TuneConfig(num_samples=spec.num_samples, metric=SCORE,
                                            mode=spec.mode,
                                            scheduler=_scheduler(flags.scheduler, spec),
                                            search_alg=search),
                run_config=tune.RunConfig(
                    name=spec.name, storage_path=str(tune_dir), verbose=0,
                    callbacks=[JsonLoggerCallback(), CSVLoggerCallback(),
                               SweepProgress(SCORE, spec.mode, (*spec.grid, *spec.sampled),
                                             NOT_LEARNED, _error_line)],
                    failure_config=tune.FailureConfig(max_failures=flags.max_failures)))
        return tuner.fit()


def _finished(result: Any, scheduler: str) -> bool:
    """Whether a trial ended: trained to its end, failed, or (ASHA) was stopped early. Tune
    marks the trials of a sweep stopped by Ctrl-C terminated too, so its status cannot say."""
    metrics = result.metrics or {}
    if result.error is not None or metrics.get("finished"):
        return True
    return scheduler == "asha" and bool(metrics)  # a trial ASHA stopped had reported


def write_results(spec: SweepSpec, results: Any, sweep_dir: Path) -> list[dict[str, Any]]:
    """The trials best first, printed and written as CSV and Markdown; the best one's config
    as YAML. Returns the rows."""
    rows = []
    for result in results:
        metrics, config = result.metrics or {}, result.config or {}
        params = {name: config.get(name) for name in (*spec.grid, *spec.sampled)}
        rows.append({"trial": metrics.get("trial_id", Path(result.path).name), **params,
                     SCORE: metrics.get(SCORE, float("nan")),
                     "iqm_return": metrics.get("iqm_return", float("nan")),
                     "mean_return": metrics.get("mean_return", float("nan")),
                     "global_step": metrics.get("global_step", 0),
                     "node": str(metrics.get("node_id", ""))[:12],
                     "error": _trial_error(result)})
    sign = -1.0 if spec.mode == "max" else 1.0
    # Trials that failed or did not learn rank last whatever their score: their runs' last
    # returns are not a result of the settings.
    rows.sort(key=lambda r: (bool(r["error"]), r[SCORE] != r[SCORE],
                             sign * (r[SCORE] if r[SCORE] == r[SCORE] else 0.0)))
    columns = list(rows[0]) if rows else ["trial"]
    with (sweep_dir / "results.csv").open("w", newline="") as out:
        writer = csv.DictWriter(out, columns)
        writer.writeheader()
        writer.writerows(rows)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(r[c]) for c in columns) + " |" for r in rows]
    (sweep_dir / "results.md").write_text("\n".join(lines) + "\n")
    say("\n".join(lines))
    if rows and rows[0][SCORE] == rows[0][SCORE] and not rows[0]["error"]:
        best = rows[0]
        cfg = trial_config(spec, {n: best[n] for n in (*spec.grid, *spec.sampled)},
                           log_dir="runs", run_name=f"{spec.name}_best")
        values = {k: v for k, v in config_to_dict(cfg).items()
                  if k not in ("log_dir", "run_name", "resume")}
        command = suggested_command("rl_graphstep.train", "--config",
                                    str(sweep_dir / "best_config.yaml"))
        (sweep_dir / "best_config.yaml").write_text(
            f"# the best trial of sweep {spec.name} ({best['trial']}, {SCORE} "
            f"{best[SCORE]:.1f}); train it with: {command}\n"
            + yaml.safe_dump(values, sort_keys=False))
    return rows


def _trial_error(result: Any) -> str:
    """The error column of a trial: its own exception in one line, or ``not learned: ...``
    with why its run did not learn (what ``train`` exits 3 for); "" for a trial that learned."""
    if result.error is not None:
        return _error_line(result.error)
    why = (result.metrics or {}).get(NOT_LEARNED)
    return f"not learned: {why}" if why else ""


def failed_line(rows: Sequence[dict[str, Any]], results_csv: Path) -> str | None:
    """The sweep's last line when some trials failed or did not learn, None when none did:
    ``2 of 4 trials failed and 1 did not learn; see the error column of runs/g/results.csv``."""
    unlearned = sum(r["error"].startswith("not learned: ") for r in rows)
    failed = sum(bool(r["error"]) for r in rows) - unlearned
    if not (failed or unlearned):
        return None
    what = [f"{failed} failed"] if failed else []
    what += [f"{unlearned} did not learn"] if unlearned else []
    first, *rest = what
    count, _, verb = first.partition(" ")
    return (f"{count} of {len(rows)} trials {verb}{''.join(' and ' + r for r in rest)}; see "
            f"the error column of {display_path(str(results_csv))}")


def _error_line(error: BaseException) -> str:
    """A failed trial's error as one line: the trial's own exception, not Ray's wrapping."""
    while getattr(error, "cause", None) is not None:  # RayTaskError and TuneError wrap it
        error = error.cause
    return f"{type(error).__name__}: {first_line(error)}"


def _cell(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def resume_command(args: argparse.Namespace) -> str:
    """The command that continues the sweep of ``args``, to run as printed from the folder
    it started in: the sweep file, its log dir and cluster (a resume keeps the other flags)."""
    cluster = ("--address", args.address) if args.address else ()
    return suggested_command("rl_graphstep.sweep", args.sweep_file, "--log-dir", args.log_dir,
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
    go_on = "run the same command again: " + suggested_command("rl_graphstep.sweep", *argv)
    try:
        args = _parser().parse_args(argv)
        _given_flags(args)  # checked before the file is read, Ray started or a folder made
        # A leading ~ that no shell expanded (--log-dir=~/runs, a quoted '~/grid.yaml').
        args.log_dir, args.sweep_file = (str(user_path(args.log_dir)),
                                         str(user_path(args.sweep_file)))
        spec = read_sweep_file(args.sweep_file)
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
    unfinished = sum(not _finished(result, args.scheduler) for result in results)
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
