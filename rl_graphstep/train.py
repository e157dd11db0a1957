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
import gc
import pickle
import signal
import sys
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

from rl_graphstep.acting import ActionPipe
from rl_graphstep.algorithms import ALGORITHMS, ActorCritic
from rl_graphstep.buffer import ReplayBuffer
from rl_graphstep.checkpoint import (
    FORMAT,
    PartialSaves,
    RunLock,
    find_checkpoint,
    list_checkpoints,
    load_checkpoint,
    networks_mismatch,
    remove_partial_saves,
    save_checkpoint,
    set_aside_later,
)
from rl_graphstep.cli import end_startup_guard, exit_quietly
from rl_graphstep.compiling import compile_pays, quiet_compiler, updates_ahead
from rl_graphstep.config import (
    Config,
    command_line_values,
    config_to_dict,
    load_config,
    to_markdown_table,
)
from rl_graphstep.console import ProgressDisplay, done_line
from rl_graphstep.envs import (
    EnvStepper,
    EpisodeStatistics,
    check_continuous_spaces,
    first_reset,
    make_vec_env,
    rng_state,
    scale_action,
    seed_everything,
    set_rng_state,
    true_next_observations,
)
from rl_graphstep.errors import CheckpointError, ConfigError, RLGraphstepError
from rl_graphstep.logger import Logger, check_run_dir, claim_run_dir, run_name
from rl_graphstep.memory import allocation_errors, check_networks_fit
from rl_graphstep.metrics import MetricSums
from rl_graphstep.netspec import (
    describe_networks,
    networks_of_run,
    record_networks,
)
from rl_graphstep.nonfinite import (
    NonFiniteTally,
    describe_updates,
    mostly_skipped,
    policy_inputs,
    random_actions_for,
)
from rl_graphstep.plugins import build_network, check_actor, check_critic
from rl_graphstep.threads import loop_thread_count

NetworkSpec = str | type | nn.Module | None

# The exit code of a run that finished but skipped most of its updates (non-finite values).
MOSTLY_SKIPPED_EXIT = 3


class TrainingInterrupted(RLGraphstepError):
    """Ctrl-C or SIGTERM stopped the run after a checkpoint was saved."""

    def __init__(self, signum: int, message: str) -> None:
        super().__init__(message)
        self.exit_code = 128 + signum


class NonFiniteUpdates(RLGraphstepError):
    """Too many consecutive updates had non-finite losses or gradients."""


def resolve_device(cfg: Config) -> torch.device:
    """``auto`` takes CUDA when present; ``cuda`` without a GPU is an error."""
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda was asked for, but no CUDA GPU is available; "
                          "use --device auto or --device cpu")
    if cfg.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(cfg.device)


def resolve_graph(cfg: Config, device: torch.device) -> bool | None:
    """``on``: graphs, or an error off CUDA; ``off``: eager; ``auto``: graphs on CUDA with an
    eager fallback when a step cannot be captured (``None`` tells the agent so)."""
    if cfg.graph == "on" and device.type != "cuda":
        raise ConfigError(f"--graph on needs a CUDA device, but training runs on {device}; "
                          "use --graph auto or --graph off")
    if cfg.graph == "off":
        return False
    if cfg.graph == "on":
        return True
    return None if device.type == "cuda" else False


def resolve_compile(cfg: Config, use_graph: bool | None, updates: int
                    ) -> tuple[bool | None, str]:
    """Whether to compile the steps, and why when ``auto`` chose: ``on``/``off`` as given;
    ``auto``: compiled when the steps may be captured and the ``updates`` still to come are
    estimated to save more time than compiling costs (a short run spends less uncompiled
    than it would compiling), uncompiled (with a warning) when compiling fails (``None``
    tells the agent so); eager steps stay uncompiled (their compile would fail mid-run rather
    than at capture)."""
    if cfg.compile != "auto":
        return cfg.compile == "on", ""
    if use_graph is False:
        return False, ""
    pays, why = compile_pays(updates)
    return (None if pays else False), f"compile auto: {'on' if pays else 'off'}, {why}"


