"""`python -m rl_graphstep.train --env ENV`: the training loop and its command line.

The loop reads like the algorithm: act (randomly before ``learning_starts``), step the
environments, store the transitions, update critic and actor from a replay sample, log,
checkpoint. The learner kind decides what an iteration's update is: an off-policy one
updates from its replay buffer every step; PPO's collector adds each step to the rollout and
updates once it is full (every ``num_steps`` vector steps), and checkpoints wait for a
rollout boundary. Ctrl-C, SIGTERM, SIGHUP and a console whose reader went away finish the
current step, save a checkpoint and flush the logs.
"""

from __future__ import annotations

if __name__ == "__main__":
    # Before every import below (torch takes seconds): a Ctrl-C during them is one line, exit 130;
    # and the launch noted, from which the run's logs time its results (start-up included).
    from rl_graphstep.run.cli import mark_launch, startup_guard

    mark_launch()
    startup_guard()

import contextlib
import gc
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

import numpy as np
import torch

from rl_graphstep.core.errors import (
    STOP_SIGNALS,
    EnvError,
    NonFiniteUpdates,
    RLGraphstepError,
    TrainingInterrupted,
    os_error_line,
    type_name,
)
from rl_graphstep.networks.custom import NetworkSpec
from rl_graphstep.run.cli import (
    argument_list,
    end_startup_guard,
    exit_quietly,
    launch_time,
    suggested_command,
)
from rl_graphstep.run.console import say, summary_line
from rl_graphstep.run.flags import load_config
from rl_graphstep.run.logger import MACHINE_TAG, machine_text
from rl_graphstep.run.nonfinite import mostly_skipped, nonfinite_stop_message, not_learned
from rl_graphstep.run.setup import Reporter, Run, set_up
from rl_graphstep.run.state import save_run
from rl_graphstep.run.threads import loop_threads
from rl_graphstep.settings.config import Config
from rl_graphstep.settings.plan import matmul_precision, resolve_device

# The exit code of a run that finished but did not learn: it made no update, or skipped most
# of its updates or transitions for non-finite values (nonfinite.not_learned).
MOSTLY_SKIPPED_EXIT = 3


def train(cfg: Config, *, actor: NetworkSpec = None, critic: NetworkSpec = None,
          report: Reporter | None = None, cpus: int | None = None) -> dict[str, Any]:
    """Train an agent as ``cfg`` says; print the run's last ``done: ...`` line, as the
    command does, and return a summary of the run.

    ``actor`` and ``critic`` replace the default networks: a class (built as
    ``cls(observation_space, action_space, **cfg.actor_kwargs)``), a built module, or a
    ``package.module:Class`` / ``path/file.py:Class`` string. ``rl_graphstep.networks.builtin``
    documents the protocol they meet. With ``cfg.resume`` the run continues from the latest
    checkpoint in that folder, with ``cfg`` as its whole config: build it with
    ``load_config(["--resume", RUN, ...])``, which starts from the run's saved one. The start
    line names each setting that differs from the run's; the run keeps its folder, name and
    seeds (other seeds are a ConfigError). ``report(step, recent)``, where given, is called
    at each log interval with every seed's recent episode returns (a sweep's progress, for
    one). ``cpus``: the CPUs the run may use, where it shares its machine's (a sweep's trial
    holds a few); they decide ``--vec-env auto`` and the shared env's workers. By default,
    every CPU the process may run on.

    The run records the spec of each custom network in its checkpoints' config, so that
    ``--resume`` and ``evaluate`` rebuild it (``rl_graphstep.run.netspec`` says how). A built
    module keeps the initial weights its caller gave it (a pre-trained one is not reset) and
    is trained in place; ``cfg.seed`` seeds everything else, so two calls repeat each other
    when each builds its module after the same ``torch.manual_seed``.
    """
    if not isinstance(cfg, Config):
        raise TypeError("train() takes a Config, such as rl_graphstep.load_config(['--env', "
                        f"'Pendulum-v1']) gives, got {type_name(cfg)}")
    launched = launch_time()  # the command's process start, or now (recorded in the logs)
    try:
        device = resolve_device(cfg)
        # The run folder's lock (see own_run_dir) is released when the run ends in any way.
        with matmul_precision(cfg.tf32), loop_threads(device), \
                contextlib.ExitStack() as owned:
            run = set_up(cfg, device, actor, critic, owned, cpus, launched=launched)
            run.report = report
            # stop_requests first, so it is left last: a second Ctrl-C while the first one's
            # checkpoint is saved, the envs closed or the logs flushed is noted, not raised.
            with stop_requests(lambda: run.collector.in_env_step) as stops, run.log, \
                    contextlib.closing(run.collector.envs):
                # Output nobody reads any more stops the run as a signal would: with a save.
                run.log.bar.on_lost = lambda: stops.append(signal.SIGPIPE)
                run.log.bar.write(run.first_line)
                _loop(run, stops)
            summary = _summary(run)
    finally:
        gc.unfreeze()  # see _start_learning
    # The run's last line, as the command ends with it (with or without --no-progress):
    # printed here, once the logs are flushed, so that a call from Python ends with it too.
    say(summary_line(summary))
    return summary


