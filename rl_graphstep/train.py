"""`python -m rl_graphstep.train --env ENV`: the off-policy training loop and its command line.

The loop reads like the algorithm: act (randomly before ``learning_starts``), step the
environments, store the transitions, update critic and actor from a replay sample, log,
checkpoint. Ctrl-C and SIGTERM finish the current step, save a checkpoint and flush the logs.
"""

from __future__ import annotations

if __name__ == "__main__":
    # Before every import below (torch takes seconds): a Ctrl-C during them is one line, exit 130.
    from rl_graphstep.cli import startup_guard

    startup_guard()

import contextlib
import dataclasses
import gc
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from rl_graphstep.acting import ActionPipe, acting_policy, policy_pipe
from rl_graphstep.algorithms import ALGORITHMS
from rl_graphstep.buffer import ReplayBuffer
from rl_graphstep.checkpoint import list_checkpoints, load_checkpoint, set_aside_later
from rl_graphstep.cli import end_startup_guard, exit_quietly
from rl_graphstep.collector import Collector
from rl_graphstep.compiling import quiet_compiler, updates_ahead
from rl_graphstep.config import Config
from rl_graphstep.console import LoopClock, ProgressDisplay, done_line, group_done_line
from rl_graphstep.envs import (
    check_continuous_spaces,
    first_reset,
    make_vec_env,
    seed_everything,
)
from rl_graphstep.errors import ConfigError, RLGraphstepError
from rl_graphstep.flags import command_line_values, load_config
from rl_graphstep.grouplog import GroupLogger
from rl_graphstep.learners import OffPolicyLearner
from rl_graphstep.logger import Logger, to_markdown_table
from rl_graphstep.netspec import (
    describe_networks,
    make_seed_networks,
    networks_of_run,
    record_networks,
)
from rl_graphstep.nonfinite import describe_updates, mostly_skipped
from rl_graphstep.plan import (
    RunPlan,
    matmul_precision,
    plan_run,
    resolve_device,
    settle_action_stream,
)
from rl_graphstep.plugins import NetworkSpec
from rl_graphstep.rundir import (
    RunLock,
    check_run_dir,
    claim_run_dir,
    clean_partial_saves,
    own_run_dir,
    run_dir_of,
)
from rl_graphstep.runstate import Progress, restore_run, save_run
from rl_graphstep.seeds import SeedStack
from rl_graphstep.threads import loop_threads

# The exit code of a run that finished but skipped most of its updates (non-finite values).
MOSTLY_SKIPPED_EXIT = 3


class TrainingInterrupted(RLGraphstepError):
    """Ctrl-C or SIGTERM stopped the run after a checkpoint was saved."""

    def __init__(self, signum: int, message: str) -> None:
        super().__init__(message)
        self.exit_code = 128 + signum


class NonFiniteUpdates(RLGraphstepError):
    """Too many consecutive updates had non-finite losses or gradients."""


Reporter = Callable[[int, list[list[float]]], None]
"""``report(step, recent)``: each seed's recent episode returns at a log interval."""


def train(cfg: Config, *, actor: NetworkSpec = None, critic: NetworkSpec = None,
          report: Reporter | None = None) -> dict[str, Any]:
    """Train an agent as ``cfg`` says; return a summary of the run.

    ``actor`` and ``critic`` replace the default networks: a class (built as
    ``cls(observation_space, action_space, **cfg.actor_kwargs)``), a built module, or a
    ``package.module:Class`` / ``path/file.py:Class`` string. ``rl_graphstep.networks``
    documents the protocol they meet. With ``cfg.resume`` the run continues from the latest
    checkpoint in that folder. ``report(step, recent)``, where given, is called at each log
    interval with every seed's recent episode returns (a sweep's progress, for one).

    The run records the spec of each custom network in its checkpoints' config, so that
    ``--resume`` and ``evaluate`` rebuild it (``rl_graphstep.netspec`` says how). A built
    module keeps the initial weights its caller gave it (a pre-trained one is not reset) and
    is trained in place; ``cfg.seed`` seeds everything else, so two calls repeat each other
    when each builds its module after the same ``torch.manual_seed``.
    """
    try:
        device = resolve_device(cfg)
        # The run folder's lock (see own_run_dir) is released when the run ends in any way.
        with matmul_precision(cfg.tf32), loop_threads(device), \
                contextlib.ExitStack() as owned:
            run = _set_up(cfg, device, actor, critic, owned)
            run.report = report
            # stop_requests first, so it is left last: a second Ctrl-C while the first one's
            # checkpoint is saved, the envs closed or the logs flushed is noted, not raised.
            with stop_requests() as stops, run.logger, run.bar, \
                    contextlib.closing(run.collector.envs):
                run.bar.write(run.first_line)
                _loop(run, stops)
            return _summary(run)
    finally:
        gc.unfreeze()  # see _start_learning