def make_networks(algorithm: type[ActorCritic], cfg: Config, observation_space: gym.Space,
                  action_space: gym.Space, device: torch.device, actor: NetworkSpec = None,
                  critic: NetworkSpec = None) -> tuple[nn.Module, nn.Module]:
    """The actor and critic: given ones (class, module or ``module:Class``), else those of
    ``cfg.actor``/``cfg.critic``, else the algorithm's defaults; each checked once on an
    example batch before any capture."""
    actor, critic = actor or cfg.actor, critic or cfg.critic
    check_networks_fit(cfg, observation_space, action_space, device,
                       default_actor=actor is None, default_critic=critic is None,
                       num_critics=algorithm.num_critics)
    with allocation_errors(device):
        actor_net, critic_net = _build_networks(algorithm, cfg, observation_space,
                                                action_space, device, actor, critic)
    sizes = {"observation_size": observation_space.shape[0],
             "action_size": action_space.shape[0], "device": device}
    check_actor(actor_net, kind=algorithm.actor_kind, **sizes)
    check_critic(critic_net, min_members=algorithm.num_critics, **sizes)
    return actor_net, critic_net


def _build_networks(algorithm: type[ActorCritic], cfg: Config, observation_space: gym.Space,
                    action_space: gym.Space, device: torch.device, actor: NetworkSpec,
                    critic: NetworkSpec) -> tuple[nn.Module, nn.Module]:
    actor_net = (build_network(actor, observation_space, action_space, cfg.actor_kwargs,
                               role="actor") if actor is not None
                 else algorithm.default_actor(observation_space, action_space, cfg))
    critic_net = (build_network(critic, observation_space, action_space, cfg.critic_kwargs,
                                role="critic") if critic is not None
                  else algorithm.default_critic(observation_space, action_space, cfg))
    return actor_net.to(device), critic_net.to(device)


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


@dataclass
class Progress:
    """The loop's counters, saved in every checkpoint."""

    global_step: int = 0
    episodes: int = 0
    recent_returns: deque[float] = field(default_factory=lambda: deque(maxlen=10))
    episode_stats: EpisodeStatistics = field(default_factory=lambda: EpisodeStatistics(1))
    nonfinite: NonFiniteTally = field(default_factory=lambda: NonFiniteTally(""))


def _pickled_envs(envs: gym.vector.VectorEnv) -> bytes | None:
    # A sync vector env of pure-Python envs pickles with its full state (exact resume);
    # cloudpickle (gymnasium's own dependency) because gymnasium builds them from closures.
    # Others (subprocesses, simulators with native handles) restart their episodes instead.
    try:
        return cloudpickle.dumps(envs)
    except Exception:
        return None


def _checkpoint(cfg: Config, run_dir: Path, progress: Progress, agent: ActorCritic,
                envs: gym.vector.VectorEnv, observations: np.ndarray,
                buffer: ReplayBuffer, actions_pipe: ActionPipe | None) -> Path:
    staged = actions_pipe.staged_actor() if actions_pipe is not None else []
    state = {
        "format": FORMAT,
        "config": config_to_dict(cfg),
        "run_name": run_dir.name,
        "global_step": progress.global_step,
        "episodes": progress.episodes,
        "recent_returns": list(progress.recent_returns),
        "episode_stats": progress.episode_stats.state_dict(),
        "nonfinite": progress.nonfinite.state_dict(agent),
        "agent": agent.state_dict(),
        "rng": rng_state(),
        "envs": _pickled_envs(envs),
        "observations": observations,
        "buffer": buffer.state_dict() if cfg.save_buffer else None,
        "staged_actor": staged or None,
    }
    return save_checkpoint(run_dir, progress.global_step, state, keep=cfg.keep_checkpoints)


def _run_dir(cfg: Config) -> Path:
    """The resumed run's folder, or a new one under ``cfg.log_dir``."""
    if not cfg.resume:
        return Path(cfg.log_dir) / run_name(cfg)
    path = Path(cfg.resume)
    # A checkpoint file lies in runs/<run>/checkpoints/step_N.pt.
    return path.parent.parent if path.is_file() else path


