"""A sweep's trials on Ray Tune: what each trial runs (one ``train()`` of the sweep's seed
group, reporting to Tune), the search space, the checks made before Ray starts, and running
them all (``tune_sweep``)."""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rl_graphstep.algorithms import check_algorithm, check_settings, is_on_policy
from rl_graphstep.core.errors import ConfigError, first_line
from rl_graphstep.run.aggregate import iqm, seed_means
from rl_graphstep.run.checkpoint import list_checkpoints
from rl_graphstep.run.folders import SWEEP_STATE_DIR
from rl_graphstep.run.rundir import LOCK_FILE, RunLock
from rl_graphstep.settings.config import FIELDS
from rl_graphstep.settings.sweepfile import SweepSpec, checked_points, trial_config, trial_source
from rl_graphstep.sweeps.ray import started_ray
from rl_graphstep.sweeps.start import SweepFlags, placement_problem, record_start

__all__ = ["NOT_LEARNED", "SCORE", "check_algorithms", "error_line", "local_device_problem",
           "run_trial", "search_algorithm", "search_space", "trial_cpus", "trial_metrics",
           "trial_resumes", "tune_sweep"]

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


def check_algorithms(spec: SweepSpec) -> None:
    """Every algorithm the sweep's trials train is one the registry has: one line before Ray
    starts, not a trial that fails (and is retried) in it. Nor does a trial set what its
    algorithm would not read, or, for PPO, a rollout its minibatches cannot cut."""
    names = [spec.base.get("algo", FIELDS["algo"].default), *spec.grid.get("algo", ())]
    if "algo" in spec.sampled:
        names += list(spec.sampled["algo"].values)
    for name in names:
        check_algorithm(name, spec.source)
    for params in checked_points(spec):
        cfg = trial_config(spec, params, log_dir="runs", run_name="check")
        try:
            check_settings(cfg)
            if is_on_policy(cfg.algo):
                # Here, as PPO checks it when built: imported only for a sweep of PPO.
                from rl_graphstep.algorithms.ppo import check_ppo_config

                check_ppo_config(cfg)
        except ConfigError as error:
            raise ConfigError(f"{error} (in {trial_source(spec, params)})") from None


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


def scheduler(name: str, spec: SweepSpec) -> Any:
    if name == "fifo":
        return None
    from ray.tune.schedulers import ASHAScheduler

    total = int(spec.base.get("total_timesteps", 1_000_000))
    return ASHAScheduler(time_attr="global_step", max_t=total, grace_period=max(1, total // 8))


def search_algorithm(name: str, spec: SweepSpec) -> Any:
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


def tune_sweep(spec: SweepSpec, flags: SweepFlags, sweep_dir: Path, *, address: str | None,
               resume: bool, stopped_by: list[int]) -> Any:
    """Start (or join) Ray at ``address`` (None: a local Ray) and run, or on ``resume``
    continue, the sweep's trials; Tune's result grid. SIGTERM and SIGHUP stop it as a Ctrl-C
    does (see ``started_ray``), noted in ``stopped_by``."""
    search = search_algorithm(flags.search, spec)
    # The runs write their own tensorboard logs: Tune keeps only its JSON and CSV results.
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    import ray
    from ray import tune
    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback

    from rl_graphstep.sweeps.progress import SweepProgress

    tune_dir = sweep_dir / SWEEP_STATE_DIR
    local = address is None and not os.environ.get("RAY_ADDRESS")
    with started_ray(address, stopped_by):
        problem = placement_problem(flags, ray.cluster_resources()) if local else None
        if problem:
            raise ConfigError(problem)
        trainable = tune.with_resources(
            tune.with_parameters(run_trial, spec=spec, sweep_dir=str(sweep_dir)),
            {"cpu": flags.cpus_per_trial, "gpu": flags.gpus_per_trial})
        if resume:
            tuner = tune.Tuner.restore(str(tune_dir / spec.name), trainable,
                                       resume_unfinished=True, resume_errored=True)
        else:
            tune_dir.mkdir(exist_ok=True)
            record_start(sweep_dir, spec, flags)
            tuner = tune.Tuner(
                trainable, param_space=search_space(spec),
                tune_config=tune.TuneConfig(num_samples=spec.num_samples, metric=SCORE,
                                            mode=spec.mode,
                                            scheduler=scheduler(flags.scheduler, spec),
                                            search_alg=search),
                run_config=tune.RunConfig(
                    name=spec.name, storage_path=str(tune_dir), verbose=0,
                    callbacks=[JsonLoggerCallback(), CSVLoggerCallback(),
                               SweepProgress(SCORE, spec.mode, (*spec.grid, *spec.sampled),
                                             NOT_LEARNED, error_line)],
                    failure_config=tune.FailureConfig(max_failures=flags.max_failures)))
        return tuner.fit()


def error_line(error: BaseException) -> str:
    """A failed trial's error as one line: the trial's own exception, not Ray's wrapping."""
    while getattr(error, "cause", None) is not None:  # RayTaskError and TuneError wrap it
        error = error.cause
    return f"{type(error).__name__}: {first_line(error)}"