@dataclasses.dataclass
class Run:
    """Everything the loop works with, set up by :func:`_set_up`."""

    cfg: Config  # with the custom networks' specs as recorded
    run_dir: Path
    progress: Progress
    learner: OffPolicyLearner
    collector: Collector
    plan: RunPlan
    logger: Logger | GroupLogger
    bar: ProgressDisplay
    clock: LoopClock
    first_line: str
    staged_actor: list[torch.Tensor] | None = None  # a resumed run's (see ActionPipe)
    report: Reporter | None = None  # see train


def _loop(run: Run, stops: list[int]) -> None:
    """Random actions until ``learning_starts``, the policy's after; from then on every
    iteration also makes ``updates_per_step`` updates, each on a fresh replay sample."""
    cfg, progress, collector, learner = run.cfg, run.progress, run.collector, run.learner
    while progress.global_step < cfg.total_timesteps:
        if not learner.built and progress.global_step + cfg.num_envs > cfg.learning_starts:
            collector.flush(progress.global_step)  # the last transition counts, too
            # len(buffer): a run resumed without its buffer first refills one batch.
            if len(learner.buffer) >= cfg.batch_size:
                _start_learning(run)
        rewards, terminations, truncations = collector.step(
            progress.global_step, explore=progress.global_step >= cfg.learning_starts,
            update=learner.update if learner.built else None)
        progress.global_step += cfg.num_envs
        for env, episodic_return, length in progress.episode_stats.update(
                rewards, terminations, truncations):
            _episode_ended(run, env // cfg.num_envs, episodic_return, length)

        run.bar.update(cfg.num_envs)
        step = progress.global_step
        done = step >= cfg.total_timesteps
        if step % cfg.log_interval < cfg.num_envs or done or stops:
            _log(run)
        if step % cfg.checkpoint_every < cfg.num_envs or done or stops:
            saved = save_run(cfg, run.run_dir, progress, learner, collector)
        if stops:
            name = signal.Signals(stops[0]).name
            raise TrainingInterrupted(
                stops[0], f"{name} at step {step}: checkpoint {saved} saved and logs "
                f"flushed; continue with --resume {run.run_dir}")


def _set_up(cfg: Config, device: torch.device, actor: NetworkSpec, critic: NetworkSpec,
            owned: contextlib.ExitStack) -> Run:
    """The run folder (owned until ``owned`` closes), the checkpoint to resume, the plan,
    the envs, the networks, the learner and the collector."""
    run_dir = run_dir_of(cfg)
    check_run_dir(run_dir)
    # A folder named by the clock is claimed when the run starts logging (see below).
    by_clock = not cfg.resume and not cfg.run_name
    # Owned before the checkpoint is read and anything is checked or written in the folder.
    if not by_clock:
        own_run_dir(cfg, run_dir, owned)
    resumed = (load_checkpoint(cfg.resume, env_id=cfg.env_id, algo=cfg.algo)
               if cfg.resume else None)
    if resumed is None and not by_clock and list_checkpoints(run_dir):
        raise ConfigError(f"{run_dir} already holds a run with checkpoints; continue it with "
                          "--resume or pick another --run-name")
    # Resumed from an older checkpoint: the later ones belong to the abandoned timeline.
    set_aside = set_aside_later(run_dir, int(resumed["global_step"])) if resumed else None
    removed = None if by_clock else clean_partial_saves(run_dir)
    start_step = int(resumed["global_step"]) if resumed else 0
    plan = plan_run(cfg, device, updates_ahead=updates_ahead(
        cfg.total_timesteps, start_step, cfg.learning_starts, cfg.num_envs,
        cfg.updates_per_step))
    seeds = cfg.seed_list  # a group of K seeds steps K x num_envs envs
    seed_everything(seeds[0])
    envs = make_vec_env(cfg.env_id, num_envs=len(seeds) * cfg.num_envs, seed=seeds[0],
                        kind=plan.vec_env)
    observation_space, action_space = envs.single_observation_space, envs.single_action_space
    check_continuous_spaces(cfg.env_id, observation_space, action_space, cfg.algo)
    observation_size, action_size = observation_space.shape[0], action_space.shape[0]

    algorithm_class = ALGORITHMS[cfg.algo]
    if resumed is not None:  # its recorded file networks are the copies in its folder
        actor, critic = networks_of_run(cfg, resumed["config"], run_dir, actor, critic)
    actor_net, critic_net = make_seed_networks(algorithm_class, cfg, seeds, observation_space,
                                               action_space, device, actor, critic)
    buffer = ReplayBuffer(cfg.buffer_size, observation_size, action_size, device,
                          seeds=len(seeds))
    algorithm = algorithm_class(actor_net, critic_net, cfg, action_size=action_size,
                                device=device, seeds=len(seeds))
    learner = OffPolicyLearner(algorithm, buffer, cfg, plan)
    progress = Progress.of(cfg.env_id, len(seeds), cfg.num_envs)
    if resumed is not None:
        envs, observations = restore_run(resumed, learner, progress, envs)
    else:
        # Seed k's env i gets seed_k + i: the seed a run of seed k alone gives it.
        observations = first_reset(envs, seeds[0] if len(seeds) == 1 else
                                   [s + i for s in seeds for i in range(cfg.num_envs)])
    collector = Collector(envs, observations, buffer, progress.nonfinite,
                          seed_tallies=progress.tallies if progress.grouped else ())
    if resumed is not None and learner.updates > 0 and len(buffer) < cfg.batch_size:
        # A trained policy resumed without a batch in its buffer acts at once, eagerly,
        # until the buffer refills one and the learner is built; nothing is captured for it.
        collector.act_with(ActionPipe(acting_policy(algorithm, algorithm.actor),
                                      envs.num_envs, observation_size, action_space, device))
    if by_clock:
        # Made here, not earlier, so that bad input leaves no empty folder behind; a run
        # started in the same second (the name's resolution) gets a folder of its own.
        run_dir = claim_run_dir(run_dir)
        owned.enter_context(RunLock(run_dir))
    cfg, custom = record_networks(cfg, run_dir, actor or cfg.actor, _first(actor_net),
                                  critic or cfg.critic, _first(critic_net), observation_space,
                                  action_space)
    # A resumed run drops what the stopped one logged after its checkpoint (step + 1 on).
    purge_step = progress.global_step + 1 if resumed else None
    logger = (GroupLogger(run_dir, seeds, to_markdown_table(cfg), purge_step=purge_step)
              if progress.grouped else
              Logger(run_dir, to_markdown_table(cfg), purge_step=purge_step))
    # A tqdm bar on a terminal, a periodic line in a file or a pipe (see ProgressDisplay).
    bar = ProgressDisplay(cfg.total_timesteps, progress.global_step, enabled=cfg.progress,
                          learning_starts=cfg.learning_starts)
    first_line = (f"{run_dir}: {cfg.algo.upper()} on {cfg.env_id}, {device}; "
                  f"{buffer.describe()}" + describe_networks(custom)
                  + (f"; resumed at step {progress.global_step}" if resumed else "")
                  + (f"; later checkpoints moved to {set_aside}" if set_aside else "")
                  + (f"; {removed.describe()}" if removed else ""))
    return Run(cfg, run_dir, progress, learner, collector, plan, logger, bar,
               LoopClock(progress.global_step), first_line,
               resumed.get("staged_actor") if resumed else None)


def _start_learning(run: Run) -> None:
    """Build the learner (compiling is paid once, here) and let the policy act; say how the
    updates run, in one line and in tensorboard's text."""
    began = time.perf_counter()
    learner, algorithm = run.learner, run.learner.algorithm
    with quiet_compiler():
        plan = learner.build(run.logger.sums)
    run.plan = settle_action_stream(plan, algorithm.exploration_noise_size(),
                                    type(algorithm.actor).__name__)
    space = run.collector.envs.single_action_space
    run.collector.act_with(policy_pipe(algorithm, run.plan, run.collector.envs.num_envs,
                                       learner.buffer.observation_size, space,
                                       staged=run.staged_actor))
    if run.plan.device.type == "cuda":
        torch.cuda.synchronize(run.plan.device)
    # Compiling leaves hundreds of thousands of long-lived Python objects (600,000 after
    # SAC's steps), and each full garbage collection during the loop would walk them all
    # (0.3 s each, measured on a CPU): keep them out of its sight until the run ends.
    gc.collect()
    gc.freeze()
    run.clock.build_seconds = time.perf_counter() - began
    note = f" ({run.plan.compile_note})" if run.plan.compile_note else ""
    run.bar.write(f"updates: {run.plan.describe()}; built in "
                  f"{run.clock.build_seconds:.1f} s{note}")
    run.logger.text("plan", run.plan.describe() + note)
    step = run.progress.global_step
    run.clock.start_learning(step)
    run.bar.start_learning(step)


def _log(run: Run) -> None:
    """Write the interval's means; stop a run that only produces non-finite updates, after
    a checkpoint was saved (skipped updates leave the parameters as they were, so it holds
    those of the last finite update)."""
    cfg, step, logger, progress = run.cfg, run.progress.global_step, run.logger, run.progress
    logger.write(step)
    total, consecutive = (int(t) for t in torch.stack(run.learner.skipped_updates()).tolist())
    # The last transition is stored after the next action is asked for: count it now.
    transitions = (sum(t.transitions for t in progress.tallies)
                   + run.collector.unstored_nonfinite())
    charts = {"charts/SPS": run.clock.sps(step),
              "charts/skipped_updates": total + progress.nonfinite.skipped_before(),
              "charts/nonfinite_transitions": transitions}
    for tag, value in charts.items():  # a group's: the whole group's, in its aggregate run
        (logger.group_scalar if progress.grouped else logger.scalar)(tag, value, step)
    if consecutive >= cfg.nonfinite_limit:
        saved = save_run(cfg, run.run_dir, progress, run.learner, run.collector)
        raise NonFiniteUpdates(_nonfinite_stop_message(consecutive, cfg, step, saved))
    if progress.grouped:
        logger.aggregate(step, progress.seed_returns)
        run.bar.report_group(step, progress.seed_returns)
    else:
        run.bar.report(step, progress.recent_returns)
    if run.report is not None:
        run.report(step, [list(returns) for returns in progress.seed_returns])


def _episode_ended(run: Run, seed: int, episodic_return: float, length: int) -> None:
    """Count an ended episode of the run's ``seed``-th seed, and log its return. A NaN or
    inf reward makes a return that would read as nan: counted, not logged (see README)."""
    progress = run.progress
    progress.episodes += 1
    if not progress.tallies[seed].count_episode(episodic_return):
        return
    progress.seed_returns[seed].append(episodic_return)
    if progress.grouped:
        run.logger.episode(seed, progress.global_step, episodic_return, length)
    else:
        run.logger.episode(progress.global_step, episodic_return, length)


def _first(network: nn.Module) -> nn.Module:
    """A network as one seed has it: a group's first seed's (what the run records)."""
    return network.member(0) if isinstance(network, SeedStack) else network


def _nonfinite_stop_message(consecutive: int, cfg: Config, step: int, saved: Path) -> str:
    """The count is read at log intervals only (reading it is a device sync), so it may have
    run past the limit by up to an interval's updates: say both."""
    run_dir = saved.parent.parent
    return (f"at least --nonfinite-limit {cfg.nonfinite_limit} consecutive updates had "
            f"non-finite losses or gradients ({consecutive} by step {step}, when it was "
            f"checked); checkpoint {saved} holds the parameters of the last finite update "
            f"(continue with --resume {run_dir}); check the rewards and observations the "
            f"environment returns, or lower the learning rates")


def _summary(run: Run) -> dict[str, Any]:
    progress, collector = run.progress, run.collector
    updates = progress.nonfinite.updates(run.learner)
    policy = collector.policy
    return {
        "run_dir": str(run.run_dir),
        "global_step": progress.global_step,
        "episodes": progress.episodes,
        "mean_return_last_10": (float(np.mean(progress.recent_returns))
                                if progress.recent_returns else None),
        "graph": run.plan.graphs,
        "compile": run.plan.compile,
        "action_stream": policy is not None and policy.side_stream is not None,
        "skipped_transitions": sum(t.transitions for t in progress.tallies),
        "nonfinite_episodes": sum(t.episodes for t in progress.tallies),
        "seeds": run.cfg.seed_list,
        "recent_returns": [list(returns) for returns in progress.seed_returns],
        # Critic and actor steps, each (skipped, made) over the whole run.
        "updates": updates,
        "mostly_skipped": mostly_skipped(updates),
        **run.clock.summary(progress.global_step, collector.waited, collector.waits),
    }


@contextlib.contextmanager
def stop_requests() -> Iterator[list[int]]:
    """Ctrl-C and SIGTERM append their number to the yielded list instead of raising, so the
    loop can finish its step and save; the previous handlers come back afterwards."""
    requested: list[int] = []
    handled = (signal.SIGINT, signal.SIGTERM)
    try:
        previous = {s: signal.signal(s, lambda signum, _frame: requested.append(signum))
                    for s in handled}
    except ValueError:  # not the main thread: signals cannot be caught here
        yield requested
        return
    try:
        yield requested
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry: one clear line and exit 2 on bad input, 128+signal when stopped,
    3 when the run finished but skipped most of its updates."""
    end_startup_guard()  # from here on a Ctrl-C is the KeyboardInterrupt handled below
    previous = signal.getsignal(signal.SIGINT)
    try:
        return _command_line(argv)
    finally:
        _set_ctrl_c(previous)


def _command_line(argv: Sequence[str] | None) -> int:
    try:
        given = command_line_values(argv)
        if given.get("resume"):
            state = load_checkpoint(given["resume"])
            cfg = load_config(argv, base=state["config"])
        else:
            cfg = load_config(argv)
        summary = train(cfg)
    except KeyboardInterrupt as interrupt:
        _set_ctrl_c(signal.SIG_IGN)  # the run has ended: say how, uninterrupted
        ended = _ending_under_way(interrupt)
        if ended is None:  # before the loop took over Ctrl-C: nothing to save yet
            print("stopped: interrupted during start-up", file=sys.stderr)
            return 130
        return _report(ended)
    except RLGraphstepError as error:
        _set_ctrl_c(signal.SIG_IGN)
        return _report(error)
    _set_ctrl_c(signal.SIG_IGN)
    print(group_done_line(summary) if len(summary["seeds"]) > 1 else done_line(summary))
    if summary["mostly_skipped"]:
        print(f"error: most updates were skipped for non-finite losses or gradients "
              f"({describe_updates(summary['updates'])}), so the agent did not learn; check "
              f"the rewards and observations the environment returns, or lower the learning "
              f"rates; logs and checkpoint kept in {summary['run_dir']}", file=sys.stderr)
        return MOSTLY_SKIPPED_EXIT
    return 0


def _ending_under_way(interrupt: KeyboardInterrupt) -> RLGraphstepError | None:
    """The stop or error a Ctrl-C interrupted on its way out of the run (a Ctrl-C held down
    goes on after the loop has given Ctrl-C back), or None when there was none."""
    cause = interrupt.__context__
    while cause is not None and not isinstance(cause, RLGraphstepError):
        cause = cause.__context__
    return cause


def _report(error: RLGraphstepError) -> int:
    if isinstance(error, TrainingInterrupted):
        print(f"stopped: {error}", file=sys.stderr)
        return error.exit_code
    print(f"error: {error}", file=sys.stderr)
    return 2


def _set_ctrl_c(handler: Any) -> None:
    with contextlib.suppress(ValueError, TypeError):  # not the main thread; no handler known
        signal.signal(signal.SIGINT, handler)


if __name__ == "__main__":
    exit_quietly(main())