def _own_run_dir(cfg: Config, run_dir: Path, owned: contextlib.ExitStack) -> None:
    """Lock ``run_dir`` for this process until ``owned`` closes: a second training of the
    same folder, new or resumed, gets one line instead of mixing its files into this one."""
    if cfg.resume:
        find_checkpoint(cfg.resume)  # a wrong --resume path is its own line, and makes no folder
        advice = "wait for it to end before resuming it"
    else:
        advice = "wait for it to end or pick another --run-name"
    owned.enter_context(RunLock(run_dir, advice=advice))


def _remove_partial_saves(run_dir: Path) -> PartialSaves | None:
    """Delete what saves of killed runs left half-written in the (owned) ``run_dir``; return
    what was deleted, None when nothing was."""
    removed = remove_partial_saves(run_dir)
    return removed if removed.files else None


@contextlib.contextmanager
def matmul_precision(cfg: Config) -> Iterator[None]:
    """float32 matmuls on TF32 tensor cores while inside, when ``cfg.tf32``; the process's
    setting is restored after. Set before the steps are built: a captured graph keeps the
    kernels chosen at capture."""
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if cfg.tf32 else "highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


@contextlib.contextmanager
def loop_threads(device: torch.device) -> Iterator[None]:
    """One intra-op CPU thread while inside, unless on the CPU the user chose a count
    (``threads.loop_thread_count``); the process's count is restored after. On CUDA the host's
    torch work is a few tiny tensors, and the idle worker threads made the loop's own Python
    and the env steps about 40% slower (measured on an H200 host: HalfCheetah's step 215 ->
    155 µs). On the CPU, idle workers spinning against other processes made the small eager
    updates several times slower on a busy machine (``benchmarks/cpu_threads.py``)."""
    count = loop_thread_count(device)
    if count is None:
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def train(cfg: Config, *, actor: NetworkSpec = None, critic: NetworkSpec = None
          ) -> dict[str, Any]:
    """Train an agent as ``cfg`` says; return a summary of the run.

    ``actor`` and ``critic`` replace the default networks: a class (built as
    ``cls(observation_space, action_space, **cfg.actor_kwargs)``), a built module, or a
    ``package.module:Class`` / ``path/file.py:Class`` string. ``rl_graphstep.networks``
    documents the protocol they meet. With ``cfg.resume`` the run continues from the latest
    checkpoint in that folder.

    The run records the spec of each custom network in its checkpoints' config, so that
    ``--resume`` and ``evaluate`` rebuild it (``rl_graphstep.netspec`` says how). A built
    module keeps the initial weights its caller gave it (a pre-trained one is not reset) and
    is trained in place; ``cfg.seed`` seeds everything else, so two calls repeat each other
    when each builds its module after the same ``torch.manual_seed``.
    """
    try:
        device = resolve_device(cfg)
        # The run folder's lock (see _own_run_dir) is released when the run ends in any way.
        with matmul_precision(cfg), loop_threads(device), contextlib.ExitStack() as owned:
            return _train(cfg, device, actor, critic, owned)
    finally:
        gc.unfreeze()  # see _build_steps