def _loop(run: Run, stops: list[int]) -> None:
    """Random actions until ``learning_starts``, the policy's after; from then on every
    iteration also makes ``updates_per_step`` updates, each on a fresh replay sample. PPO
    acts with its policy from the first step, and the iteration that fills its rollout
    updates from it."""
    cfg, progress, collector, learner = run.cfg, run.progress, run.collector, run.learner
    while progress.global_step < cfg.total_timesteps:
        if not learner.built and collector.learning_due(progress.global_step, cfg):
            _start_learning(run)
        try:
            rewards, terminations, truncations = collector.step(
                progress.global_step, explore=progress.global_step >= cfg.learning_starts,
                update=learner.update if learner.built else None)
        except EnvError as error:
            raise _saved_before(run, error) from error
        except StepInterrupted as interrupted:
            raise _interrupted_step(run, interrupted.signum) from None
        progress.global_step += cfg.num_envs
        for env, episodic_return, length in progress.episode_stats.update(
                rewards, terminations, truncations):
            _episode_ended(run, env // cfg.num_envs, episodic_return, length)

        run.log.bar.update(cfg.num_envs)
        step = progress.global_step
        done = step >= cfg.total_timesteps
        logged = step % cfg.log_interval < cfg.num_envs or done
        if logged:
            _log(run)
        saved = None
        if collector.checkpoint_due(step, cfg.checkpoint_every) or done:
            saved = save_run(cfg, run.run_dir, progress, learner, collector)
        if stops:  # one test: a signal may come at any line above
            _stop(run, stops[0], logged=logged, saved=saved)


def _stop(run: Run, signum: int, *, logged: bool, saved: Path | None) -> NoReturn:
    """Stop at the step just taken, whichever of its lines the signal came after: its logs
    and its checkpoint, each unless the step made it already, then the one-line stop. No env
    steps again in between: a second signal there would interrupt that step."""
    if not logged:
        _log(run)
    if saved is None:
        saved = save_run(run.cfg, run.run_dir, run.progress, run.learner, run.collector)
    raise TrainingInterrupted(
        signum, f"{_stop_name(signum)} at step {run.progress.global_step}: checkpoint {saved} "
        f"saved and logs flushed{run.collector.stop_note()}; continue with: "
        f"{suggested_command('train', '--resume', str(run.run_dir))}")


def _saved_before(run: Run, error: EnvError) -> EnvError:
    """``error`` (an environment that failed in the middle of the run), after a checkpoint of
    what the run has learned, where it has learned anything: an env that fails now and then
    would otherwise take every update since the last --checkpoint-every with it. Its envs are
    left out of the checkpoint (one of them failed half-way through a step): the resumed run
    starts their episodes afresh."""
    if not run.learner.built:  # random actions so far: nothing learned to keep
        return error
    saved = save_run(run.cfg, run.run_dir, run.progress, run.learner, run.collector,
                     with_envs=False)
    return EnvError(f"{error}; checkpoint {saved} saved: fix the environment, then continue "
                    "with: " + suggested_command("train", "--resume",
                                                 str(run.run_dir)))


def _interrupted_step(run: Run, signum: int) -> TrainingInterrupted:
    """The stop of a run whose env step was interrupted by a second stop signal: a checkpoint
    of what it learned (without the envs, stopped half-way through their step)."""
    step = run.progress.global_step
    what = f"{_stop_name(signum)} again while the environment's step had not returned"
    if not run.learner.built:
        return TrainingInterrupted(signum, f"{what}: interrupted at step {step}, before "
                                           "learning started (nothing to save)")
    saved = save_run(run.cfg, run.run_dir, run.progress, run.learner, run.collector,
                     with_envs=False)
    return TrainingInterrupted(
        signum, f"{what}: interrupted at step {step}; checkpoint {saved} saved (without the "
        f"environments, whose episodes restart) and logs flushed; continue with: "
        f"{suggested_command('train', '--resume', str(run.run_dir))}")


def _stop_name(signum: int) -> str:
    name = signal.Signals(signum).name
    return f"{name} (the output's reader went away)" if signum == signal.SIGPIPE else name


def _start_learning(run: Run) -> None:
    """Build the learner (compiling is paid once, here) and let the policy act; say how the
    updates run, in one line and in tensorboard's text."""
    began = time.perf_counter()
    # The collector of the learner's kind builds it and lets its policy act (off-policy:
    # through an action pipe; PPO: the learner acts itself).
    run.plan = run.collector.start_learning(run.learner, run.log.logger.sums,
                                            run.staged_actor)
    if run.plan.device.type == "cuda":
        torch.cuda.synchronize(run.plan.device)
    # Compiling leaves hundreds of thousands of long-lived Python objects (600,000 after
    # SAC's steps), and each full garbage collection during the loop would walk them all
    # (0.3 s each, measured on a CPU): keep them out of its sight until the run ends.
    gc.collect()
    gc.freeze()
    run.clock.build_seconds = time.perf_counter() - began
    note = f" ({run.plan.compile_note})" if run.plan.compile_note else ""
    run.log.bar.write(f"updates: {run.plan.describe()}; built in "
                      f"{run.clock.build_seconds:.1f} s{note}")
    run.log.logger.text("plan", run.plan.describe() + note)
    run.log.logger.text(MACHINE_TAG, machine_text(run.plan.device))
    step = run.progress.global_step
    run.clock.start_learning(step)
    run.log.bar.start_learning(step)


def _log(run: Run) -> None:
    """Write the interval's means; stop a run that only produces non-finite updates, after
    a checkpoint was saved (skipped updates leave the parameters as they were, so it holds
    those of the last finite update)."""
    cfg, step, progress = run.cfg, run.progress.global_step, run.progress
    run.log.logger.write(step)
    total, consecutive = (int(t) for t in torch.stack(run.learner.skipped_updates()).tolist())
    # The last transition is stored after the next action is asked for: count it now.
    transitions = (sum(t.transitions for t in progress.tallies)
                   + run.collector.unstored_nonfinite())
    run.log.charts(step, {"charts/SPS": run.clock.sps(step),
                          "charts/skipped_updates": total + progress.nonfinite.skipped_before(),
                          "charts/nonfinite_transitions": transitions})
    if consecutive >= cfg.nonfinite_limit:
        saved = save_run(cfg, run.run_dir, progress, run.learner, run.collector)
        raise NonFiniteUpdates(nonfinite_stop_message(cfg.nonfinite_limit, consecutive, step,
                                                      saved))
    run.log.returns(step, progress.seed_returns)
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
    run.log.episode(seed, progress.global_step, episodic_return, length)


def _summary(run: Run) -> dict[str, Any]:
    """What ``train`` returns: the run's counts, returns, plan and speed (see console's lines)."""
    progress, collector, cfg = run.progress, run.collector, run.cfg
    updates = progress.nonfinite.updates(run.learner)
    policy = collector.policy
    # A resumed run already at --total-timesteps takes no step: nothing was asked of it.
    steps_taken = progress.global_step - run.clock.start[1]
    learning = collector.updates_due(progress.global_step, cfg)
    return {
        "run_dir": str(run.run_dir),
        "global_step": progress.global_step,
        "episodes": progress.episodes,
        "mean_return_last_10": (float(np.mean(progress.recent_returns))
                                if progress.recent_returns else None),
        "graph": run.plan.graphs,
        "compile": run.plan.compile,
        "vec_env": run.plan.vec_env,
        "action_stream": policy is not None and policy.side_stream is not None,
        "skipped_transitions": sum(t.transitions for t in progress.tallies),
        "nonfinite_episodes": sum(t.episodes for t in progress.tallies),
        "seeds": run.cfg.seed_list,
        "recent_returns": [list(returns) for returns in progress.seed_returns],
        # Critic and actor steps, each (skipped, made) over the whole run.
        "updates": updates,
        "mostly_skipped": mostly_skipped(updates),
        # Why the run did not learn (the exit-3 line), None when it did or took no step.
        "not_learned": None if steps_taken == 0 else not_learned(
            updates, progress.tallies, steps=progress.global_step, learning=learning,
            stored=collector.stored(), batch_size=cfg.batch_size, run_dir=str(run.run_dir)),
        "steps_taken": steps_taken,
        "total_timesteps": cfg.total_timesteps,
        **run.clock.summary(progress.global_step, collector.waited, collector.waits),
    }


class StepInterrupted(BaseException):
    """A second stop signal while an environment was stepping in this process: its step may
    never return (a simulator that hangs). A BaseException, so that no ``except Exception``
    of the env's (or of the checks around it) takes it for the env's own error."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def stop_requests(in_env_step: Callable[[], bool] = lambda: False) -> Iterator[list[int]]:
    """Ctrl-C, SIGTERM and SIGHUP append their number to the yielded list instead of raising,
    so the loop can finish its step and save; the previous handlers come back afterwards. A
    signal ignored when the run starts stays ignored: ``nohup`` asked to live on past the
    terminal's SIGHUP. A second one while ``in_env_step()`` raises ``StepInterrupted`` there:
    an env step that never returns would otherwise leave only ``kill -9``, losing the run's
    work since its last checkpoint."""
    requested: list[int] = []

    def request(signum: int, _frame: FrameType | None) -> None:
        requested.append(signum)
        if len(requested) > 1 and in_env_step():
            raise StepInterrupted(signum)

    try:
        previous = {s: signal.signal(s, request)
                    for s in STOP_SIGNALS if signal.getsignal(s) is not signal.SIG_IGN}
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
    3 when the run finished but did not learn (no update made, or most skipped)."""
    argv = argument_list(argv, "rl_graphstep.train.main()")
    # From here on a Ctrl-C is the KeyboardInterrupt handled below.
    command = end_startup_guard()
    previous = signal.getsignal(signal.SIGINT)
    try:
        return _command_line(argv)
    finally:
        # A caller's handler comes back. A command leaves Ctrl-C ignored, as the run's end
        # left it, until exit_quietly takes it over: given back KeyboardInterrupt, a Ctrl-C
        # held down would raise it in between, a traceback after the run's one line.
        if not command:
            _set_ctrl_c(previous)


def _command_line(argv: Sequence[str] | None) -> int:
    try:
        summary = train(load_config(argv))  # with --resume, the run's config (see load_config)
    except KeyboardInterrupt as interrupt:
        _set_ctrl_c(signal.SIG_IGN)  # the run has ended: say how, uninterrupted
        ended = _ending_under_way(interrupt)
        if ended is None:  # before the loop took over Ctrl-C: nothing to save yet
            say("stopped: interrupted during start-up", sys.stderr)
            return 130
        return _report(ended)
    except RLGraphstepError as error:
        _set_ctrl_c(signal.SIG_IGN)
        return _report(error)
    except OSError as error:  # the file system refused: checkpoints saved before it are kept
        _set_ctrl_c(signal.SIG_IGN)
        say(f"error: {os_error_line(error)}", sys.stderr)
        return 2
    _set_ctrl_c(signal.SIG_IGN)  # the done line is train()'s
    if summary["not_learned"]:
        say(f"error: {summary['not_learned']}", sys.stderr)
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
        say(f"stopped: {error}", sys.stderr)
        return error.exit_code
    say(f"error: {error}", sys.stderr)
    return 2


def _set_ctrl_c(handler: Any) -> None:
    with contextlib.suppress(ValueError, TypeError):  # not the main thread; no handler known
        while True:
            try:
                signal.signal(signal.SIGINT, handler)
                return
            except KeyboardInterrupt:
                # A Ctrl-C held down, landing while the handler changes: it is the handler
                # being replaced that raised, so set the new one again.
                continue


if __name__ == "__main__":
    exit_quietly(main())