def _train(cfg: Config, device: torch.device, actor: NetworkSpec, critic: NetworkSpec,
           owned: contextlib.ExitStack) -> dict[str, Any]:
    run_dir = _run_dir(cfg)
    check_run_dir(run_dir)
    # A folder named by the clock is claimed when the run starts logging (see below).
    by_clock = not cfg.resume and not cfg.run_name
    # Owned before the checkpoint is read and anything is checked or written in the folder.
    if not by_clock:
        _own_run_dir(cfg, run_dir, owned)
    resumed = (load_checkpoint(cfg.resume, env_id=cfg.env_id, algo=cfg.algo)
               if cfg.resume else None)
    if resumed is None and not by_clock and list_checkpoints(run_dir):
        raise ConfigError(f"{run_dir} already holds a run with checkpoints; continue it with "
                          "--resume or pick another --run-name")
    # Resumed from an older checkpoint: the later ones belong to the abandoned timeline.
    set_aside = set_aside_later(run_dir, int(resumed["global_step"])) if resumed else None
    removed = None if by_clock else _remove_partial_saves(run_dir)
    use_graph = resolve_graph(cfg, device)
    seed_everything(cfg.seed)
    envs = make_vec_env(cfg.env_id, num_envs=cfg.num_envs, seed=cfg.seed,
                        asynchronous=cfg.vec_env == "async")
    observation_space, action_space = envs.single_observation_space, envs.single_action_space
    check_continuous_spaces(cfg.env_id, observation_space, action_space, cfg.algo)
    observation_size, action_size = observation_space.shape[0], action_space.shape[0]
    low, high = action_space.low, action_space.high

    algorithm = ALGORITHMS[cfg.algo]
    if resumed is not None:  # its recorded file networks are the copies in its folder
        actor, critic = networks_of_run(cfg, resumed["config"], run_dir, actor, critic)
    actor_net, critic_net = make_networks(algorithm, cfg, observation_space, action_space,
                                          device, actor, critic)
    buffer = ReplayBuffer(cfg.buffer_size, observation_size, action_size, device)
    compiled, compile_note = resolve_compile(cfg, use_graph, updates_ahead(
        cfg.total_timesteps, int(resumed["global_step"]) if resumed else 0,
        cfg.learning_starts, cfg.num_envs, cfg.updates_per_step))
    agent = algorithm(actor_net, critic_net, cfg, observation_size=observation_size,
                      action_size=action_size, device=device, use_graph=use_graph,
                      compile=compiled)
    progress = Progress(episode_stats=EpisodeStatistics(cfg.num_envs),
                        nonfinite=NonFiniteTally(cfg.env_id))
    if resumed is not None:
        envs, observations = _restore(resumed, agent, buffer, progress, envs)
    if resumed is None:
        observations = first_reset(envs, cfg.seed)

    actions_pipe: ActionPipe | None = None  # built with the steps, at the first update
    # A trained policy resumed without a batch in its buffer acts at once, eagerly, until the
    # buffer refills one and the steps (and actions_pipe) are built; nothing is captured for
    # it. With a batch saved, the steps are built at once and the run continues exactly.
    early_pipe = (ActionPipe(agent.explore, cfg.num_envs, observation_size, action_space,
                             device)
                  if resumed is not None and agent.updates > 0 and len(buffer) < cfg.batch_size
                  else None)
    requested: ActionPipe | None = None  # the pipe asked for this step's action
    stepper = EnvStepper(envs)
    clock = LoopClock(progress.global_step)
    # A resumed run drops what the stopped one logged after its checkpoint (step + 1 on).
    purge_step = progress.global_step + 1 if resumed else None
    if by_clock:
        # Made here, not earlier, so that bad input leaves no empty folder behind; a run
        # started in the same second (the name's resolution) gets a folder of its own.
        run_dir = claim_run_dir(run_dir)
        owned.enter_context(RunLock(run_dir))
    cfg, custom = record_networks(cfg, run_dir, actor or cfg.actor, actor_net,
                                  critic or cfg.critic, critic_net, observation_space,
                                  action_space)
    # A tqdm bar on a terminal, a periodic line in a file or a pipe (see ProgressDisplay).
    bar = ProgressDisplay(cfg.total_timesteps, progress.global_step, enabled=cfg.progress,
                          learning_starts=cfg.learning_starts)
    # stop_requests first, so it is left last: a second Ctrl-C while the first one's
    # checkpoint is saved, the envs closed or the logs flushed is noted, not raised.
    with stop_requests() as stops, \
            Logger(run_dir, to_markdown_table(cfg), purge_step=purge_step) as logger, bar, \
            contextlib.closing(envs):
        bar.write(f"{run_dir}: {cfg.algo.upper()} on {cfg.env_id}, {device}; "
                  f"{buffer.describe()}" + describe_networks(custom)
                  + (f"; resumed at step {progress.global_step}" if resumed else "")
                  + (f"; later checkpoints moved to {set_aside}" if set_aside else "")
                  + (f"; {removed.describe()}" if removed else ""))

        def update() -> None:
            for _ in range(cfg.updates_per_step):
                agent.update_from(buffer)  # adds its metrics into logger.sums

        # The last step's transition: written into the buffer while the next action is being
        # computed (off the path from one env step to the next), before the next updates, and
        # before any checkpoint.
        pending: tuple[np.ndarray, ...] | None = None

        def add_pending() -> None:
            nonlocal pending
            if pending is not None:
                progress.nonfinite.store(buffer, progress.global_step, *pending)
                pending = None

        # Envs whose observation is not finite: the policy sees zeros there, and their
        # actions are replaced by random ones (see policy_inputs).
        unsafe: np.ndarray | None = None

        def request_action() -> bool:
            nonlocal requested, unsafe
            pipe = actions_pipe or early_pipe
            acting = progress.global_step >= cfg.learning_starts and pipe is not None
            requested = pipe if acting else None
            if acting:
                safe, unsafe = policy_inputs(observations)
                pipe.request(safe)
            return acting

        def save() -> Path:
            add_pending()
            return _checkpoint(cfg, run_dir, progress, agent, envs, observations, buffer,
                               actions_pipe)

        while progress.global_step < cfg.total_timesteps:
            # The policy's action is queued first and the updates after it, so waiting for
            # the action never waits for the updates. The host then steps the environments
            # while the GPU updates; envs in subprocesses step while the host launches them.
            acting = request_action()
            add_pending()
            # len(buffer): a run resumed without its buffer first refills one batch.
            updating = (progress.global_step + cfg.num_envs > cfg.learning_starts
                        and len(buffer) >= cfg.batch_size)
            if updating and actions_pipe is None:
                began = time.perf_counter()
                actions_pipe = _build_steps(agent, buffer, cfg, action_space, logger.sums,
                                            resumed.get("staged_actor") if resumed else None)
                clock.build_seconds = time.perf_counter() - began
                bar.write(f"updates: {_describe_mode(agent)}; built in "
                          f"{clock.build_seconds:.1f} s"
                          + (f" ({compile_note})" if compile_note else ""))
                clock.start_learning(progress.global_step)
                bar.start_learning(progress.global_step)
                early_pipe = None
                # A resumed run's early action, already asked for, serves this step.
                acting = acting or request_action()
            if updating and not stepper.asynchronous:
                update()
            if acting:
                with clock.waiting():
                    actions, env_actions = requested.wait()
                if unsafe is not None:
                    random_actions_for(unsafe, actions, env_actions, low, high)
            else:
                actions = np.random.uniform(-1.0, 1.0, (cfg.num_envs, action_size))
                env_actions = scale_action(actions, low, high)
            stepper.start(env_actions)
            if updating and stepper.asynchronous:
                update()
            next_observations, rewards, terminations, truncations, infos = stepper.finish()
            progress.global_step += cfg.num_envs
            for episodic_return, length in progress.episode_stats.update(
                    rewards, terminations, truncations):
                progress.episodes += 1
                if not progress.nonfinite.count_episode(episodic_return):
                    continue  # a NaN or inf reward: its return would read as nan (see README)
                logger.episode(progress.global_step, episodic_return, length)
                progress.recent_returns.append(episodic_return)
            pending = (observations, actions, rewards,
                       true_next_observations(next_observations, infos), terminations)
            observations = next_observations

            bar.update(cfg.num_envs)
            step = progress.global_step
            done = step >= cfg.total_timesteps
            if step % cfg.log_interval < cfg.num_envs or done or stops:
                _log(logger, agent, cfg, progress, bar, clock.sps(step), save,
                     progress.nonfinite.count(pending))
            if step % cfg.checkpoint_every < cfg.num_envs or done or stops:
                saved = save()
            if stops:
                name = signal.Signals(stops[0]).name
                raise TrainingInterrupted(
                    stops[0], f"{name} at step {step}: checkpoint {saved} saved and logs "
                    f"flushed; continue with --resume {run_dir}")

    updates = progress.nonfinite.updates(agent)
    return {
        "run_dir": str(run_dir),
        "global_step": progress.global_step,
        "episodes": progress.episodes,
        "mean_return_last_10": (float(np.mean(progress.recent_returns))
                                if progress.recent_returns else None),
        "graph": agent.use_graph,
        "compile": agent.compile,
        "action_stream": actions_pipe is not None and actions_pipe.side_stream is not None,
        "skipped_transitions": progress.nonfinite.transitions,
        "nonfinite_episodes": progress.nonfinite.episodes,
        # Critic and actor steps, each (skipped, made) over the whole run.
        "updates": updates,
        "mostly_skipped": mostly_skipped(updates),
        **clock.summary(progress.global_step),
    }


def _acts_beside(agent: ActorCritic, cfg: Config) -> bool:
    """Whether the action runs on a stream of its own (``--action-stream``): ``off`` never;
    ``on`` where it can, with a warning that says why not; ``auto`` where it can, silently."""
    if cfg.action_stream == "off":
        return False
    if not agent.use_graph:
        why = "it needs CUDA graphs"
    elif agent.exploration_noise_size() == 0:
        why = (f"{type(agent.actor).__name__} has no sample(observations, noise), so the "
               "action would draw its noise on the device")
    else:
        return True
    if cfg.action_stream == "on":
        warnings.warn(f"--action-stream: acting on the updates' stream instead ({why})",
                      stacklevel=3)
    return False


def _build_steps(agent: ActorCritic, buffer: ReplayBuffer, cfg: Config,
                 action_space: gym.spaces.Box, metrics: MetricSums,
                 staged: list[Tensor] | None = None) -> ActionPipe:
    """Capture (or wrap) the update steps, the replay sampling and the action selection:
    compiling is paid once, here. The updates add their metrics into ``metrics``; ``staged``
    is a resumed run's staged actor (see ``ActionPipe``)."""
    with quiet_compiler():
        agent.build(buffer, metrics=metrics)
    # --action-stream: the action runs beside the updates, so it must draw nothing on the
    # device (two streams would share the generator's offset): its noise comes from the host,
    # where the policy takes it, and it reads a copy of the actor one round of updates behind
    # (the actor as it was at the previous request), so it waits for no update.
    beside = _acts_beside(agent, cfg)
    pipe = ActionPipe(agent.explore, cfg.num_envs, agent.observation_size, action_space,
                      agent.device,
                      use_graph=agent.use_graph and (None if agent.graph_fallback else True),
                      noise_size=agent.exploration_noise_size() if beside else 0,
                      refresh=agent.separate_behaviour_actor() if beside else None,
                      staged=staged if beside else None)
    if agent.device.type == "cuda":
        torch.cuda.synchronize(agent.device)
    # Compiling leaves hundreds of thousands of long-lived Python objects (600,000 after
    # SAC's steps), and each full garbage collection during the loop would walk them all
    # (0.3 s each, measured on a CPU): keep them out of its sight until the run ends.
    gc.collect()
    gc.freeze()
    return pipe


def _describe_mode(agent: ActorCritic) -> str:
    return ("CUDA graphs" if agent.use_graph else "eager") + (
        " + torch.compile" if agent.compile else "")


class LoopClock:
    """Times the loop: steps/s overall and over the learning phase, and how much of the
    learning phase the host spent waiting for the device (the rest is its own work)."""

    def __init__(self, step: int) -> None:
        self.start = (time.perf_counter(), step)
        self.learning: tuple[float, int] | None = None
        self.waited = 0.0
        self.iterations = 0
        self.build_seconds = 0.0

    def start_learning(self, step: int) -> None:
        self.learning = (time.perf_counter(), step)

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        began = time.perf_counter()
        yield
        self.waited += time.perf_counter() - began
        self.iterations += 1

    def sps(self, step: int) -> float:
        return (step - self.start[1]) / (time.perf_counter() - self.start[0])

    def summary(self, step: int) -> dict[str, float | None]:
        now = time.perf_counter()
        result: dict[str, float | None] = {"sps": self.sps(step), "learning_sps": None,
                                           "host_us_per_iteration": None,
                                           "build_seconds": self.build_seconds}
        if self.learning is not None and step > self.learning[1]:
            elapsed = now - self.learning[0]
            result["learning_sps"] = (step - self.learning[1]) / elapsed
            if self.iterations:
                result["host_us_per_iteration"] = (elapsed - self.waited) / self.iterations * 1e6
        return result


def _restore(state: dict[str, Any], agent: ActorCritic, buffer: ReplayBuffer,
             progress: Progress, envs: gym.vector.VectorEnv
             ) -> tuple[gym.vector.VectorEnv, np.ndarray]:
    """Put a checkpoint back: agent (before any capture), buffer, counters, RNG, envs."""
    try:
        agent.load_state_dict(state["agent"])
    except (RuntimeError, ValueError, KeyError, TypeError) as error:
        built = f"the actor {type(agent.actor).__name__} and critic {type(agent.critic).__name__}"
        raise CheckpointError(networks_mismatch(state, agent.cfg, error, built)) from None
    if state.get("buffer") is not None:
        buffer.load_state_dict(state["buffer"])
    progress.global_step = int(state["global_step"])
    progress.episodes = int(state["episodes"])
    progress.recent_returns.extend(state["recent_returns"])
    progress.nonfinite.load_state_dict(state.get("nonfinite"), agent.updates)
    set_rng_state(state["rng"])
    if state.get("envs") is not None:
        if state.get("episode_stats") is not None:
            progress.episode_stats.load_state_dict(state["episode_stats"])
        envs.close()
        return pickle.loads(state["envs"]), state["observations"]
    warnings.warn("the environments could not be saved with the checkpoint; their episodes "
                  "restart on resume", stacklevel=3)
    observations, _ = envs.reset()
    return envs, observations


def _log(logger: Logger, agent: ActorCritic, cfg: Config, progress: Progress,
         bar: ProgressDisplay, sps: float, save: Callable[[], Path], unstored: int = 0) -> None:
    """Write the interval's means; stop a run that only produces non-finite updates, after
    ``save`` wrote a checkpoint (skipped updates leave the parameters as they were, so it holds
    those of the last finite update). ``unstored``: the non-finite rows of the transition not
    stored yet (it is stored after the next action is requested), so the count is this step's."""
    step = progress.global_step
    logger.write(step)
    logger.scalar("charts/SPS", sps, step)
    total, consecutive = (int(t) for t in torch.stack(agent.skipped_updates()).tolist())
    logger.scalar("charts/skipped_updates", total + progress.nonfinite.skipped_before(), step)
    logger.scalar("charts/nonfinite_transitions", progress.nonfinite.transitions + unstored,
                  step)
    if consecutive >= cfg.nonfinite_limit:
        raise NonFiniteUpdates(_nonfinite_stop_message(consecutive, cfg, step, save()))
    bar.report(step, progress.recent_returns)


def _nonfinite_stop_message(consecutive: int, cfg: Config, step: int, saved: Path) -> str:
    """The count is read at log intervals only (reading it is a device sync), so it may have
    run past the limit by up to an interval's updates: say both."""
    run_dir = saved.parent.parent
    return (f"at least --nonfinite-limit {cfg.nonfinite_limit} consecutive updates had "
            f"non-finite losses or gradients ({consecutive} by step {step}, when it was "
            f"checked); checkpoint {saved} holds the parameters of the last finite update "
            f"(continue with --resume {run_dir}); check the rewards and observations the "
            f"environment returns, or lower the learning rates")


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
    print(done_line(summary))
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
